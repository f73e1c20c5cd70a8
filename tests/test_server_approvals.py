"""An approval's answer and its timeout: whatever their order, the client and the run agree.

`LiveSession.answer` returns True when an approval took the answer (the route then answers
the client with success) and False when none waits (the client gets ``not_waiting``). The run
sees, through `LiveSession.approve`, either that answer or the denial of the timeout. When
the answer and the deadline fall due in the same turn of the loop, the answer is set first and
the timeout cancels the waiting task after it: the run must still see the answer it took.

In a fleet an approval waits in the process whose run asked for it: another server refuses an
answer (``not_waiting``) naming the run and saying where it waits.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

pytest.importorskip("fastapi", reason="the server tests need the 'server' extra")

from agent_flow.config import AgentConfig, ContextConfig
from agent_flow.server import create_app
from agent_flow.server._live import LiveSession
from agent_flow.server.models import SessionOptions
from agent_flow.sessions import InMemorySessionStore, SQLiteSessionStore
from agent_flow.testing import ScriptedLLM, call, reply
from agent_flow.tools import (
    ApprovalRequest,
    ApprovalResponse,
    RiskLevel,
    ToolExecutor,
    ToolPolicy,
    tool,
)
from tests.server_harness import serving, stream

TIMEOUT = 0.05


@tool(policy=ToolPolicy(requires_approval=True, risk=RiskLevel.HIGH))
def deploy(target: str) -> str:
    """Deploy somewhere.

    Args:
        target: Where.
    """
    return f"deployed to {target}"


def _deploy_tool(config: AgentConfig) -> ToolExecutor:
    executor = ToolExecutor()
    executor.register(deploy)
    return executor


def _deploying() -> ScriptedLLM:
    return ScriptedLLM(
        [
            reply("deploying", tool_calls=[call("deploy", target="prod", call_id="c1")]),
            reply("all done"),
        ]
    )


def _live() -> LiveSession:
    return LiveSession(
        id="s", options=SessionOptions(), store=InMemorySessionStore(), approval_timeout=TIMEOUT
    )


def _request() -> ApprovalRequest:
    return ApprovalRequest(
        call_id="c1", tool_name="deploy", arguments={}, reason="risky", risk=RiskLevel.HIGH
    )


@pytest.mark.parametrize("when", ["before", "with the deadline", "after"])
async def test_the_client_is_told_the_answer_was_taken_exactly_when_the_run_sees_it(
    when: str,
) -> None:
    live, request = _live(), _request()
    waiting = asyncio.create_task(live.approve(request))
    await asyncio.sleep(0)  # it waits, its deadline TIMEOUT away
    loop = asyncio.get_running_loop()
    taken: list[bool] = []

    def answer() -> None:
        taken.append(live.answer(request.call_id, ApprovalResponse(approved=True)))

    if when == "before":
        answer()
    elif when == "with the deadline":
        # Due now, and the loop busy past the deadline: on its next turn both fall due, the
        # answer first (the earlier timer), then the timeout cancels the task it woke.
        loop.call_at(loop.time(), answer)
        time.sleep(2 * TIMEOUT)  # noqa: ASYNC251 (the loop must be busy past the deadline)
    seen = await asyncio.wait_for(waiting, 5)
    if when == "after":
        answer()
    assert taken == [when != "after"]
    assert seen.approved is taken[0]
    if not taken[0]:
        assert seen.reason == f"no answer over HTTP within {TIMEOUT:g}s"
    assert live.pending_approvals() == []


async def test_two_clients_answering_at_the_deadline_one_is_taken_and_the_run_sees_it() -> None:
    live, request = _live(), _request()
    waiting = asyncio.create_task(live.approve(request))
    await asyncio.sleep(0)
    loop = asyncio.get_running_loop()
    taken: list[tuple[bool, bool]] = []
    for approved in (False, True):  # two clients, opposite answers, in the deadline's turn
        loop.call_at(
            loop.time(),
            lambda approved=approved: taken.append(
                (approved, live.answer(request.call_id, ApprovalResponse(approved=approved)))
            ),
        )
    time.sleep(2 * TIMEOUT)  # noqa: ASYNC251 (the loop must be busy past the deadline)
    seen = await asyncio.wait_for(waiting, 5)
    assert taken == [(False, True), (True, False)]  # the first is taken, the second refused
    assert seen.approved is False and seen.reason == ""
    assert live.pending_approvals() == []


@pytest.mark.timeout(60)
async def test_an_answer_sent_to_another_server_of_the_fleet_says_where_the_approval_waits(
    tmp_path: Path,
) -> None:
    """Two servers on one store: the run asks in A; B cannot take the answer and says why."""
    path = tmp_path / "sessions.db"
    stores = SQLiteSessionStore(path), SQLiteSessionStore(path)
    a, b = (
        create_app(
            AgentConfig(context=ContextConfig(counter="approx")),
            store=store,
            llm_factory=lambda config: _deploying(),
            tools_factory=_deploy_tool,
        )
        for store in stores
    )
    async with serving(a) as at_a, serving(b) as at_b:
        sid = (await at_a.post("/sessions", json={})).json()["id"]
        async with stream(at_a, f"/sessions/{sid}/events") as events:
            sent = await at_a.post(f"/sessions/{sid}/messages", json={"message": "deploy it"})
            run_id = sent.json()["run_id"]
            await events.until("approval_required")
            elsewhere = await at_b.post(f"/sessions/{sid}/approvals/c1", json={"approved": True})
            assert elsewhere.status_code == 409, elsewhere.text
            body = elsewhere.json()
            assert body["code"] == "not_waiting" and body["run_id"] == run_id
            assert "in another process" in body["message"] and "answer there" in body["message"]
            here = await at_a.post(f"/sessions/{sid}/approvals/c1", json={"approved": True})
            assert here.status_code == 204
            done = await events.until("run_finished")
        assert done[-1].json["final_text"] == "all done"
        # With no run holding the session, a stray answer is refused plainly, on either server.
        for client in (at_a, at_b):
            late = await client.post(f"/sessions/{sid}/approvals/c1", json={"approved": True})
            assert late.status_code == 409 and late.json()["code"] == "not_waiting"
            assert "another process" not in late.json()["message"]
            assert late.json().get("run_id") is None
