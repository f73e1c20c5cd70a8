"""A durable worker process for the tests: a counting tool and a model that calls it.

``python -m tests.durable_app STORE_URL SYSTEM_DB_URL COUNTS_DIR EXECUTOR_ID [KILL_AT]``

Each run's message is ``count N``: the model calls ``count`` N times (one call per turn),
then answers ``done``. Every execution of the tool appends one line to
``COUNTS_DIR/<run's session>.txt`` (the side-effect counter). With ``KILL_AT``, the process
SIGKILLs itself at its KILL_AT-th model call: a crash at a random point between steps.
``DURABLE_APP_PAUSE`` (seconds) makes each tool call take that long, so runs stay in flight.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from pathlib import Path

from agent_flow.config import AgentConfig
from agent_flow.durable import DurableConfig, DurableWorker
from agent_flow.errors import StoreError
from agent_flow.llm.base import LLMRequest
from agent_flow.sessions import open_store
from agent_flow.sessions.protocol import SessionStore
from agent_flow.testing import FunctionLLM, Reply, call, reply
from agent_flow.tools import ToolContext, ToolExecutor, ToolPolicy, tool

CONFIG = AgentConfig(control_tools=False, max_iterations=50)


def model_and_tools(
    counts: Path, kill_at: int | None, *, pause: float = 0.0
) -> tuple[FunctionLLM, ToolExecutor]:
    """The scripted model and the counting tool; each call sleeps `pause` seconds first."""
    calls = 0

    def play(request: LLMRequest) -> Reply:
        nonlocal calls
        calls += 1
        if kill_at is not None and calls == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        users = [i for i, m in enumerate(request.messages) if m.role == "user"]
        wanted = int(str(request.messages[users[-1]].content).split()[-1])
        done = sum(1 for m in request.messages[users[-1] :] if m.role == "tool")
        if done < wanted:
            return reply(tool_calls=[call("count", n=done + 1)])
        return reply("done")

    @tool(policy=ToolPolicy(idempotent=False))
    def count(n: int, context: ToolContext) -> str:
        """Count one side effect."""
        time.sleep(pause)
        with (counts / f"{context.run_id}.txt").open("a") as file:
            file.write(f"{n}\n")
        return f"counted {n}"

    return FunctionLLM(play), ToolExecutor([count])


async def _opened(store_url: str) -> SessionStore:
    """The store, opened; a worker started on a loaded machine may find the database slow to
    answer its first connection (10 s), so it tries three times, as a supervisor would."""
    for attempt in (1, 2, 3):
        store = open_store(store_url)
        try:
            await store.__aenter__()
        except StoreError:
            if attempt == 3:
                raise
            await asyncio.sleep(1.0)
            continue
        return store
    raise AssertionError("unreachable")


async def main(store_url: str, system_url: str, counts: str, executor: str, kill: str) -> None:
    pause = float(os.environ.get("DURABLE_APP_PAUSE", "0"))
    llm, tools = model_and_tools(Path(counts), int(kill) if kill else None, pause=pause)
    durable = DurableConfig(
        enabled=True, system_database_url=system_url, executor_id=executor, poll_seconds=0.1
    )
    store = await _opened(store_url)
    try:
        async with DurableWorker(
            durable,
            store,
            CONFIG,
            llm_factory=lambda _config: (llm, None),
            tools_factory=lambda _config: tools,
        ) as worker:
            print("ready", flush=True)
            await worker.serve_forever()
    finally:
        await store.aclose()


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:5], sys.argv[5] if len(sys.argv) > 5 else ""))
