"""What the pruning lab costs per replayed step, against building the same prompts bare.

A synthetic session of ``--steps`` model turns (each a tool call whose ~300-token answer also
adds a fact to the environment) is replayed under four candidates (drop oldest, elide then
drop, sliding window, extractive summarizing) at a budget that prunes.

- lab: `run_lab` over the session: the prompts plus the environment of each step, pruning,
  prices and the retention check of every fact against every prompt.
- baseline: the same candidates' prompts built bare in the same process: a `History` grown
  turn by turn, `prune_if_needed` and `build_prompt` on the final environment, nothing else.

The difference is the lab's own bookkeeping. Numbers are per replayed step (candidates x
steps), measured in one run; on a loaded machine compare the two columns, not runs.

Usage: python benchmarks/bench_lab.py [--steps 60] [--budget 6000] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import time

from agent_flow.context import ContextManager
from agent_flow.environment import Environment
from agent_flow.history import (
    AgentMessage,
    Chain,
    DropOldest,
    ElideToolResults,
    ExtractiveSummarizer,
    History,
    HistoryEntry,
    SlidingWindow,
    SummarizeOldest,
    ToolCallEntry,
    ToolResultEntry,
    UserMessage,
)
from agent_flow.lab import Candidate, RecordedSession, RecordedStep, run_lab
from agent_flow.messages import ToolCall

RESERVE = 500


def session(steps: int) -> RecordedSession:
    entries: list[HistoryEntry] = [UserMessage(content="Trace the parser bug through the logs.")]
    environment = Environment()
    recorded: list[RecordedStep] = []
    for step in range(1, steps + 1):
        # The environment each step saw: a copy, as the lab keeps one per step.
        recorded.append(
            RecordedStep(
                index=step,
                history_length=len(entries),
                environment=Environment.from_json(environment.to_json()),
                completion_tokens=40,
            )
        )
        call_id = f"call_{step}"
        body = "\n".join(
            f"2025-03-{step % 28 + 1:02d} {h:02d}:00 worker-{h % 3} parsed {40 + h} rows"
            for h in range(20)
        )
        entries += [
            AgentMessage(content=f"Step {step}: reading log {step}."),
            ToolCallEntry(
                call=ToolCall(id=call_id, name="read_file", arguments=f'{{"n": {step}}}')
            ),
            ToolResultEntry(call_id=call_id, tool_name="read_file", content=body),
        ]
        environment.set("/knowledge/discovered_facts/-", f"log {step} parsed cleanly")
    return RecordedSession(
        id="bench", title="bench", entries=tuple(entries), steps=tuple(recorded),
        model="gpt-4o-mini", tool_tokens=300,
    )  # fmt: skip


def candidates(budget: int) -> list[Candidate]:
    strategies = {
        "drop": DropOldest(),
        "elide": Chain(ElideToolResults(), DropOldest()),
        "window": Chain(SlidingWindow(4), DropOldest()),
        "summarize": SummarizeOldest(ExtractiveSummarizer(), after=DropOldest()),
    }
    return [
        Candidate(name=name, max_tokens=budget, strategy=strategy, reserve_output_tokens=RESERVE)
        for name, strategy in strategies.items()
    ]


async def baseline(recorded: RecordedSession, candidates: list[Candidate]) -> None:
    for candidate in candidates:
        history = History(counter=candidate.make_counter())
        added = 0
        for step in recorded.steps:
            history.extend(recorded.entries[added : step.history_length])
            added = step.history_length
            assert step.environment is not None
            context = ContextManager(
                step.environment,
                history,
                candidate.max_tokens,
                reserve_output_tokens=RESERVE + recorded.tool_tokens,
                strategy=candidate.strategy,
            )
            if step.index > 1:
                await context.prune_if_needed()
            context.build_prompt()


async def measure(steps: int, budget: int, repeats: int) -> None:
    recorded = session(steps)
    chosen = candidates(budget)
    await run_lab([recorded], chosen)  # warm up: tokenizer, price data
    replayed = steps * len(chosen)
    timings: dict[str, float] = {}
    for name in ("baseline", "lab"):
        best = float("inf")
        for _ in range(repeats):
            started = time.perf_counter()
            if name == "lab":
                await run_lab([recorded], chosen)
            else:
                await baseline(recorded, chosen)
            best = min(best, time.perf_counter() - started)
        timings[name] = best
    for name, seconds in timings.items():
        print(
            f"{name:>9}: {seconds * 1000:8.1f} ms for {replayed} replayed steps = "
            f"{seconds / replayed * 1e6:7.0f} µs/step"
        )
    print(f"lab / baseline: {timings['lab'] / timings['baseline']:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--steps", type=int, default=60, help="model turns in the session")
    parser.add_argument("--budget", type=int, default=6000, help="the candidates' max_tokens")
    parser.add_argument("--quick", action="store_true", help="20 steps, one repeat")
    args = parser.parse_args()
    steps, repeats = (20, 1) if args.quick else (args.steps, 3)
    print(f"{steps} steps x 4 candidates, budget {args.budget} (best of {repeats})")
    asyncio.run(measure(steps, args.budget, repeats))


if __name__ == "__main__":
    main()
