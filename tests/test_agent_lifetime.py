"""An agent and everything a run made are freed when the last reference goes, not by the GC.

An agent's parts call back into it (its tool hooks publish its events, its MCP servers ask
for its run id, its recorder cancels it when the lease is lost). Held strongly, those calls
make the agent a reference cycle: every agent dropped, with its history, environment and
everything its runs built, waits for the cycle collector, which keeps the memory of a fleet
of sessions in flight and costs a full collection over the whole heap now and then. These
tests run agents over the real `openai` SDK against the scripted HTTP server, with tools
that succeed, fail, are unknown or get bad arguments, a subscriber, and a SQLite store, and
assert that the run leaves no cyclic garbage behind and that the agent is gone once dropped.
"""

from __future__ import annotations

import gc
import json
import logging
import types
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent_flow.agent import AgentExecutor, StopReason
from agent_flow.config import AgentConfig, ContextConfig
from agent_flow.llm import OpenAIClient
from agent_flow.sessions import SQLiteSessionStore
from agent_flow.tools import tool
from tests.helpers import add
from tests.openai_server import OpenAIServer, completion_body, json_reply


@tool
async def explode(reason: str) -> str:
    """Fail on purpose.

    Args:
        reason: Why.
    """
    raise RuntimeError(f"exploded: {reason}")


# One tool call of a step: (name, arguments text).
_CALLS = {
    "ok": ("add", json.dumps({"a": 1, "b": 2})),
    "raises": ("explode", json.dumps({"reason": "test"})),
    "unknown": ("no_such_tool", "{}"),
    "bad arguments": ("add", json.dumps({"a": "one"})),
    "not json": ("add", "{not json"),
}


def _ours(item: object) -> bool:
    """Whether `item` is an agent_flow object, function, bound method or closure cell.

    Only these are asserted on: the rest of the cyclic garbage is other libraries' (on
    Python 3.11 every closed asyncio socket transport is a cycle: it keeps a bound method
    of itself as its read callback).
    """
    if isinstance(item, types.MethodType):
        item = item.__func__
    if isinstance(item, types.CellType):
        try:
            item = item.cell_contents
        except ValueError:
            return False
    module = getattr(item, "__module__", None) if callable(item) else type(item).__module__
    return isinstance(module, str) and module.split(".")[0] == "agent_flow"


@contextmanager
def _saving_cyclic_garbage() -> Iterator[list[object]]:
    """Collect first, then keep the agent_flow objects the cycle collector would free."""
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)
    found: list[object] = []
    try:
        yield found
        gc.collect()
        found.extend(item for item in gc.garbage if _ours(item))
    finally:
        gc.set_debug(0)
        gc.garbage.clear()


def _agent(server: OpenAIServer, store: SQLiteSessionStore | None) -> AgentExecutor:
    llm = OpenAIClient("test-model", base_url=server.base_url, api_key="k", timeout=5)
    config = AgentConfig(context=ContextConfig(max_tokens=8000))
    agent = AgentExecutor(llm, config=config, store=store)
    agent.tools.register(add)
    agent.tools.register(explode)
    return agent


def _script(server: OpenAIServer, steps: list[list[str]]) -> None:
    replies = []
    for number, step in enumerate(steps):
        calls = [(f"c{number}_{i}", *_CALLS[kind]) for i, kind in enumerate(step)]
        replies.append(json_reply(completion_body(tool_calls=calls, finish_reason="tool_calls")))
    replies.append(json_reply(completion_body("done")))
    server.script(*replies)


async def _run_and_drop(
    server: OpenAIServer, steps: list[list[str]], store: SQLiteSessionStore | None
) -> tuple[weakref.ref[AgentExecutor], list[object], str | None]:
    """Run an agent through `steps` and drop it: its weak reference, the cyclic garbage and
    the id of the session it saved (None without a store)."""
    _script(server, steps)
    # A failing tool is logged with its traceback, whose frames hold the agent; pytest keeps
    # the records it captures (a handler that keeps records keeps what they reference).
    logging.disable(logging.WARNING)
    try:
        with _saving_cyclic_garbage() as garbage:
            agent = _agent(server, store)
            subscription = agent.subscribe()
            async with agent:
                outcome = await agent.run("go")
            seen = [event async for event in subscription]
            assert outcome.stop_reason is StopReason.ANSWERED, outcome
            assert seen, "the subscriber saw the run"
            await agent.llm.aclose()  # type: ignore[attr-defined]
            gone, session_id = weakref.ref(agent), agent.session_id
            del agent, subscription, outcome, seen
    finally:
        logging.disable(logging.NOTSET)
    return gone, garbage, session_id


async def _warm_up() -> None:
    """One run first: imports and lazy caches made on first use are not the run's garbage."""
    async with OpenAIServer() as server:
        await _run_and_drop(server, [["ok"]], None)


def _described(garbage: list[object]) -> list[str]:
    return sorted({type(item).__qualname__ for item in garbage})


async def test_a_finished_agent_is_freed_without_the_cycle_collector(tmp_path: Path) -> None:
    await _warm_up()
    store = SQLiteSessionStore(tmp_path / "sessions.db")
    async with OpenAIServer() as server:
        steps = [["ok"], ["raises", "ok"], ["unknown"]]
        gone, garbage, session_id = await _run_and_drop(server, steps, store)
    assert garbage == [], f"the run left cyclic garbage: {_described(garbage)}"
    assert gone() is None, "something outside the agent still holds it"
    # The session the dropped agent saved is intact.
    assert session_id is not None
    stored = await store.load(session_id)
    assert [entry.kind for entry in stored.entries].count("tool_result") == 4


@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    steps=st.lists(
        st.lists(st.sampled_from(sorted(_CALLS)), min_size=1, max_size=3), min_size=0, max_size=4
    ),
    stored=st.booleans(),
)
async def test_no_run_leaves_cyclic_garbage(
    tmp_path: Path, steps: list[list[str]], stored: bool
) -> None:
    store = SQLiteSessionStore(tmp_path / f"{len(steps)}-{stored}.db") if stored else None
    async with OpenAIServer() as server:
        gone, garbage, _ = await _run_and_drop(server, steps, store)
    assert garbage == [], f"{steps}: the run left cyclic garbage: {_described(garbage)}"
    assert gone() is None
