"""Random sequences of claims, writes, renewals, releases and crashes, on every store.

A hypothesis state machine drives one session through runs that claim it, write events with
their fence (or without one), renew, release, or die (a lease renewed to expire at once and
never touched again by its run, or touched too late), and checks each step against a model of
who holds the lease. Invariants after every step:

- the session's lease (`SessionInfo.lease_run`, ``lease_fence``) is the model's;
- event ids (`events_with_ids`) are unique and increasing in stored order, and an id once seen
  names the same event for good;
- each claimed run's events carry its fence, so its ids are above every earlier run's;
- each run has at most one `RunFinished`, and exactly one once it finished or was abandoned
  (a later claim, or an un-leased write, found its lease expired and unreleased).

A refused write (`LeaseLostError`, `SessionBusyError`) must leave the session as it was.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import TypeVar

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import event as note
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from agent_flow.environment import Environment
from agent_flow.errors import LeaseLostError, SessionBusyError
from agent_flow.events import AgentEvent, RunFinished, TextDelta, event_to_json
from agent_flow.history import History
from agent_flow.sessions import EVENT_ID_RUN_BITS, Lease, SessionStore
from agent_flow.sessions._lease import INTERRUPTED_SEQ
from agent_flow.tokens import ApproxCounter
from tests.store_helpers.backing import Backing
from tests.store_helpers.fixtures import any_backing

__all__ = ["any_backing"]  # fixture

_T = TypeVar("_T")

COUNTER = ApproxCounter()
LIVE = 3600.0

#: A lease's time to live when claimed or renewed: live, or expired at once (its run died).
ttls = st.sampled_from([0.0, LIVE])


@dataclass
class Model:
    """Who holds the session, as the store must say."""

    run: str | None = None  # the run of the lease set on the session (expired or not)
    fence: int = 0
    live: bool = False
    claimed: list[Lease] = field(default_factory=list)  # every lease handed out, in order
    next_seq: dict[str, int] = field(default_factory=dict)
    finished: set[str] = field(default_factory=set)  # runs with their RunFinished stored
    unleased: int = 0

    def holds(self, lease: Lease) -> bool:
        return self.run == lease.run_id and self.fence == lease.fence

    def end_dead_run(self) -> str | None:
        """The set, expired lease's run is ended (if it had not ended); return it if it was."""
        dead, self.run, self.live = self.run, None, False
        if dead is None or dead in self.finished:
            return None
        self.finished.add(dead)
        self.next_seq[dead] = self.next_seq.get(dead, 0) + 1
        return dead


