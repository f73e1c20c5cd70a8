"""A real agent run killed with SIGKILL mid-run loses only the step in flight, and resumes.

The child process (this file run as a script) runs an agent with a SQLite store: a first
step notes a fact, then the run blocks forever inside the second step, either in a tool
(``tool`` mode) or in the model call (``model`` mode), after printing a marker. The test
kills it there, reopens the store, checks that the first step is there whole and the second
is not, and continues the session with `AgentExecutor.resume` + `send` to completion.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

import pytest

from agent_flow.agent import AgentExecutor, StopReason
from agent_flow.config import AgentConfig, ContextConfig
from agent_flow.history import ToolCallEntry, ToolResultEntry
from agent_flow.llm.base import LLMRequest
from agent_flow.sessions import SQLiteSessionStore
from agent_flow.testing import Reply, ScriptedLLM, call, reply
from agent_flow.tools import ToolContext, ToolExecutor, tool

MARKER = "BLOCKED-IN-STEP-2"
SESSION = "killed-run"


REPO = Path(__file__).resolve().parent.parent


def child_tools() -> ToolExecutor:
    @tool
    async def note(fact: str, context: ToolContext) -> str:
        """Remember a fact.

        Args:
            fact: The fact.
        """
        assert context.environment is not None
        context.environment.set("/knowledge/discovered_facts/-", fact)
        return f"noted: {fact}"

    @tool
    async def wait_forever(reason: str) -> str:
        """Block until killed.

        Args:
            reason: Why.
        """
        print(MARKER, flush=True)
        await asyncio.Event().wait()
        return "never"

    return ToolExecutor([note, wait_forever])


def config() -> AgentConfig:
    return AgentConfig(context=ContextConfig(max_tokens=8000, counter="approx"))


async def child(db: str, mode: str) -> None:
    """The child process: a run that blocks in its second step."""

    async def hang(request: LLMRequest) -> Reply:
        print(MARKER, flush=True)
        await asyncio.Event().wait()
        return "never"

    second = (
        hang
        if mode == "model"
        else reply(
            "Checking.",
            tool_calls=[call("note", fact="water is wet"), call("wait_forever", reason="test")],
        )
    )
    llm = ScriptedLLM([reply("Noting.", tool_calls=[call("note", fact="the sky is blue")]), second])
    async with SQLiteSessionStore(db) as store:
        await store.create(session_id=SESSION, agent="killed", title="learn facts")
        agent = AgentExecutor(
            llm, config=config(), tools=child_tools(), store=store, session_id=SESSION
        )
        await agent.run("learn facts")


@pytest.mark.parametrize("mode", ["tool", "model"])
async def test_a_run_killed_mid_step_keeps_every_completed_step_and_resumes(
    mode: str, tmp_path: Path
) -> None:
    db = str(tmp_path / "sessions.db")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        __file__,
        db,
        mode,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
    )
    assert process.stdout is not None
    async with asyncio.timeout(60):
        line = await process.stdout.readline()
        if line.decode().strip() != MARKER:
            _, err = await process.communicate()
            raise AssertionError(f"the child did not block: {line!r} {err.decode()}")
        process.send_signal(signal.SIGKILL)
        await process.wait()
    assert process.returncode == -signal.SIGKILL

    async with SQLiteSessionStore(db) as store:
        state = await store.load(SESSION)
        events = await store.events(SESSION)
        # The first step is there whole; nothing of the step in flight is.
        assert state.info.status == "active" and state.info.steps == 1
        assert [e.kind for e in state.entries] == [
            "user_message",
            "agent_message",
            "tool_call",
            "tool_result",
        ]
        calls = {e.call_id for e in state.entries if isinstance(e, ToolCallEntry)}
        results = {e.call_id for e in state.entries if isinstance(e, ToolResultEntry)}
        assert calls == results
        environment = state.environment
        assert environment is not None
        assert environment.knowledge.discovered_facts == ["the sky is blue"]
        assert environment.version == state.info.environment_version
        kinds = [event.kind for event in events]
        assert kinds[0] == "run_started" and "tool_call_completed" in kinds
        assert "iteration_started" in kinds and kinds.count("iteration_started") == 1
        assert [event.seq for event in events] == list(range(len(events)))

        llm = ScriptedLLM(
            [
                reply(tool_calls=[call("note", fact="resumed after a kill")]),
                reply(tool_calls=[call("task_completion", summary="two facts noted")]),
            ]
        )
        agent = await AgentExecutor.resume(
            store, SESSION, llm, config=config(), tools=child_tools()
        )
        outcome = await agent.send("go on")
        llm.assert_all_consumed()

        assert outcome.stop_reason is StopReason.COMPLETED
        sent = [(m.role, m.content) for m in llm.requests[0].messages[1:]]
        assert sent == [
            ("user", "learn facts"),
            ("assistant", "Noting."),
            ("tool", "noted: the sky is blue"),
            ("user", "go on"),
        ]
        final = await store.load(SESSION)
        assert final.info.status == "completed"
        assert final.environment is not None
        assert final.environment.knowledge.discovered_facts == [
            "the sky is blue",
            "resumed after a kill",
        ]


if __name__ == "__main__":
    asyncio.run(child(sys.argv[1], sys.argv[2]))
