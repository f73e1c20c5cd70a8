"""The renderer's search for the largest cap that fits (`agent_flow.environment.render`).

Each probe renders the environment under a cap and counts it, as much text as the cap lets
through: a probe near the answer costs a whole count of what fits. The search must find a
boundary (a cap that fits, the next one not) whatever the measure does, within three times
log2 probes, with probes only inside the range, and whatever a miss far over the limit
reports (a prefix's count, not the whole's).
"""

from __future__ import annotations

import math
from collections.abc import Callable

from hypothesis import given
from hypothesis import strategies as st

from agent_flow.environment import render as render_module


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


@given(measure=_measures(), far=st.integers(1, 64))
def test_the_search_finds_a_boundary_within_three_log2_probes(
    measure: tuple[Callable[[int], int], int, int], far: int
) -> None:
    cost, high, limit = measure
    if cost(high) <= limit or cost(0) > limit:
        return
    probes: list[int] = []

    def measured(n: int) -> tuple[int, bool]:
        """As `_Fit.estimate` answers: exact when it fits or misses narrowly, else a prefix's."""
        probes.append(n)
        value = cost(n)
        if value <= limit + far:
            return value, True
        return limit + far + 1, False

    found = render_module._largest(0, high, measured, limit)
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
