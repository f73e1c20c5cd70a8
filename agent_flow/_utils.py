"""Small helpers shared across agent_flow's modules."""

from __future__ import annotations

import json

__all__ = ["loads_json"]


def _reject_constant(name: str) -> None:
    raise ValueError(f"{name} is not a JSON number")


def loads_json(text: str) -> object:
    """Parse JSON as the spec defines it: Python's `NaN` and `Infinity` extensions are refused.

    Raises:
        json.JSONDecodeError: The text is not JSON.
        ValueError: The text uses NaN or Infinity (which no event line could carry).
    """
    return json.loads(text, parse_constant=_reject_constant)
