"""The one token truncation helper: cut a text to a token budget, keeping its head.

Two places cut text to tokens: a tool result shown to the model (with a marker saying how
much was cut, so the model can ask for less) and summary text that must fit its cap (with
an ellipsis). Both are the same search for the longest prefix that fits, with a different
marker; it lives here once.
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["ELLIPSIS", "Marker", "truncate_to_tokens"]

#: Counts tokens of a text (a `TokenCounter.count`, or any function of the same shape).
Count = Callable[[str], int]

#: Builds the text appended to a cut head, from the tokens cut and the original total.
Marker = Callable[[int, int], str]


def ELLIPSIS(cut: int, total: int) -> str:
    """The plain marker: a single "…"."""
    return "…"


def truncate_to_tokens(
    text: str,
    max_tokens: int,
    count: Count,
    *,
    marker: Marker = ELLIPSIS,
    at_line_break: bool = False,
) -> tuple[str, int]:
    """Cut `text` to its longest head that fits `max_tokens` together with a marker.

    Args:
        text: The text.
        max_tokens: The budget for the head and the marker together.
        count: How tokens are counted.
        marker: The text appended to a cut head, given (tokens cut, original tokens).
        at_line_break: Cut at a line break when one lies in the last fifth of the head.

    Returns:
        The text (unchanged when it fits, else its head plus the marker; the empty string
        when not even the marker fits) and the token count of the original. Costs
        O(log len(text)) counts.
    """
    total = count(text)
    if total <= max_tokens:
        return text, total
    if count(marker(total, total)) > max_tokens:
        return "", total
    keep = _longest_prefix(text, max_tokens, total, count, lambda head: marker(total, total))
    if at_line_break:
        newline = text.rfind("\n", 0, keep)
        if newline > keep * 0.8:
            keep = newline
    while True:
        head = text[:keep].rstrip() if marker is ELLIPSIS else text[:keep]
        result = head + marker(total - (count(head) if head else 0), total)
        if not head or count(result) <= max_tokens:
            return result, total
        keep = keep * 9 // 10  # the marker's digits changed its size; shave a little more


def _longest_prefix(
    text: str, max_tokens: int, total: int, count: Count, marker: Callable[[str], str]
) -> int:
    """The length of the longest prefix that fits `max_tokens` with its marker.

    Alternates a proportional guess (fast on ordinary text) with bisection (guaranteed).
    """
    low, high = 0, len(text)  # the longest fitting prefix length lies in [low, high)
    guess = int(len(text) * max_tokens / max(total, 1))
    proportional = True
    while high - low > 1:
        if not low < guess < high:
            guess = (low + high) // 2
        head = text[:guess]
        tokens = count(head + marker(head))
        if tokens <= max_tokens:
            low = guess
        else:
            high = guess
        proportional = not proportional
        guess = int(guess * max_tokens / max(tokens, 1)) if proportional else (low + high) // 2
    return low
