"""Saves steps of one stored session in a loop, forever, printing a line after each commit.

Usage: ``python session_writer.py DB_PATH SESSION_ID [HANG_AT_STEP]``. The SIGKILL test kills
it at an arbitrary moment and checks that the store holds every step this program reported.
With HANG_AT_STEP, the save of that step (counted from 0 over the session's life) stops inside
its transaction, after every row of the step is written and before the commit, and prints
``inside``: killing it then must lose exactly that step.

Each step adds a user message and an assistant turn with one answered tool call, makes two
environment changes and publishes two events; every fifth step also prunes the history, so
a kill may also land in a save that rewrites entries.
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading

from agent_flow.environment import Environment
from agent_flow.events import AgentEvent, TextDelta, ToolCallCompleted
from agent_flow.history import (
    AgentMessage,
    DropOldest,
    History,
    ToolCallEntry,
    ToolResultEntry,
    UserMessage,
)
from agent_flow.messages import ToolCall
from agent_flow.sessions import SQLiteSessionStore
from agent_flow.tokens import ApproxCounter

#: The environment's change log is kept short so that saving trims it.
MAX_CHANGES = 8


def add_step(history: History, environment: Environment, step: int) -> list[AgentEvent]:
    """Add step `step` to the history and environment; return its events."""
    call_id = f"call-{step}"
    history.add(UserMessage(content=f"step {step}"))
    history.add(AgentMessage(content=f"working on step {step}"))
    history.add(
        ToolCallEntry(call=ToolCall(id=call_id, name="probe", arguments=json.dumps({"step": step})))
    )
    history.add(ToolResultEntry(call_id=call_id, tool_name="probe", content=f"probed {step} " * 20))
    environment.set("/extensions/progress", {"step": step})
    environment.set("/knowledge/discovered_facts/-", f"fact {step}")
    run_id = f"run-{step}"
    return [
        TextDelta(run_id=run_id, seq=0, text=f"working on step {step}"),
        ToolCallCompleted(
            run_id=run_id, seq=1, call_id=call_id, name="probe", content="ok", duration_ms=1.0
        ),
    ]


class _Hang:
    """A trace callback that blocks the store's worker inside the transaction of one step."""

    def __init__(self, step: int | None) -> None:
        self.step = step
        self.current = -1

    def __call__(self, statement: str) -> None:
        # The session row is updated last, just before COMMIT.
        if self.current == self.step and statement.startswith("UPDATE sessions"):
            print("inside", flush=True)
            threading.Event().wait()


async def main(path: str, session_id: str, hang_at: int | None) -> None:
    hang = _Hang(hang_at)
    async with SQLiteSessionStore(path, trace=hang) as store:
        state = await store.load(session_id)
        history = state.history(counter=ApproxCounter())
        environment = state.environment or Environment(max_changes=MAX_CHANGES)
        step = state.info.steps
        while True:
            events = add_step(history, environment, step)
            if step % 5 == 4:
                history.prune(DropOldest(), history.token_count() // 2)
            hang.current = step
            info = await store.save_step(
                session_id, history=history, environment=environment, events=events
            )
            print(f"saved {info.steps}", flush=True)
            step += 1


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else None))
