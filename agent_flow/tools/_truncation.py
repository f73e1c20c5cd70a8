"""Output limits: cutting a tool's result to a token budget with a visible marker."""

from __future__ import annotations

from agent_flow._defaults import MIN_OUTPUT_TOKENS
from agent_flow.errors import UserError
from agent_flow.tokens import TokenCounter

__all__ = ["MIN_OUTPUT_TOKENS", "truncate_to_tokens"]


def _marker(cut: int, total: int) -> str:
    return (
        f"\n[... truncated: {cut} of {total} tokens cut to fit the output limit; "
        "ask for a narrower result to see more]"
    )


def truncate_to_tokens(text: str, max_tokens: int, counter: TokenCounter) -> tuple[str, int]:
    """Cut `text` to at most `max_tokens` tokens, ending with a marker saying how much was cut.

    The head of the text is kept, cut at a line break when one is near. The result never
    exceeds `max_tokens` when `max_tokens` is at least `MIN_OUTPUT_TOKENS`.

    Returns:
        The (possibly) truncated text and the token count of the original.
    """
    total = counter.count(text)
    if total <= max_tokens:
        return text, total
    budget = max_tokens - counter.count(_marker(total, total))
    keep = _longest_prefix(text, max(budget, 0), total, counter)
    newline = text.rfind("\n", 0, keep)
    if newline > keep * 0.8:
        keep = newline
    while True:
        head = text[:keep]
        kept = counter.count(head) if keep else 0
        result = head + _marker(total - kept, total)
        if keep == 0 or counter.count(result) <= max_tokens:
            return result, total
        keep = keep * 9 // 10  # token boundaries shifted under the cut; shave a little more


def _longest_prefix(text: str, budget: int, total: int, counter: TokenCounter) -> int:
    """The length of (nearly) the longest prefix of `text` within `budget` tokens."""
    if budget <= 0:
        return 0
    low, high = 0, len(text)  # count(text[:low]) <= budget < count(text[:high])
    guess = int(len(text) * budget / max(total, 1))
    proportional = True
    while high - low > 16:
        if not low < guess < high:
            guess = (low + high) // 2
        tokens = counter.count(text[:guess])
        if tokens <= budget:
            low = guess
        else:
            high = guess
        # Alternate a proportional step (fast on ordinary text) with bisection (guaranteed).
        proportional = not proportional
        guess = int(guess * budget / max(tokens, 1)) if proportional else (low + high) // 2
    return low


def _check_limit(limit: int | None) -> None:
    if limit is not None and limit < MIN_OUTPUT_TOKENS:
        raise UserError(
            f"an output limit of {limit} tokens is too small; use at least {MIN_OUTPUT_TOKENS}"
        )
