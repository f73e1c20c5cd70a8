"""The renderer's search for the largest cap that fits (`agent_flow.environment.render`).

Each probe renders the environment under a cap and counts it, as much text as the cap lets
through: a probe near the answer costs a whole count of what fits. The search must find a
boundary (a cap that fits, the next one not) whatever the measure does, within three times
log2 probes, with probes only inside the range, and whatever a miss far over the limit
reports (a prefix's count, not the whole's).
"""

from __future__ import annotations

import argparse
import inspect
import itertools
import math
import typing
from collections.abc import Callable

from hypothesis import given
from hypothesis import strategies as st

from agent_flow import Environment
from agent_flow.environment import render as render_module
from agent_flow.tokens import TiktokenCounter


@st.composite
def _measures(draw: st.DrawFn) -> tuple[Callable[[int], int], int, int]:
    """A cost function, a range's end and a limit, with the cost at 0 fitting and at the end not."""
    kind = draw(st.sampled_from(["text", "knee", "steps", "wild"]))
    base = draw(st.integers(0, 500))
    high = draw(st.integers(2, 1 << 20))
    if kind == "text":
        chars = draw(st.floats(1.2, 8))
        jitter = draw(st.lists(st.integers(0, 3), min_size=1, max_size=64))

        def cost(n: int) -> int:
            return base + math.ceil(n / chars) + jitter[n % len(jitter)] // 2

    elif kind == "knee":
        chars = draw(st.floats(1.2, 8))
        knee = draw(st.integers(1, high))

        def cost(n: int) -> int:
            return base + math.ceil(n / chars) + math.ceil(min(n, knee) / 3)

    elif kind == "steps":
        jumps = sorted(draw(st.sets(st.integers(1, high), min_size=1, max_size=200)))

        def cost(n: int) -> int:
            return base + 7 * sum(1 for j in jumps if j <= n)

    else:  # not monotone at all
        seed = draw(st.integers(0, 2**32))

        def cost(n: int) -> int:
            return base + (n * 2654435761 + seed) % 1000 + n // 50

    limit = draw(st.integers(cost(0), max(cost(0), cost(high) - 1)))
    return cost, high, limit


def _estimating(
    cost: Callable[[int], int], limit: int, far: int, probes: list[int]
) -> Callable[[int], tuple[int, bool]]:
    """A measure as `_Fit.estimate` answers: exact when it fits or misses narrowly, else a
    prefix's (some number over the limit); every probe is noted in `probes`."""

    def measured(n: int) -> tuple[int, bool]:
        probes.append(n)
        value = cost(n)
        if value <= limit + far:
            return value, True
        return limit + far + 1, False

    return measured


@given(measure=_measures(), far=st.integers(1, 64))
def test_the_search_finds_a_boundary_within_three_log2_probes(
    measure: tuple[Callable[[int], int], int, int], far: int
) -> None:
    cost, high, limit = measure
    if cost(high) <= limit or cost(0) > limit:
        return
    probes: list[int] = []
    found = render_module._largest(0, high, _estimating(cost, limit, far, probes), limit)
    assert 0 <= found < high
    assert cost(found) <= limit
    assert found + 1 == high or cost(found + 1) > limit
    assert all(0 <= n < high for n in probes)
    assert len(probes) <= 3 * math.ceil(math.log2(high)) + 3


@given(answer=st.integers(1_000, 1 << 20), slope=st.integers(100, 5_000))
def test_a_measure_that_misleads_every_guess_still_takes_log2_probes(
    answer: int, slope: int
) -> None:
    """Flat up to the answer, then a cliff: each line through two counts points the wrong way."""
    limit = answer // slope + 2
    high = 1 << 21
    probes: list[int] = []

    def measured(n: int) -> tuple[int, bool]:
        probes.append(n)
        if n <= answer:
            return n // slope, True
        return (limit + 1, True) if n % 2 else (limit + 10**6, False)

    assert render_module._largest(0, high, measured, limit) == answer
    assert len(probes) <= 3 * math.ceil(math.log2(high)) + 3


