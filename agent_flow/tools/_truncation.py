"""Output limits of tool results: the minimum, and the marker a cut result ends with.

The cut itself is `agent_flow._text.truncate_to_tokens`.
"""

from __future__ import annotations

from agent_flow._defaults import MIN_OUTPUT_TOKENS
from agent_flow.errors import UserError

__all__ = ["MIN_OUTPUT_TOKENS", "cut_marker"]


def cut_marker(cut: int, total: int) -> str:
    """The marker a cut tool result ends with: how much was cut, and what to do."""
    return (
        f"\n[... truncated: {cut} of {total} tokens cut to fit the output limit; "
        "ask for a narrower result to see more]"
    )


def _check_limit(limit: int | None) -> None:
    if limit is not None and limit < MIN_OUTPUT_TOKENS:
        raise UserError(
            f"an output limit of {limit} tokens is too small; use at least {MIN_OUTPUT_TOKENS}"
        )
