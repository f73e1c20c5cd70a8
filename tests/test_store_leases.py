"""Leases, fences and event ids, on every store (memory, SQLite, PostgreSQL).

Part of the store conformance suite (see tests/test_store_conformance.py): a session has one
writer at a time, the run holding its lease (`SessionStore.claim`); a write carrying a stale
fence stores nothing; a write without one waits for no lease but is refused while one is live;
a claim that finds a dead holder's lease ends that run; every event gets an id that is never
reused. Expiry is acted out with ``ttl=0`` (a lease that has expired already), never by
waiting. The random sequences of claims, writes and crashes are tests/test_store_lease_machine.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import typing

import pytest

from agent_flow.environment import Environment
from agent_flow.errors import (
    LeaseLostError,
    SessionBusyError,
    SessionNotFoundError,
    StoreError,
    UserError,
)
from agent_flow.events import AgentEvent, RunFinished, TextDelta
from agent_flow.history import History
from agent_flow.sessions import (
    EVENT_ID_RUN_BITS,
    Checkpoint,
    InMemorySessionStore,
    Lease,
    SessionStore,
    event_id,
)
from agent_flow.sessions._lease import INTERRUPTED_SEQ
from agent_flow.tokens import ApproxCounter
from tests.store_helpers.backing import Backing
from tests.store_helpers.fixtures import any_backing, backing, kind, store
from tests.store_helpers.old_schema import make_previous_version, old_events, stored_version
from tests.store_helpers.session_writer import add_step

__all__ = ["any_backing", "backing", "kind", "store"]  # fixtures

COUNTER = ApproxCounter()
HOUR = 3600.0


def fresh() -> tuple[History, Environment]:
    return History(counter=COUNTER), Environment(max_changes=5)


def deltas(run: str, first: int, count: int) -> list[AgentEvent]:
    return [
        TextDelta(run_id=run, seq=seq, text=f"{run}:{seq}") for seq in range(first, first + count)
    ]


def finished(run: str, seq: int) -> RunFinished:
    return RunFinished(
        run_id=run,
        seq=seq,
        stop_reason="completed",
        final_text="done",
        iterations=1,
        prompt_tokens=1,
        completion_tokens=1,
        duration_ms=1.0,
    )


async def save(
    store: SessionStore, session_id: str, events: list[AgentEvent], fence: int | None
) -> None:
    history, environment = fresh()
    add_step(history, environment, len(events))
    await store.save_step(
        session_id, history=history, environment=environment, events=events, fence=fence
    )


async def snapshot(store: SessionStore, session_id: str) -> tuple[object, ...]:
    """Everything a write could change: the state, the events with their ids, the checkpoints."""
    state = await store.load(session_id)
    environment = state.environment.to_json() if state.environment is not None else None
    return (
        state.info,
        state.entries,
        environment,
        await store.events_with_ids(session_id),
        await store.checkpoints(session_id, "run-a"),
    )


# -- claim, renew, release ---------------------------------------------------------------------


async def test_a_claim_makes_one_run_the_writer_and_refuses_a_second(store: SessionStore) -> None:
    info = await store.create()
    assert (info.lease_run, info.lease_fence, info.last_event_id) == (None, 0, -1)
    lease = await store.claim(info.id, run_id="run-a", holder="1@host", ttl=HOUR)
    assert isinstance(lease, Lease)
    assert (lease.session_id, lease.run_id, lease.holder, lease.fence) == (
        info.id,
        "run-a",
        "1@host",
        1,
    )
    assert lease.interrupted_run is None
    assert lease.expires_at > info.created_at
    seen = await store.info(info.id)
    assert (seen.lease_run, seen.lease_fence) == ("run-a", 1)
    for run in ("run-b", "run-a"):  # another run, or the same run again: busy either way
        with pytest.raises(SessionBusyError, match="'run-a'") as caught:
            await store.claim(info.id, run_id=run, holder="2@host", ttl=HOUR)
        assert caught.value.run_id == "run-a"
    assert (await store.info(info.id)).lease_fence == 1


async def test_a_released_lease_frees_the_session_and_its_fence_is_never_given_again(
    store: SessionStore,
) -> None:
    info = await store.create()
    first = await store.claim(info.id, run_id="run-a", holder="h", ttl=HOUR)
    await store.release(first)
    released = await store.info(info.id)
    assert (released.lease_run, released.lease_fence) == (None, 1)
    second = await store.claim(info.id, run_id="run-b", holder="h", ttl=HOUR)
    assert second.fence == 2
    await store.release(first)  # stale: nothing happens
    assert (await store.info(info.id)).lease_run == "run-b"
    with pytest.raises(LeaseLostError, match="fence 1"):
        await store.renew(first, ttl=HOUR)
    await store.release(second)
    assert (await store.claim(info.id, run_id="run-a", holder="h", ttl=HOUR)).fence == 3


async def test_renewing_extends_a_lease_even_expired_until_another_claim(
    store: SessionStore,
) -> None:
    info = await store.create()
    lease = await store.claim(info.id, run_id="run-a", holder="h", ttl=0)
    renewed = await store.renew(lease, ttl=HOUR)
    assert renewed.fence == lease.fence and renewed.expires_at > lease.expires_at
    with pytest.raises(SessionBusyError):
        await store.claim(info.id, run_id="run-b", holder="h", ttl=HOUR)
    expired = await store.renew(renewed, ttl=0)  # expires at once: free to claim
    taken = await store.claim(info.id, run_id="run-b", holder="h", ttl=HOUR)
    assert taken.fence == 2
    for stale in (lease, renewed, expired):
        with pytest.raises(LeaseLostError, match="run 'run-b' holds it with fence 2"):
            await store.renew(stale, ttl=HOUR)
    await store.release(taken)
    with pytest.raises(LeaseLostError, match="no run holds it"):
        await store.renew(taken, ttl=HOUR)


async def test_bad_ttls_and_unknown_sessions_are_refused(store: SessionStore) -> None:
    info = await store.create()
    for ttl in (-1.0, float("nan"), float("inf"), 1e10):
        with pytest.raises(UserError, match="ttl="):
            await store.claim(info.id, run_id="r", holder="h", ttl=ttl)
    lease = await store.claim(info.id, run_id="r", holder="h", ttl=HOUR)
    with pytest.raises(UserError, match="ttl=-1"):
        await store.renew(lease, ttl=-1)
    with pytest.raises(SessionNotFoundError, match="'nope'"):
        await store.claim("nope", run_id="r", holder="h", ttl=HOUR)
    ghost = lease.model_copy(update={"session_id": "nope"})
    with pytest.raises(SessionNotFoundError):
        await store.renew(ghost, ttl=HOUR)
    with pytest.raises(SessionNotFoundError):
        await store.release(ghost)


# -- fenced and un-leased writes ---------------------------------------------------------------


async def test_a_write_with_a_stale_fence_writes_nothing(store: SessionStore) -> None:
    info = await store.create()
    old = await store.claim(info.id, run_id="run-a", holder="h", ttl=0)
    await save(store, info.id, deltas("run-a", 0, 2), old.fence)
    await store.save_checkpoints(info.id, [Checkpoint("run-a", 0, "m", "{}")], fence=old.fence)
    new = await store.claim(info.id, run_id="run-b", holder="h", ttl=HOUR)
    before = await snapshot(store, info.id)
    with pytest.raises(LeaseLostError, match=r"fence 1 .* nothing was written"):
        await save(store, info.id, deltas("run-a", 2, 2), old.fence)
    with pytest.raises(LeaseLostError):
        await store.save_checkpoints(info.id, [Checkpoint("run-a", 1, "m", "{}")], fence=old.fence)
    assert await snapshot(store, info.id) == before
    await store.release(new)
    released = await snapshot(store, info.id)
    with pytest.raises(LeaseLostError):  # released: no fence is the session's
        await save(store, info.id, deltas("run-b", 0, 1), new.fence)
    assert await snapshot(store, info.id) == released


async def test_a_write_without_a_fence_is_refused_while_a_lease_is_live(
    store: SessionStore,
) -> None:
    info = await store.create()
    await save(store, info.id, deltas("import", 0, 1), None)  # nobody holds it: written
    lease = await store.claim(info.id, run_id="run-a", holder="h", ttl=HOUR)
    before = await snapshot(store, info.id)
    with pytest.raises(SessionBusyError, match="'run-a'") as caught:
        await save(store, info.id, deltas("other", 0, 1), None)
    assert caught.value.run_id == "run-a"
    with pytest.raises(SessionBusyError):
        await store.save_checkpoints(info.id, [Checkpoint("run-a", 0, "m", "{}")])
    assert await snapshot(store, info.id) == before
    await store.release(lease)
    await save(store, info.id, deltas("other", 0, 1), None)
    await store.save_checkpoints(info.id, [Checkpoint("run-a", 0, "m", "{}")])
    assert len(await store.events(info.id)) == 2


async def test_fenced_events_are_identified_by_fence_and_seq(store: SessionStore) -> None:
    info = await store.create()
    await save(store, info.id, deltas("import", 0, 2), None)
    lease = await store.claim(info.id, run_id="run-a", holder="h", ttl=HOUR)
    await save(store, info.id, deltas("run-a", 0, 2), lease.fence)
    await save(store, info.id, [*deltas("run-a", 2, 1), finished("run-a", 3)], lease.fence)
    await store.release(lease)
    await save(store, info.id, deltas("import", 2, 1), None)
    ids = [number for number, _ in await store.events_with_ids(info.id)]
    base = 1 << EVENT_ID_RUN_BITS
    assert ids == [0, 1, base, base + 1, base + 2, base + 3, base + 4]
    assert ids[2:6] == [event_id(1, seq) for seq in range(4)]
    assert (await store.info(info.id)).last_event_id == base + 4
    # A seq saved twice, or below one saved, has no new id: refused whole.
    again = await store.claim(info.id, run_id="run-b", holder="h", ttl=HOUR)
    await save(store, info.id, deltas("run-b", 5, 1), again.fence)
    before = await snapshot(store, info.id)
    with pytest.raises(StoreError, match="not above") as caught:
        await save(store, info.id, deltas("run-b", 4, 2), again.fence)
    assert not isinstance(caught.value, LeaseLostError)
    assert await snapshot(store, info.id) == before
    with pytest.raises(UserError, match="seq 4294967296"):
        await save(store, info.id, deltas("run-b", 1 << EVENT_ID_RUN_BITS, 1), again.fence)


def test_event_ids_put_every_fence_above_the_one_before() -> None:
    assert event_id(1, 0) == 1 << 32
    assert event_id(2, 0) > event_id(1, (1 << 32) - 1)
    for fence, seq in ((0, 0), (1, -1), (1, 1 << 32)):
        with pytest.raises(UserError):
            event_id(fence, seq)


# -- a holder that died ------------------------------------------------------------------------


async def test_a_claim_after_a_dead_holder_stores_its_run_as_interrupted(
    store: SessionStore,
) -> None:
    info = await store.create()
    dead = await store.claim(info.id, run_id="run-a", holder="dead@host", ttl=0)
    await save(store, info.id, deltas("run-a", 0, 3), dead.fence)
    lease = await store.claim(info.id, run_id="run-b", holder="h", ttl=HOUR)
    assert (lease.fence, lease.interrupted_run) == (2, "run-a")
    pairs = await store.events_with_ids(info.id)
    number, last = pairs[-1]
    assert isinstance(last, RunFinished)
    # Its end takes the last seq a run can have: above anything it handed out unsaved.
    assert (last.run_id, last.seq, last.stop_reason) == ("run-a", INTERRUPTED_SEQ, "interrupted")
    assert (last.final_text, last.iterations, last.prompt_tokens, last.cost_usd) == ("", 0, 0, None)
    assert number == event_id(dead.fence, INTERRUPTED_SEQ)
    seen = await store.info(info.id)
    assert (seen.status, seen.event_count, seen.last_event_id) == ("interrupted", 4, number)
    # The dead run's own writes are refused from now on.
    with pytest.raises(LeaseLostError):
        await save(store, info.id, deltas("run-a", 4, 1), dead.fence)
    # A run that ended (its RunFinished is stored) is not ended again, nor one that released.
    await save(store, info.id, [finished("run-b", 0)], lease.fence)
    await store.renew(lease, ttl=0)
    third = await store.claim(info.id, run_id="run-c", holder="h", ttl=HOUR)
    assert third.interrupted_run is None
    await store.release(third)
    assert (await store.claim(info.id, run_id="run-d", holder="h", ttl=0)).interrupted_run is None
    kinds = [(e.run_id, e.kind) for e in await store.events(info.id)]
    assert kinds.count(("run-a", "run_finished")) == kinds.count(("run-b", "run_finished")) == 1


async def test_the_dead_run_claiming_again_goes_on_and_nothing_is_ended(
    store: SessionStore,
) -> None:
    # A durable run recovered by another worker claims with the same run id.
    info = await store.create()
    first = await store.claim(info.id, run_id="run-a", holder="worker-1", ttl=0)
    await save(store, info.id, deltas("run-a", 0, 2), first.fence)
    again = await store.claim(info.id, run_id="run-a", holder="worker-2", ttl=HOUR)
    assert (again.fence, again.interrupted_run) == (2, None)
    await save(store, info.id, deltas("run-a", 2, 1), again.fence)
    events = await store.events(info.id)
    assert [e.kind for e in events] == ["text_delta"] * 3
    assert (await store.info(info.id)).status == "active"


async def test_a_dead_run_without_events_ends_at_its_last_seq(store: SessionStore) -> None:
    info = await store.create()
    dead = await store.claim(info.id, run_id="run-a", holder="h", ttl=0)
    await store.claim(info.id, run_id="run-b", holder="h", ttl=HOUR)
    ((number, event),) = await store.events_with_ids(info.id)
    assert isinstance(event, RunFinished)
    assert (event.seq, number) == (INTERRUPTED_SEQ, event_id(dead.fence, INTERRUPTED_SEQ))


async def test_a_write_without_a_fence_ends_an_expired_lease_first(store: SessionStore) -> None:
    info = await store.create()
    dead = await store.claim(info.id, run_id="run-a", holder="h", ttl=0)
    await save(store, info.id, deltas("run-a", 0, 1), dead.fence)
    await save(store, info.id, deltas("tool", 0, 2), None)
    pairs = await store.events_with_ids(info.id)
    assert [(e.run_id, e.kind) for _, e in pairs] == [
        ("run-a", "text_delta"),
        ("run-a", "run_finished"),
        ("tool", "text_delta"),
        ("tool", "text_delta"),
    ]
    ids = [number for number, _ in pairs]
    assert ids[:2] == [event_id(1, 0), event_id(1, INTERRUPTED_SEQ)]
    assert ids[2:] == [ids[1] + 1, ids[1] + 2]
    seen = await store.info(info.id)
    assert (seen.lease_run, seen.lease_fence, seen.status) == (None, 1, "interrupted")
    # The dead holder, renewing late, finds its lease gone rather than taking ids back.
    with pytest.raises(LeaseLostError):
        await store.renew(dead, ttl=HOUR)
    with pytest.raises(LeaseLostError):
        await save(store, info.id, deltas("run-a", 1, 1), dead.fence)


# -- reading by id -----------------------------------------------------------------------------


async def test_events_are_read_on_after_the_last_id_seen(store: SessionStore) -> None:
    info = await store.create()
    await save(store, info.id, deltas("import", 0, 2), None)
    lease = await store.claim(info.id, run_id="run-a", holder="h", ttl=HOUR)
    await save(store, info.id, deltas("run-a", 0, 3), lease.fence)
    pairs = await store.events_with_ids(info.id)
    everything = await store.events(info.id)
    assert [event for _, event in pairs] == everything
    ids = [number for number, _ in pairs]
    assert await store.events_with_ids(info.id, after_id=ids[1]) == pairs[2:]
    assert await store.events_with_ids(info.id, after_id=ids[1], limit=2) == pairs[2:4]
    assert await store.events_with_ids(info.id, after_id=ids[-1]) == []
    assert await store.events(info.id, after_id=ids[0]) == everything[1:]
    assert await store.events(info.id, after_id=-1, run_id="run-a", after_seq=0) == everything[3:]
    assert await store.events(info.id, after_id=ids[2], limit=1) == everything[3:4]
    with pytest.raises(UserError, match="pass one of them"):
        await store.events(info.id, offset=1, after_id=0)
    with pytest.raises(SessionNotFoundError):
        await store.events_with_ids("nope")


async def test_a_follower_by_id_gets_every_later_event_once(store: SessionStore) -> None:
    info = await store.create()
    lease = await store.claim(info.id, run_id="run-a", holder="h", ttl=HOUR)
    await save(store, info.id, deltas("run-a", 0, 3), lease.fence)
    start = (await store.events_with_ids(info.id))[0][0]

    async def collect(count: int) -> list[tuple[int, AgentEvent]]:
        got: list[tuple[int, AgentEvent]] = []
        async for pair in store.follow_events_with_ids(info.id, after_id=start):
            got.append(pair)
            if len(got) == count:
                break
        return got

    async def plain(count: int) -> list[AgentEvent]:
        got: list[AgentEvent] = []
        async for event in store.follow_events(info.id, after_id=start):
            got.append(event)
            if len(got) == count:
                break
        return got

    following = asyncio.gather(collect(4), plain(4))
    await save(store, info.id, deltas("run-a", 3, 2), lease.fence)
    with_ids, events = await asyncio.wait_for(following, 30)
    stored = await store.events_with_ids(info.id, after_id=start)
    assert with_ids == stored and events == [event for _, event in stored]
    waited = await store.wait_for_events_with_ids(info.id, after_id=stored[-1][0], wait=0)
    assert waited == []
    with pytest.raises(UserError, match="pass one of them"):
        await anext(aiter(store.follow_events(info.id, offset=1, after_id=0)))


async def test_an_import_numbers_its_events_from_zero_and_holds_no_lease(
    store: SessionStore,
) -> None:
    info = await store.create(session_id="orig")
    lease = await store.claim(info.id, run_id="run-a", holder="h", ttl=HOUR)
    await save(store, info.id, deltas("run-a", 0, 3), lease.fence)
    stream = io.StringIO()
    await store.export(info.id, stream)
    async with InMemorySessionStore() as other:
        for target in (store, other):
            copy = await target.import_(io.StringIO(stream.getvalue()), session_id="copy")
            assert (copy.last_event_id, copy.lease_run, copy.lease_fence) == (2, None, 0)
            assert [n for n, _ in await target.events_with_ids("copy")] == [0, 1, 2]
            assert await target.events("copy") == await store.events("orig")
            assert (await target.claim("copy", run_id="r", holder="h", ttl=HOUR)).fence == 1


# -- several store objects on the same data ----------------------------------------------------


async def test_a_lease_holds_across_store_objects(backing: Backing) -> None:
    async with backing.open() as mine, backing.open() as theirs:
        info = await mine.create()
        lease = await mine.claim(info.id, run_id="run-a", holder="p1", ttl=HOUR)
        with pytest.raises(SessionBusyError) as caught:
            await theirs.claim(info.id, run_id="run-b", holder="p2", ttl=HOUR)
        assert caught.value.run_id == "run-a"
        with pytest.raises(SessionBusyError):
            await save(theirs, info.id, deltas("run-b", 0, 1), None)
        await mine.renew(lease, ttl=0)
        taken = await theirs.claim(info.id, run_id="run-b", holder="p2", ttl=HOUR)
        assert (taken.fence, taken.interrupted_run) == (2, "run-a")
        with pytest.raises(LeaseLostError):
            await mine.renew(lease, ttl=HOUR)


async def test_a_run_of_a_deleted_session_cannot_write_into_one_created_again(
    any_backing: Backing,
) -> None:
    """Fences start at 1 again in a session created again under a deleted one's id: the old
    run's fence is the new run's, so a write must name its run (`lease_run`) to be refused."""
    async with contextlib.AsyncExitStack() as stack:
        old = await stack.enter_async_context(any_backing.open())
        # (Another process's store where two store objects can share the data.)
        new = (
            old
            if any_backing.kind == "memory"
            else await stack.enter_async_context(any_backing.open())
        )
        info = await old.create(session_id="again")
        stale = await old.claim(info.id, run_id="run-a", holder="p1", ttl=HOUR)
        history, environment = fresh()
        add_step(history, environment, 0)
        await old.save_step(
            info.id,
            history=history,
            environment=environment,
            events=deltas("run-a", 0, 1),
            fence=stale.fence,
            lease_run=stale.run_id,
        )
        await new.delete(info.id)
        await new.create(session_id="again")
        current = await new.claim("again", run_id="run-b", holder="p2", ttl=HOUR)
        assert current.fence == stale.fence  # the reason a fence alone cannot tell them apart
        await save(new, "again", deltas("run-b", 0, 1), current.fence)
        before = await snapshot(new, "again")
        add_step(history, environment, 1)
        with pytest.raises(LeaseLostError, match=r"fence 1 of run 'run-a' .*run 'run-b' holds"):
            await old.save_step(
                "again",
                history=history,
                environment=environment,
                events=deltas("run-a", 1, 1),
                fence=stale.fence,
                lease_run=stale.run_id,
            )
        with pytest.raises(LeaseLostError):
            await old.save_checkpoints(
                "again",
                [Checkpoint("run-a", 0, "m", "{}")],
                fence=stale.fence,
                lease_run=stale.run_id,
            )
        with pytest.raises(LeaseLostError):
            await old.renew(stale, ttl=HOUR)
        assert await snapshot(new, "again") == before
        # The new run's own writes, naming it, go on.
        await new.save_checkpoints(
            "again",
            [Checkpoint("run-b", 0, "m", "{}")],
            fence=current.fence,
            lease_run=current.run_id,
        )
        assert [c.run_id for c in await new.checkpoints("again", "run-b")] == ["run-b"]


async def test_a_stale_writer_that_also_missed_other_writes_is_refused_not_retried(
    backing: Backing,
) -> None:
    """Its store's view of the session is stale too: the fence is checked before any retry."""
    async with backing.open() as old, backing.open() as new:
        info = await old.create()
        stale = await old.claim(info.id, run_id="run-a", holder="p1", ttl=0)
        history, environment = fresh()
        add_step(history, environment, 0)
        await old.save_step(info.id, history=history, environment=environment, fence=stale.fence)
        current = await new.claim(info.id, run_id="run-b", holder="p2", ttl=HOUR)
        await save(new, info.id, deltas("run-b", 0, 2), current.fence)
        backend = old._backend  # type: ignore[attr-defined]
        real_write = backend.write_step
        attempts: list[object] = []

        async def counted(write: typing.Any) -> typing.Any:
            attempts.append(write)
            return await real_write(write)

        backend.write_step = counted
        before = await snapshot(new, info.id)
        add_step(history, environment, 1)
        with pytest.raises(LeaseLostError):
            await old.save_step(
                info.id,
                history=history,
                environment=environment,
                events=deltas("run-a", 0, 1),
                fence=stale.fence,
            )
        assert len(attempts) == 1
        assert await snapshot(new, info.id) == before


# -- migration ---------------------------------------------------------------------------------


async def test_a_store_of_the_previous_schema_keeps_its_event_positions_as_ids(
    backing: Backing,
) -> None:
    previous = await make_previous_version(backing, "old", events=3)
    async with backing.open() as store:
        old = await store.info("old")
        assert (old.last_event_id, old.lease_run, old.lease_fence) == (2, None, 0)
        pairs = await store.events_with_ids("old")
        assert pairs == list(enumerate(old_events(3)))
        assert await store.events_with_ids("old", after_id=0) == pairs[1:]
        lease = await store.claim("old", run_id="run-a", holder="h", ttl=HOUR)
        assert lease.fence == 1
        await save(store, "old", deltas("run-a", 0, 1), lease.fence)
        assert [n for n, _ in await store.events_with_ids("old", after_id=2)] == [event_id(1, 0)]
    assert await stored_version(backing) == previous + 1
