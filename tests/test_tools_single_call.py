"""A turn's only tool call: in the run's own task when no async code of the tool's runs.

A task of its own costs a turn of the event loop, so a sync function tool's only call (its
function runs on a tool thread either way) runs in the caller's task, in a copy of its
context (`agent_flow._eager.in_own_context`). A tool with async code of its own still gets a
task: code that swallows the run's cancellation, or cancels the task it runs in, must not
change what happens to the run. Each case is checked for both kinds of tool.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading

import pytest

from agent_flow import AgentConfig, AgentExecutor, ContextConfig
from agent_flow._eager import in_own_context
from agent_flow.testing import ScriptedLLM, call, reply
from agent_flow.tools import ToolExecutor, tool

_CONFIG = AgentConfig(context=ContextConfig(max_tokens=6000, counter="approx"))
_VAR: contextvars.ContextVar[str] = contextvars.ContextVar("test_single_call", default="unset")


def _agent(*tools: object, name: str) -> AgentExecutor:
    model = ScriptedLLM([reply(tool_calls=[call(name)]), "after the tool", "again"])
    return AgentExecutor(model, config=_CONFIG, tools=ToolExecutor(list(tools)))  # type: ignore[arg-type]


async def test_cancelling_the_run_during_a_tool_that_swallows_it_still_cancels_the_run() -> None:
    entered = asyncio.Event()

    @tool
    async def swallow() -> str:
        """Catch the cancellation and return, as some libraries do."""
        entered.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            return "cleaned up"
        return "slept"

    agent = _agent(swallow, name="swallow")
    task = asyncio.create_task(agent.run("go"))
    await entered.wait()
    agent.cancel()
    outcome = await asyncio.wait_for(task, 10)
    assert outcome.stop_reason.value == "cancelled"


@pytest.mark.parametrize("kind", ["sync", "async"])
async def test_cancelling_the_run_during_its_only_tool_call_cancels_it(kind: str) -> None:
    entered = threading.Event()
    release = threading.Event()

    @tool
    def blocks() -> str:
        """Block until released."""
        entered.set()
        release.wait(10)
        return "done"

    @tool
    async def waits() -> str:
        """Wait."""
        entered.set()
        await asyncio.sleep(30)
        return "done"

    agent = _agent(
        blocks if kind == "sync" else waits, name="blocks" if kind == "sync" else "waits"
    )
    task = asyncio.create_task(agent.run("go"))
    await asyncio.to_thread(entered.wait, 10)
    agent.cancel()
    outcome = await asyncio.wait_for(task, 10)
    release.set()
    assert outcome.stop_reason.value == "cancelled"


async def test_a_tool_that_cancels_its_own_task_fails_its_call_not_the_run() -> None:
    @tool
    async def own() -> str:
        """Cancel the task this runs in (a hand-made timeout)."""
        task = asyncio.current_task()
        assert task is not None
        asyncio.get_running_loop().call_soon(task.cancel)
        await asyncio.sleep(5)
        return "never"

    outcome = await asyncio.wait_for(_agent(own, name="own").run("go"), 10)
    assert outcome.stop_reason.value == "answered" and outcome.final_text == "after the tool"
    assert outcome.tool_uses[0].is_error


@pytest.mark.parametrize("kind", ["sync", "async"])
async def test_a_context_variable_a_tool_sets_stays_its_own(kind: str) -> None:
    @tool
    def sets_sync() -> str:
        """Set the variable."""
        _VAR.set("tool")
        return _VAR.get()

    @tool
    async def sets_async() -> str:
        """Set the variable."""
        _VAR.set("tool")
        return _VAR.get()

    name = f"sets_{kind}"
    outcome = await _agent(sets_sync if kind == "sync" else sets_async, name=name).run("go")
    assert outcome.tool_uses[0].content == "tool"
    assert _VAR.get() == "unset"


async def test_in_own_context_keeps_the_variables_and_a_swallowed_cancellation() -> None:
    async def sets() -> str:
        _VAR.set("inside")
        await asyncio.sleep(0)
        return _VAR.get()

    assert await in_own_context(sets()) == "inside"
    assert _VAR.get() == "unset"

    started = asyncio.Event()

    async def swallows() -> str:
        started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            return "swallowed"
        return "slept"

    task = asyncio.create_task(in_own_context(swallows()))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert task.cancelled()
