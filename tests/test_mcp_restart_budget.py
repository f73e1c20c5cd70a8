"""`RestartBudget`: ``max_restarts`` restarts within ``restart_window`` seconds, never more.

Against a model that keeps every restart's time: a restart may be made exactly when fewer than
``max_restarts`` were made in the window before it; without a window, when fewer were ever
made. And a refusal says when the next one may be made.
"""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st

from agent_flow.tools._mcp_restarts import RestartBudget
from tests.helpers import FakeClock


@given(
    max_restarts=st.integers(0, 4),
    window=st.none() | st.floats(1.0, 100.0),
    steps=st.lists(st.floats(0.0, 60.0), max_size=40),
)
def test_a_restart_is_allowed_exactly_when_fewer_than_the_limit_fall_in_the_window(
    max_restarts: int, window: float | None, steps: list[float]
) -> None:
    clock = FakeClock()
    budget = RestartBudget(max_restarts, window, clock=clock)
    made: list[float] = []
    for step in steps:
        clock.now += step
        recent = [t for t in made if window is None or clock.now - t < window]
        refused = budget.refusal()
        assert (refused is None) == (len(recent) < max_restarts), (made, clock.now)
        if refused is None:
            budget.spend()
            made.append(clock.now)
        elif window is not None and recent:
            wait = int(re.search(r"tried again in (\d+)s", refused).group(1))  # type: ignore[union-attr]
            assert wait >= 1 and wait >= min(recent) + window - clock.now - 1e-9
        elif window is None:
            assert refused.endswith("it is not restarted again")
    assert budget.spent == len(made)


def test_a_refusal_names_the_count_the_window_and_the_wait() -> None:
    clock = FakeClock()
    budget = RestartBudget(2, 600.0, clock=clock)
    budget.spend()
    clock.now += 100
    budget.spend()
    clock.now += 50
    assert budget.refusal() == (
        "was restarted 2 times in the last 600s, the limit (max_restarts); "
        "it is tried again in 450s"
    )
    clock.now += 450
    assert budget.refusal() is None
