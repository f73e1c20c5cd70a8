"""Rendering the environment under a token budget: the report, the drop order, the search.

`Environment.render` and `Environment.render_report` describe the rendered text and how it
degrades (elide old items, shorten strings, drop sections in `DROP_ORDER`). This module
owns what a render reports (`RenderReport`, one `SectionRender` per non-empty section) and
`_Fit`, which finds for one budget the caps that fit and drops sections when none do; the
caching renderer that drives it is `_renderer._Renderer`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Final, TypeAlias

from pydantic import BaseModel, ConfigDict

from agent_flow._types import JsonObject
from agent_flow.environment.sections import RENDER_ORDER, SectionName
from agent_flow.tokens import TokenCounter, splits_at_headings

if TYPE_CHECKING:
    from agent_flow.environment._renderer import _Block, _Caps, _Renderer, _SectionCache

__all__ = ["DROP_ORDER", "RenderReport", "SectionRender"]

#: The order sections are dropped in when even fully degraded they do not fit.
DROP_ORDER: Final[tuple[SectionName, ...]] = (
    "extensions",
    "workspace",
    "knowledge",
    "system",
    "task",
)

_SEPARATOR: Final = "\n\n"
_DROPPED_SUFFIX: Final = ": omitted to fit the token budget"
# Prefix lengths (in characters per token of the limit) tried before counting a whole block.
_PREFIX_CHARS_PER_TOKEN: Final = (4, 16)
#: How close the string cap's tokens come to the limit: within limit >> this (0.4%). A long
#: text costs a count per probe, and each turn's budget is a few tokens off the last one's:
#: exact, a 1 MB text took a dozen probes a turn; this close, most turns take none or one.
_STRING_CAP_SLACK: Final = 8
#: A measure of a render: its tokens, and whether they are counted exactly.
_Measure: TypeAlias = tuple[int, bool]


class SectionRender(BaseModel):
    """How one non-empty section came out of a render.

    Attributes:
        name: The section.
        tokens: Tokens of its block as rendered (header line included; the blank line between
            blocks is not), or of its one-line marker when dropped; 0 when left out entirely.
        elided_items: List items and dict entries replaced by "earlier ..." markers.
        shortened_strings: Strings cut short with a "… [+N chars]" marker.
        dropped: Whether the section was left out (replaced by a marker, if one fit).
    """

    model_config = ConfigDict(frozen=True)

    name: SectionName
    tokens: int
    elided_items: int = 0
    shortened_strings: int = 0
    dropped: bool = False


class RenderReport(BaseModel):
    """The rendered environment and what it took to fit the budget.

    Attributes:
        text: What the model reads; its token count never exceeds `max_tokens`.
        tokens: ``counter.count(text)``.
        max_tokens: The budget.
        sections: The non-empty sections, in render order.
        item_cap: The newest items each list and dict kept, or None if nothing was elided.
        string_cap: The characters each string kept, or None if no string was shortened.
    """

    model_config = ConfigDict(frozen=True)

    text: str
    tokens: int
    max_tokens: int
    sections: tuple[SectionRender, ...] = ()
    item_cap: int | None = None
    string_cap: int | None = None

    @property
    def dropped(self) -> list[SectionName]:
        """The sections left out, in render order."""
        return [s.name for s in self.sections if s.dropped]

    @property
    def degraded(self) -> bool:
        """Whether anything was elided, shortened or dropped."""
        return any(s.dropped or s.elided_items or s.shortened_strings for s in self.sections)


class _Fit:
    """One render: searches the caps that fit the budget, then drops sections if needed."""

    def __init__(
        self,
        renderer: _Renderer,
        state: JsonObject,
        caches: dict[str, _SectionCache],
        budget: int,
        counter: TokenCounter,
        counter_id: int,
    ) -> None:
        self.renderer = renderer
        self.state = state
        self.caches = caches
        self.budget = budget
        self.counter = counter
        self.counter_id = counter_id
        self.separator = counter.count(_SEPARATOR)
        self.marker_counts: dict[str, int] = {}

    def count_block(self, block: _Block, limit: int) -> int:
        """Return the block's tokens, or some number above `limit` when it is far above."""
        cached = block.counts.get(self.counter_id)
        if cached is not None and (cached[1] or cached[0] > limit):
            return cached[0]
        text = block.text
        # Counting a text far longer than the limit is wasted work: count growing prefixes
        # first. A cut splits at most a few tokens, so a prefix well over the limit means
        # the whole is over it too. A wrong guess (a strange counter) only degrades more;
        # the final text is always counted exactly.
        for chars_per_token in _PREFIX_CHARS_PER_TOKEN:
            cut = (max(limit, 0) + 1) * chars_per_token + 64
            if len(text) <= cut:
                break
            head = self.counter.count(text[:cut])
            if head > limit + 8:
                block.counts[self.counter_id] = (head, False)
                return head
        count = self.counter.count(text)
        block.counts[self.counter_id] = (count, True)
        return count

    def marker(self, name: str) -> str:
        return f"## {name}{_DROPPED_SUFFIX}"

    def marker_count(self, name: str) -> int:
        if name not in self.marker_counts:
            self.marker_counts[name] = self.counter.count(self.marker(name))
        return self.marker_counts[name]

    def estimate(self, kept: list[str], markers: list[str], caps: _Caps, limit: int) -> _Measure:
        """The parts' tokens under `caps`, and whether every part was counted exactly.

        Stops counting once over `limit` (a block far over it counts a prefix only).
        """
        total = sum(self.marker_count(name) for name in markers)
        total += self.separator * max(len(kept) + len(markers) - 1, 0)
        exact = True
        for name in kept:
            if total > limit:
                return total, False
            block = self.renderer._block(self.state, name, self.caches[name], caps)
            total += self.count_block(block, limit - total)
            exact = exact and block.counts[self.counter_id][1]
        return total, exact

    def search(self, kept: list[str], markers: list[str], limit: int) -> _Caps | None:
        """Return the caps (stages 1 and 2) that fit `limit` by estimate, or None."""

        def measure(caps: _Caps) -> _Measure:
            return self.estimate(kept, markers, caps, limit)

        if measure((None, None))[0] <= limit:
            return (None, None)
        longest = max((self.caches[name].longest_collection for name in kept), default=0)
        if longest > 1 and measure((1, None))[0] <= limit:
            item_cap = _largest(1, longest, lambda k: measure((k, None)), limit)
            return (item_cap, None)
        item_cap_or_none = 1 if longest > 1 else None
        longest_string = max((self.caches[name].longest_string for name in kept), default=0)
        if longest_string > 0 and measure((item_cap_or_none, 0))[0] <= limit:
            # The answer for a budget a few tokens off (the next turn's: the history grew)
            # lies between caps measured before: the blocks of the longest section are kept
            # per cap with their counts, so those measures cost lookups, where a probe counts
            # a text as long as its cap.
            known = {
                cap: total
                for cap in self.counted_string_caps(kept, item_cap_or_none)
                for total, exact in [measure((item_cap_or_none, cap))]
                if exact
            }
            string_cap = _largest(
                0,
                longest_string,
                lambda n: measure((item_cap_or_none, n)),
                limit,
                known,
                slack=_STRING_CAP_SLACK,
            )
            return (item_cap_or_none, string_cap)
        return None

    def counted_string_caps(self, kept: list[str], item_cap: int | None) -> list[int]:
        """The string caps with an exactly counted block in the longest-string section.

        Under `item_cap`, as `_Renderer._block` keys them: measures at these cost lookups.
        """
        name = max(kept, key=lambda n: self.caches[n].longest_string)
        cache = self.caches[name]
        if item_cap is not None and item_cap >= cache.longest_collection:
            item_cap = None
        return [
            string_cap
            for (items, string_cap), block in cache.blocks.items()
            if items == item_cap
            and string_cap is not None
            and block.counts.get(self.counter_id, (0, False))[1]
        ]

    def assemble(self, kept: list[str], markers: list[str], caps: _Caps) -> RenderReport:
        pieces: list[tuple[str, _Block | None]] = []
        sections: list[SectionRender] = []
        any_elided = any_shortened = False
        for name in RENDER_ORDER:
            if name in kept:
                block = self.renderer._block(self.state, name, self.caches[name], caps)
                pieces.append((block.text, block))
                any_elided = any_elided or block.elided > 0
                any_shortened = any_shortened or block.shortened > 0
                tokens = self.count_block(block, self.budget)
                sections.append(
                    SectionRender(
                        name=name,
                        tokens=tokens,
                        elided_items=block.elided,
                        shortened_strings=block.shortened,
                    )
                )
            elif name in self.caches:
                with_marker = name in markers
                if with_marker:
                    pieces.append((self.marker(name), None))
                tokens = self.marker_count(name) if with_marker else 0
                sections.append(SectionRender(name=name, tokens=tokens, dropped=True))
        return RenderReport(
            text=_SEPARATOR.join(text for text, _ in pieces),
            tokens=self.count_joined(pieces),
            max_tokens=self.budget,
            sections=tuple(sections),
            item_cap=caps[0] if any_elided else None,
            string_cap=caps[1] if any_shortened else None,
        )

    def count_joined(self, pieces: list[tuple[str, _Block | None]]) -> int:
        """The exact count of the pieces (blocks, or markers: None) joined by the separator.

        Counted whole, unless the counter splits at headings (`splits_at_headings`): every
        piece starts with ``## ``, so the whole is the sum of each piece with the separator
        after it (the last one alone). Each block keeps those counts, so a change costs the
        count of the block it changed, not of the whole text again.
        """
        if not pieces:
            return 0
        if not splits_at_headings(self.counter):
            return self.counter.count(_SEPARATOR.join(text for text, _ in pieces))
        total = 0
        last = len(pieces) - 1
        for index, (text, block) in enumerate(pieces):
            if block is None:
                total += self.counter.count(text + _SEPARATOR if index < last else text)
            elif index < last:
                joined = block.joined.get(self.counter_id)
                if joined is None:
                    joined = block.joined[self.counter_id] = self.counter.count(text + _SEPARATOR)
                total += joined
            else:
                alone = block.counts.get(self.counter_id)
                if alone is None or not alone[1]:
                    alone = block.counts[self.counter_id] = (self.counter.count(text), True)
                total += alone[0]
        return total

    def attempt(self, kept: list[str], markers: list[str]) -> RenderReport | None:
        limit = self.budget
        while limit >= 0:
            caps = self.search(kept, markers, limit)
            if caps is None:
                return None
            report = self.assemble(kept, markers, caps)
            if report.tokens <= self.budget:
                return report
            # The parts were estimated to fit but the whole counts more (tokens merge
            # differently across block seams): aim lower by the overshoot.
            limit -= report.tokens - self.budget
        return None

    def run(self, present: list[str]) -> RenderReport:
        kept = list(present)
        dropped: list[str] = []
        if self.budget > 0:
            # The parts' counts need not add up to the whole's (tokens merge across the
            # seams), so when the full text may fit, count it whole: what fits is never
            # degraded.
            near = 2 * self.budget + 16
            if self.estimate(kept, [], (None, None), near)[0] <= near:
                whole = self.assemble(kept, [], (None, None))
                if whole.tokens <= self.budget:
                    return whole
            while True:
                for markers in [dropped, []] if dropped else [[]]:
                    report = self.attempt(kept, markers)
                    if report is not None:
                        return report
                if not kept:
                    break
                victim = next(name for name in DROP_ORDER if name in kept)
                kept.remove(victim)
                dropped.append(victim)
        return RenderReport(
            text="",
            tokens=0,
            max_tokens=self.budget,
            sections=tuple(SectionRender(name=n, tokens=0, dropped=True) for n in present),
        )