def lease_machine(backing: Backing) -> type[RuleBasedStateMachine]:
    class LeaseMachine(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.runner = asyncio.Runner()
            self.store: SessionStore = backing.open()
            self.run(self.store.__aenter__())
            self.session_id = self.run(self.store.create()).id
            self.model = Model()
            self.seen: dict[int, str] = {}  # every id returned, and its event's JSON

        def run(self, coroutine: Coroutine[object, object, _T]) -> _T:
            return self.runner.run(coroutine)

        def teardown(self) -> None:
            try:
                self.run(self.store.aclose())
            finally:
                self.runner.close()

        # -- what the store does -------------------------------------------------------------

        def snapshot(self) -> tuple[object, ...]:
            async def read() -> tuple[object, ...]:
                info = await self.store.info(self.session_id)
                return info, await self.store.events_with_ids(self.session_id)

            return self.run(read())

        def save(self, events: list[AgentEvent], fence: int | None) -> None:
            history, environment = History(counter=COUNTER), Environment()
            self.run(
                self.store.save_step(
                    self.session_id,
                    history=history,
                    environment=environment,
                    events=events,
                    fence=fence,
                )
            )

        def events_of(self, run: str, count: int, finish: bool) -> list[AgentEvent]:
            first = self.model.next_seq.get(run, 0)
            events: list[AgentEvent] = [
                TextDelta(run_id=run, seq=seq, text=f"{run}:{seq}")
                for seq in range(first, first + count)
            ]
            if finish:
                events.append(
                    RunFinished(
                        run_id=run,
                        seq=first + count,
                        stop_reason="completed",
                        final_text="",
                        iterations=1,
                        prompt_tokens=0,
                        completion_tokens=0,
                        duration_ms=0.0,
                    )
                )
            return events

        # -- rules ---------------------------------------------------------------------------

        @rule(ttl=ttls)
        def claim(self, ttl: float) -> None:
            model = self.model
            run = f"run-{len(model.claimed)}"
            if model.run is not None and model.live:
                before = self.snapshot()
                with pytest.raises(SessionBusyError) as caught:
                    self.run(self.store.claim(self.session_id, run_id=run, holder="h", ttl=ttl))
                assert caught.value.run_id == model.run
                assert self.snapshot() == before
                note("a claim found the session busy")
                return
            lease = self.run(self.store.claim(self.session_id, run_id=run, holder="h", ttl=ttl))
            fence = model.fence + 1
            expected = model.end_dead_run()
            if expected is not None:
                note("a claim ended a dead run")
            assert (lease.run_id, lease.fence, lease.interrupted_run) == (run, fence, expected)
            model.run, model.fence, model.live = run, fence, ttl > 0
            model.claimed.append(lease)

        @rule(
            pick=st.integers(0, 100),
            count=st.integers(0, 3),
            finish=st.booleans(),
        )
        def save_with_fence(self, pick: int, count: int, finish: bool) -> None:
            model = self.model
            if not model.claimed:
                return
            lease = model.claimed[pick % len(model.claimed)]
            allowed = model.holds(lease)
            if allowed and lease.run_id in model.finished:
                return  # a run that ended writes no more (its events would follow its end)
            events = self.events_of(lease.run_id, count, finish)
            if not allowed:
                before = self.snapshot()
                with pytest.raises(LeaseLostError):
                    self.save(events, lease.fence)
                assert self.snapshot() == before
                note("a stale fence was refused")
                return
            self.save(events, lease.fence)
            model.next_seq[lease.run_id] = model.next_seq.get(lease.run_id, 0) + len(events)
            if finish:
                model.finished.add(lease.run_id)

        @rule(count=st.integers(0, 2))
        def save_without_fence(self, count: int) -> None:
            model = self.model
            run = f"tool-{model.unleased}"
            events = self.events_of(run, count, False)
            if model.run is not None and model.live:
                before = self.snapshot()
                with pytest.raises(SessionBusyError) as caught:
                    self.save(events, None)
                assert caught.value.run_id == model.run
                assert self.snapshot() == before
                return
            self.save(events, None)
            # An expired lease is ended first; with none, nothing happens.
            if model.end_dead_run() is not None:
                note("a write without a fence ended a dead run")
            model.unleased += 1

        @rule(pick=st.integers(0, 100), ttl=ttls)
        def renew(self, pick: int, ttl: float) -> None:
            """Renew a lease; ttl 0 is how a run dies (its lease expires, it writes no more)."""
            model = self.model
            if not model.claimed:
                return
            lease = model.claimed[pick % len(model.claimed)]
            if not model.holds(lease):
                with pytest.raises(LeaseLostError):
                    self.run(self.store.renew(lease, ttl=ttl))
                return
            renewed = self.run(self.store.renew(lease, ttl=ttl))
            assert (renewed.run_id, renewed.fence) == (lease.run_id, lease.fence)
            model.live = ttl > 0

        @rule(pick=st.integers(0, 100))
        def release(self, pick: int) -> None:
            model = self.model
            if not model.claimed:
                return
            lease = model.claimed[pick % len(model.claimed)]
            self.run(self.store.release(lease))
            if model.holds(lease):
                model.run, model.live = None, False

        # -- invariants ----------------------------------------------------------------------

        @invariant()
        def the_lease_is_the_models(self) -> None:
            info = self.run(self.store.info(self.session_id))
            assert (info.lease_run, info.lease_fence) == (self.model.run, self.model.fence)

        @invariant()
        def ids_grow_never_change_and_follow_the_fences(self) -> None:
            pairs = self.run(self.store.events_with_ids(self.session_id))
            ids = [number for number, _ in pairs]
            assert ids == sorted(set(ids)), "ids must be unique and increasing in stored order"
            for number, event in pairs:
                assert self.seen.setdefault(number, event_to_json(event)) == event_to_json(event)
            assert set(self.seen) == set(ids), "an event id disappeared"
            assert self.run(self.store.info(self.session_id)).last_event_id == (
                ids[-1] if ids else -1
            )
            fences = {lease.run_id: lease.fence for lease in self.model.claimed}
            for number, event in pairs:
                if event.run_id in fences:  # a claimed run: its fence is in its ids
                    assert number >> EVENT_ID_RUN_BITS == fences[event.run_id]
                    assert number & ((1 << EVENT_ID_RUN_BITS) - 1) == event.seq
            # So each claimed run's ids are above every earlier claimed run's.
            by_run: dict[str, list[int]] = {}
            for number, event in pairs:
                by_run.setdefault(event.run_id, []).append(number)
            order = [lease.run_id for lease in self.model.claimed if lease.run_id in by_run]
            for earlier, later in itertools.pairwise(order):
                assert max(by_run[earlier]) < min(by_run[later])

        @invariant()
        def every_ended_run_has_exactly_one_end(self) -> None:
            events = self.run(self.store.events(self.session_id))
            ends: dict[str, int] = {}
            for event in events:
                if isinstance(event, RunFinished):
                    ends[event.run_id] = ends.get(event.run_id, 0) + 1
            assert ends == dict.fromkeys(self.model.finished, 1)
            for event in events:
                if isinstance(event, RunFinished) and event.stop_reason == "interrupted":
                    earlier = [e.seq for e in events if e.run_id == event.run_id and e is not event]
                    assert event.seq == INTERRUPTED_SEQ > max(earlier, default=-1)

    return LeaseMachine


def test_any_sequence_of_claims_writes_and_crashes_keeps_one_writer_and_ids_unique(
    any_backing: Backing,
) -> None:
    run_state_machine_as_test(
        lease_machine(any_backing),
        settings=settings(
            max_examples=25 if any_backing.kind == "postgres" else 40,
            stateful_step_count=25,
            suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
        ),
    )
