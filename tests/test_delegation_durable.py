"""Delegation in a durable run: the child is one checkpointed tool call, never run again once done.

As in `tests/test_durable_steps.py`, one durable run is executed once to count its writes,
then, for every write W, an attempt "crashes" at W and a second attempt recovers the run from
what the store holds. The parent delegates twice (one child per turn); each child's model
counts its runs. Every time: the run finishes once with both children's findings, and a child
whose result was recorded is not run again (an interrupted one is not either: the delegate is
not idempotent, so it gets an "interrupted" result instead).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agent_flow._checkpoints import StepRecordError
from agent_flow.config import AgentConfig, ContextConfig
from agent_flow.delegation import Delegate
from agent_flow.durable._workflow import RunRequest, Runtime, _execute
from agent_flow.errors import StoreError
from agent_flow.llm.base import LLMRequest
from agent_flow.testing import FunctionLLM, Reply, call, reply
from agent_flow.tools import ToolExecutor
from tests.test_durable_steps import CrashingStore

CONFIG = AgentConfig(control_tools=False, max_iterations=10)


def parent_play(request: LLMRequest) -> Reply:
    done = sum(1 for m in request.messages if m.role == "tool")
    if done < 2:
        return reply(tool_calls=[call("investigate", task=f"question {done + 1}")])
    return reply("done")


async def attempt(store: CrashingStore, runs: list[str], request: RunRequest) -> Any:
    """One execution of `request`; each child run appends its task to `runs`."""

    def child_play(child_request: LLMRequest) -> Reply:
        task = str(child_request.messages[-1].content)
        runs.append(task)
        return reply(f"answer to {task}")

    delegate = Delegate(
        "investigate",
        "Investigate.",
        llm=FunctionLLM(child_play, model="child"),
        budget=ContextConfig(max_tokens=3000, counter="approx"),
    )
    runtime = Runtime(
        store=store,
        config=CONFIG,
        llm_factory=lambda _config: (FunctionLLM(parent_play, model="parent"), None),
        tools_factory=lambda _config: ToolExecutor([delegate]),
        cancel_check_seconds=3600,
    )
    try:
        return await _execute(runtime, request)
    except StepRecordError as err:
        if not isinstance(err.__cause__, StoreError):
            raise
        return None


async def test_a_finished_child_is_never_run_again_after_a_crash_at_any_write(
    tmp_path: Path,
) -> None:
    store = CrashingStore()
    info = await store.create(agent="durable")
    runs: list[str] = []
    outcome = await attempt(store, runs, RunRequest(session_id=info.id, message="go", run_id="r"))
    assert outcome is not None and outcome.final_text == "done"
    assert runs == ["question 1", "question 2"]
    total = store.writes
    for crash_at in range(1, total + 1):
        store = CrashingStore()
        info = await store.create(agent="durable")
        request = RunRequest(session_id=info.id, message="go", run_id=f"r{crash_at}")
        runs = []
        store.crash_at = crash_at
        await attempt(store, runs, request)
        store.crash_at = None
        outcome = await attempt(store, runs, request)
        assert outcome is not None and outcome.final_text == "done", crash_at
        assert len(outcome.tool_uses) == 2
        for n, use in enumerate(outcome.tool_uses, start=1):
            assert runs.count(f"question {n}") <= 1, (crash_at, runs)
            if use.error_kind != "interrupted":
                assert use.content == f"answer to question {n}", crash_at
                assert runs.count(f"question {n}") == 1, (crash_at, runs)
        events = await store.events(info.id, run_id=request.run_id)
        assert [e.seq for e in events] == list(range(len(events))), crash_at
        assert [e.kind for e in events].count("run_finished") == 1, crash_at
