"""One of two processes writing the same session: saves ROUNDS steps of its own history.

Usage: ``python -m tests.store_helpers.rival_writer STORE_URL SESSION_ID NAME ROUNDS``. Once
connected it prints ``ready`` and waits for a line on stdin (so that both rivals start
together), then prints one JSON line per committed step (``{"steps": n, "entries": [ids],
"environment": "..."}``) and, if it lost the race for the session every time it tried,
``{"conflict": NAME}`` and stops.
"""

from __future__ import annotations

import asyncio
import json
import sys

from agent_flow.environment import Environment
from agent_flow.errors import SessionConflictError
from agent_flow.history import History
from agent_flow.sessions import open_store
from agent_flow.tokens import ApproxCounter
from tests.store_helpers.session_writer import add_step


async def main(url: str, session_id: str, name: str, rounds: int) -> None:
    history, environment = History(counter=ApproxCounter()), Environment()
    async with open_store(url) as store:
        await store.info(session_id)  # connected before the start line
        print("ready", flush=True)
        sys.stdin.readline()
        for step in range(rounds):
            events = add_step(history, environment, step)
            environment.set("/extensions/writer", name)
            try:
                saved = await store.save_step(
                    session_id, history=history, environment=environment, events=events
                )
            except SessionConflictError:
                print(json.dumps({"conflict": name}), flush=True)
                return
            line = {
                "steps": saved.steps,
                "entries": [entry.id for entry in history.entries],
                "environment": environment.to_json(),
            }
            print(json.dumps(line), flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])))
