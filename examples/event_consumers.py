"""Several consumers of one agent's event stream: a logger, a progress display, a JSON-lines file.

Each consumer has its own subscription (its own bounded queue) and runs as its own task;
none of them can stall the others. The progress display only asks for the kinds it shows
and, being cosmetic, may drop events when it falls behind (``drop_oldest``: it is then told
how many it missed); the logger and the file writer take every event (``wait``: the agent
waits for them rather than lose anything). The file is read back at the end with
``event_from_json``.

    python examples/event_consumers.py

Uses a scripted model unless OPENAI_BASE_URL or OPENAI_API_KEY is set (then OPENAI_MODEL,
default gpt-4o-mini, gets the same tools and task).
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import tempfile
from pathlib import Path

from agent_flow import (
    AgentConfig,
    AgentExecutor,
    ContextConfig,
    Subscription,
    event_from_json,
    event_to_json,
)
from agent_flow.events import (
    EventsDropped,
    IterationStarted,
    RunFinished,
    ToolCallCompleted,
    ToolCallFailed,
    ToolCallStarted,
)
from agent_flow.llm import LLMClient, OpenAIClient
from agent_flow.testing import ScriptedLLM, ScriptStep, call, reply
from agent_flow.tools import ToolExecutor, tool


@tool
def add(a: float, b: float) -> float:
    """Add two numbers.

    Args:
        a: The first.
        b: The second.
    """
    return a + b


@tool
def multiply(a: float, b: float) -> float:
    """Multiply two numbers.

    Args:
        a: The first.
        b: The second.
    """
    return a * b


SCRIPT: list[ScriptStep] = [
    reply("First the sums.", tool_calls=[call("add", a=2, b=3), call("add", a=4, b=6)]),
    reply("Now the product.", tool_calls=[call("multiply", a=5, b=10)]),
    reply(tool_calls=[call("task_completion", summary="(2+3) * (4+6) = 50", result=50)]),
]


def choose_model(script: list[ScriptStep]) -> LLMClient:
    """A real model when OPENAI_BASE_URL or OPENAI_API_KEY is set, else the scripted one."""
    if os.environ.get("OPENAI_BASE_URL") or os.environ.get("OPENAI_API_KEY"):
        return OpenAIClient(os.environ.get("OPENAI_MODEL", "gpt-4o-mini"))
    return ScriptedLLM(script)


async def log_events(events: Subscription, logger: logging.Logger) -> int:
    """Consumer 1: a log line per event (deltas at DEBUG, the rest at INFO)."""
    count = 0
    async for event in events:
        count += 1
        level = logging.DEBUG if event.kind.endswith("_delta") else logging.INFO
        logger.log(level, "#%d %s", event.seq, event.kind)
    return count


async def show_progress(events: Subscription) -> None:
    """Consumer 2: a progress line per iteration and per finished tool call."""
    running = 0
    async for event in events:
        match event:
            case IterationStarted(iteration=iteration):
                print(f"[progress] iteration {iteration}")
            case ToolCallStarted():
                running += 1
            case ToolCallCompleted(name=name) | ToolCallFailed(name=name):
                running -= 1
                print(f"[progress]   {name} done, {running} still running")
            case EventsDropped(count=count):
                print(f"[progress]   (missed {count} events)")
            case RunFinished(stop_reason=reason):
                print(f"[progress] finished: {reason}")


async def write_jsonl(events: Subscription, path: Path) -> int:
    """Consumer 3: every event as one JSON line, flushed as it comes."""
    count = 0
    with path.open("w", encoding="utf-8") as handle:
        async for event in events:
            handle.write(event_to_json(event) + "\n")
            handle.flush()
            count += 1
    return count


async def main() -> None:
    logging.basicConfig(
        stream=sys.stdout, level=logging.INFO, format="[log] %(levelname)s %(message)s"
    )
    llm = choose_model(SCRIPT)
    print(f"model: {type(llm).__name__}")
    agent = AgentExecutor(
        llm,
        config=AgentConfig(context=ContextConfig(max_tokens=8_000)),
        tools=ToolExecutor([add, multiply]),
    )
    path = Path(tempfile.mkdtemp(prefix="events-")) / "events.jsonl"
    # Subscribe before the run starts, so that no event is missed.
    logged = agent.subscribe()
    progress = agent.subscribe(
        maxsize=16,
        policy="drop_oldest",
        kinds=[
            "iteration_started",
            "tool_call_started",
            "tool_call_completed",
            "tool_call_failed",
            "run_finished",
        ],
    )
    recorded = agent.subscribe()
    async with asyncio.TaskGroup() as group:
        logger_task = group.create_task(log_events(logged, logging.getLogger("agent")))
        group.create_task(show_progress(progress))
        writer_task = group.create_task(write_jsonl(recorded, path))
        outcome = await agent.run("Compute (2+3) * (4+6) with the tools.")

    print(f"outcome: {outcome.stop_reason.value}: {outcome.final_text}")
    lines = path.read_text(encoding="utf-8").splitlines()
    replayed = [event_from_json(line) for line in lines]
    print(f"logger saw {logger_task.result()} events; the file has {writer_task.result()} lines")
    print(
        f"read back from {path.name}: {len(replayed)} events, "
        f"{replayed[0].kind} ... {replayed[-1].kind}"
    )


if __name__ == "__main__":
    asyncio.run(main())