def _largest(
    low: int,
    high: int,
    measure: Callable[[int], _Measure],
    limit: int,
    known: Mapping[int, int] | None = None,
    *,
    slack: int = 0,
) -> int:
    """Return the largest x in [low, high) whose measure fits `limit`, or one close to it.

    Given: measure(low) fits, measure(high) does not. A measure is a cost and whether it is
    exact: one that fits always is, one far over the limit may be a prefix's
    (`_Fit.count_block`). With `slack`, an x whose cost is within ``limit >> slack`` of the
    limit is close enough (8: 0.4% of the budget left unused at most). `known` holds exact
    costs measured before, by x: the search starts from the largest known to fit (often no
    probe at all is needed), up to the smallest known not to. Otherwise it gallops up
    (doubling the step) so that probes stay within twice the answer, as each probe costs
    about as much as the text it renders. Then it guesses on the line through the last two
    exact measures (a secant: on text the measure grows about linearly), aiming past the
    limit by a quarter of the last probe's distance from it (with `slack`, into the middle
    of the close band), so that the next probe lands on the other side of the answer and
    the bracket closes from both ends. Two guesses in a row that do not halve the bracket
    are followed by a bisection, so it never takes more than three times log2 probes. On 21
    texts of 100-400 KB (Python, JSON, Markdown, licences) cut to 8,000 and 60,000 tokens,
    234 probes near the exact answer where interpolating between the bracket's ends took 289.
    """
    # Tokens under the limit that are close enough (none: with no slack, always go on).
    close = limit >> slack if slack else -1
    points = sorted((x, c) for x, c in (known or {}).items() if low <= x < high)
    fitting = [(x, c) for x, c in points if c <= limit]
    above = next(((x, c) for x, c in points if c > limit and x > low), None)
    if fitting and fitting[-1][0] > low:
        # A budget a few tokens off one searched before (the next turn's): start from the
        # largest x known to fit, up to the smallest known not to. Without that bound, the
        # first step goes twice as far as the tokens left need at the text's density.
        low, low_cost = fitting[-1]
        exact = [*fitting[-2:-1], fitting[-1]]
        if above is not None and above[0] > low:
            high, step = above[0], above[0]
            exact = [fitting[-1], above]
        else:
            step = max(1, 2 * (limit - low_cost) * low // max(1, low_cost))
    else:
        low_cost = measure(low)[0]
        exact, step = [(low, low_cost)], 1  # the last two measures counted exactly
    while low + step < high and limit - low_cost > close:
        cost, counted = measure(low + step)
        if cost > limit:
            high = low + step
            if counted:
                exact = [exact[-1], (high, cost)]
            break
        low, low_cost = low + step, cost
        exact = [exact[-1], (low, cost)]
        step *= 2
    aim = -1  # tokens from the limit the next guess aims at
    unhalved = 0  # guesses since the bracket last halved
    halved_at = high - low
    while high - low > 1 and limit - low_cost > close:
        probe = (low + high) // 2
        guessed = False
        (x0, c0), (x1, c1) = exact[0], exact[-1]
        if unhalved < 2 and (c1 - c0) * (x1 - x0) > 0:
            # Into the middle of the close band, where there is one: the next turn's limit,
            # a few tokens lower, still holds the answer then, with no probe.
            target = limit - close // 2 if slack else limit + aim + 0.5
            guess = x0 + (target - c0) * (x1 - x0) / (c1 - c0)
            probe = min(max(int(guess), low + 1), high - 1)
            guessed = True
        cost, counted = measure(probe)
        if counted:
            exact = [exact[-1], (probe, cost)]
        if cost <= limit:
            low, low_cost, aim = probe, cost, max(1, (limit - cost) // 4)
        else:
            high, aim = probe, -max(1, (cost - limit) // 4)
        if 2 * (high - low) <= halved_at or not guessed:
            unhalved, halved_at = 0, high - low
        else:
            unhalved += 1
    return low