@given(
    measure=_measures(),
    far=st.integers(1, 64),
    slack=st.integers(1, 10),
    seen=st.lists(st.integers(0, 1 << 20), max_size=30),
)
def test_with_slack_and_known_measures_the_answer_fits_and_is_close_or_a_boundary(
    measure: tuple[Callable[[int], int], int, int], far: int, slack: int, seen: list[int]
) -> None:
    """Known measures (any exact ones, from earlier searches) and a slack change where the
    search starts and when it stops, never that the answer fits and is in range."""
    cost, high, limit = measure
    if cost(high) <= limit or cost(0) > limit:
        return
    known = {n: cost(n) for n in seen if n < high}
    probes: list[int] = []
    measured = _estimating(cost, limit, far, probes)
    found = render_module._largest(0, high, measured, limit, known, slack=slack)
    assert 0 <= found < high
    assert cost(found) <= limit
    close = limit - cost(found) <= limit >> slack
    assert close or found + 1 == high or cost(found + 1) > limit
    assert all(0 <= n < high for n in probes)
    assert len(probes) <= 3 * math.ceil(math.log2(high)) + 3


@given(
    densities=st.lists(st.floats(1.5, 8), min_size=64, max_size=64),
    start=st.integers(20_000, 60_000),
    shrink=st.floats(0, 1),
)
def test_a_budget_a_few_tokens_off_the_last_one_takes_almost_no_probes(
    densities: list[float], start: int, shrink: float
) -> None:
    """As turns go, the history grows and the environment's budget shrinks by a few tokens.
    Text is denser in some places than others (characters per token, here per 4 KB piece).
    With the measures of the searches before (the renderer keeps each block's count) and a
    1/256 slack aimed into, the later searches take about one new probe in all, each probe
    a count of as much text as the cap lets through (without the measures: 3-6 each)."""
    piece = 4096
    bounds = [0.0, *itertools.accumulate(piece / d for d in densities)]

    def cost(n: int) -> int:
        i = min(n // piece, len(densities) - 1)
        return math.ceil(bounds[i] + (n - i * piece) / densities[i])

    high = len(densities) * piece
    step = 1 + int(shrink * (start >> 10))  # up to a quarter of the 1/256 slack a turn
    if cost(high - 1) <= start:
        return
    known: dict[int, int] = {}
    new_probes = []
    for turn in range(10):
        limit = start - turn * step

        def measured(n: int) -> tuple[int, bool]:
            known[n] = cost(n)
            return known[n], True

        before = len(known)
        found = render_module._largest(0, high, measured, limit, dict(known), slack=8)
        new_probes.append(len(known) - before)
        assert cost(found) <= limit
        assert limit - cost(found) <= limit >> 8 or cost(found + 1) > limit
    assert sum(new_probes[1:]) <= 9, new_probes


class _Counting(TiktokenCounter):
    """Counts as `TiktokenCounter`, noting how many counts were of long texts."""

    long_counts = 0

    def count(self, text: str) -> int:
        if len(text) > 20_000:
            self.long_counts += 1
        return super().count(text)


def test_renders_for_budgets_a_few_tokens_apart_count_the_long_text_about_once_each() -> None:
    """A run's environment budget shrinks by the few tokens each turn adds to the history:
    each render after the first starts from the blocks (and counts) the ones before kept."""
    document = "".join(inspect.getsource(m) for m in (argparse, inspect, typing))
    counter = _Counting()
    environment = Environment()
    environment.set("/extensions/document", document)
    first = environment.render_report(20_000, counter)
    assert first.string_cap is not None and first.tokens <= 20_000
    searched = counter.long_counts
    for budget in range(19_975, 19_700, -25):
        report = environment.render_report(budget, counter)
        assert report.tokens <= budget
        assert report.tokens >= budget - (budget >> 8) - 64  # the budget is used, nearly all
    # 10 here (each its own count before: 234)
    assert counter.long_counts - searched <= 16, (searched, counter.long_counts)
