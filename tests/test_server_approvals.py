"""An approval's answer and its timeout: whatever their order, the client and the run agree.

`LiveSession.answer` returns True when an approval took the answer (the route then answers
the client with success) and False when none waits (the client gets ``not_waiting``). The run
sees, through `LiveSession.approve`, either that answer or the denial of the timeout. When
the answer and the deadline fall due in the same turn of the loop, the answer is set first and
the timeout cancels the waiting task after it: the run must still see the answer it took.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from agent_flow.server._live import LiveSession
from agent_flow.server.models import SessionOptions
from agent_flow.sessions import InMemorySessionStore
from agent_flow.tools import ApprovalRequest, ApprovalResponse, RiskLevel

TIMEOUT = 0.05


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
