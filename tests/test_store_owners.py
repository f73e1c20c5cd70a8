"""Session owners, on every store (memory, SQLite, PostgreSQL).

Part of the store conformance suite (see tests/test_store_conformance.py): `SessionInfo.owner`
travels with the session through every read, an export and an import; `list(owner=...)` gives
exactly that owner's sessions; a store from before owners gains them on open.
"""

from __future__ import annotations

import asyncio
import io
import json
import uuid
from datetime import datetime

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent_flow.environment import Environment
from agent_flow.errors import UserError
from agent_flow.history import History
from agent_flow.sessions import InMemorySessionStore, SessionStore
from agent_flow.tokens import ApproxCounter
from tests.store_helpers.backing import Backing
from tests.store_helpers.fixtures import any_backing, backing, kind, store
from tests.store_helpers.old_schema import make_previous_version, stored_version
from tests.store_helpers.session_writer import add_step

__all__ = ["any_backing", "backing", "kind", "store"]  # fixtures

COUNTER = ApproxCounter()


def fresh() -> tuple[History, Environment]:
    return History(counter=COUNTER), Environment(max_changes=5)


# -- owners -----------------------------------------------------------------------------------


async def test_the_owner_travels_with_the_session_through_every_read_and_an_export(
    store: SessionStore,
) -> None:
    history, environment = fresh()
    info = await store.create(session_id="mine", owner="alice")
    assert info.owner == "alice"
    assert (await store.info("mine")).owner == "alice"
    assert (await store.load("mine")).info.owner == "alice"
    assert [s.owner for s in await store.list()] == ["alice"]
    add_step(history, environment, 0)
    saved = await store.save_step("mine", history=history, environment=environment)
    assert saved.owner == "alice" == (await store.info("mine")).owner
    assert (await store.create(session_id="unowned")).owner is None
    stream = io.StringIO()
    await store.export("mine", stream)
    exported = stream.getvalue()
    assert json.loads(exported.splitlines()[0])["session"]["owner"] == "alice"
    async with InMemorySessionStore() as other:
        assert (await other.import_(io.StringIO(exported))).owner == "alice"
        assert (await other.info("mine")).owner == "alice"
    assert (await store.import_(io.StringIO(exported), session_id="copy")).owner == "alice"
    assert (await store.info("copy")).owner == "alice"
    # An export written before owners existed has no owner field: it imports without one.
    lines = exported.splitlines()
    header = json.loads(lines[0])
    del header["session"]["owner"]
    older = "\n".join([json.dumps(header), *lines[1:]])
    assert (await store.import_(io.StringIO(older), session_id="older")).owner is None
    with pytest.raises(UserError, match="owner"):
        await store.create(owner="x" * 201)


async def test_listing_by_owner_leaves_out_other_owners_and_sessions_without_one(
    store: SessionStore,
) -> None:
    for sid, owner in (("a1", "alice"), ("b1", "bob"), ("n1", None), ("a2", "alice")):
        await store.create(session_id=sid, owner=owner)
    assert [s.id for s in await store.list(owner="alice")] == ["a2", "a1"]
    assert [s.id for s in await store.list(owner="alice", limit=1)] == ["a2"]
    assert [s.id for s in await store.list(owner="bob")] == ["b1"]
    assert await store.list(owner="carol") == []
    assert await store.list(owner="Alice") == []  # exact match
    assert await store.list(owner="") == []  # not "no owner"
    assert {s.id for s in await store.list()} == {"a1", "a2", "b1", "n1"}
    with pytest.raises(UserError, match="limit=0"):
        await store.list(limit=0, owner="alice")


#: Owner names that differ only slightly, and None; each example prefixes them with its own token.
_OWNER_NAMES = st.sampled_from([None, "alice", "Alice", "alice ", "al", "al%", "ünï", "bob"])


# Each example uses its own owner names and session ids, so sharing the backing is safe.
@settings(max_examples=15, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    owners=st.lists(_OWNER_NAMES, min_size=1, max_size=8),
    touches=st.lists(st.integers(0, 7), max_size=6),
    limit=st.integers(1, 9),
)
def test_listing_by_owner_gives_exactly_their_sessions_most_recently_updated_first(
    any_backing: Backing, owners: list[str | None], touches: list[int], limit: int
) -> None:
    token = uuid.uuid4().hex[:8]

    def owner_of(name: str | None) -> str | None:
        return None if name is None else f"{token}:{name}"

    async def scenario() -> None:
        async with any_backing.open() as store:
            updated: dict[str, tuple[str | None, datetime]] = {}
            for number, name in enumerate(owners):
                info = await store.create(session_id=f"{token}-{number}", owner=owner_of(name))
                updated[info.id] = (info.owner, info.updated_at)
            for touch in touches:
                sid = f"{token}-{touch % len(owners)}"
                history, environment = fresh()
                add_step(history, environment, touch)
                info = await store.save_step(sid, history=history, environment=environment)
                updated[sid] = (info.owner, info.updated_at)

            def expected(owner: str | None) -> list[str]:
                mine = [sid for sid, (o, _) in updated.items() if owner is None or o == owner]
                # Most recently updated first; the id breaks ties, as the stores do.
                mine.sort()
                mine.sort(key=lambda sid: updated[sid][1], reverse=True)
                return mine

            for name in {*owners, "nobody"} - {None}:
                owner = owner_of(name)
                listed = await store.list(owner=owner, limit=limit)
                assert [s.id for s in listed] == expected(owner)[:limit]
                assert all(s.owner == owner for s in listed)
            everything = [s.id for s in await store.list(limit=10_000) if s.id in updated]
            assert everything == expected(None)

    asyncio.run(scenario())


#: Schema versions from the one before owners to the current one (owners, then leases).
_VERSIONS_SINCE_OWNERS = 2


async def test_a_store_from_before_owners_gains_them_and_keeps_its_sessions(
    backing: Backing,
) -> None:
    # The store as it was before owners (the later migrations run too).
    previous = await make_previous_version(backing, "old", back=_VERSIONS_SINCE_OWNERS)
    async with backing.open() as store:
        old = await store.info("old")
        assert (old.owner, old.task, old.status) == (None, "an old task", "completed")
        assert [s.id for s in await store.list()] == ["old"]
        assert await store.list(owner="alice") == []
        await store.create(session_id="new", owner="alice")
        assert [s.id for s in await store.list(owner="alice")] == ["new"]
        assert {s.id: s.owner for s in await store.list()} == {"old": None, "new": "alice"}
        # The old session goes on working, still without an owner.
        history, environment = fresh()
        add_step(history, environment, 0)
        saved = await store.save_step("old", history=history, environment=environment)
        assert (saved.steps, saved.owner) == (1, None)
        assert [s.id for s in await store.list()] == ["old", "new"]
    assert await stored_version(backing) == previous + _VERSIONS_SINCE_OWNERS
    async with backing.open() as again:  # reopening migrates nothing more
        assert (await again.info("new")).owner == "alice"
