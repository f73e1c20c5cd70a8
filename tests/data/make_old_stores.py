"""Writes the old-version session stores the migration tests upgrade (kept for the record).

Run with agent_flow as of commit fe3f868 (SQLite schema 2, PostgreSQL schema 1) on the path:
``git archive fe3f868 agent_flow | tar -x -C OLD && PYTHONPATH=OLD python make_old_stores.py
sqlite:///.../sessions_v2.db`` (or a ``postgresql://...?schema=NAME`` URL, then ``pg_dump
--schema=NAME --inserts`` with the schema name replaced by ``__SCHEMA__``: postgres_v1.sql).
Three sessions: "priced" (three priced calls, one the summarizer's), "unpriced" (its second
call has no price) and "idle" (no call).
"""

import asyncio
import sys

from agent_flow.environment import Environment
from agent_flow.events import ModelResponded, TextDelta
from agent_flow.history import AgentMessage, History, UserMessage
from agent_flow.sessions import open_store
from agent_flow.tokens import ApproxCounter


def call(run, seq, prompt, completion, cost, source="agent"):
    return ModelResponded(
        run_id=run,
        seq=seq,
        iteration=1,
        finish_reason="stop",
        prompt_tokens=prompt,
        completion_tokens=completion,
        tool_calls=0,
        duration_ms=5.0,
        source=source,
        model="gpt-4o-mini",
        cost_usd=cost,
    )


async def main(target):
    async with open_store(target) as store:
        for sid, costs in (
            ("priced", [0.0012, 0.0003, 0.1]),
            ("unpriced", [0.002, None, 0.5]),
            ("idle", []),
        ):
            await store.create(session_id=sid, task=f"task {sid}")
            history, env = History(counter=ApproxCounter()), Environment()
            for step, cost in enumerate(costs):
                history.add(UserMessage(content=f"step {step}"))
                history.add(AgentMessage(content=f"done {step}"))
                env.set("/extensions/step", step)
                run = f"run-{sid}-{step}"
                events = [
                    TextDelta(run_id=run, seq=0, text="x"),
                    call(
                        run, 1, 100 + step, 10 + step, cost, "summarizer" if step == 1 else "agent"
                    ),
                ]
                await store.save_step(
                    sid,
                    history=history,
                    environment=env,
                    events=events,
                    status="completed" if step == len(costs) - 1 else None,
                )


asyncio.run(main(sys.argv[1]))
