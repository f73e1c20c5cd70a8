"""CPU a delegation costs beyond the child's own steps, against an equivalent inline tool call.

Three measurements, with scripted models (no server: the model's cost is not the question):

- inline: a parent run whose model calls a plain tool ``investigate(task)`` that returns the
  finding at once, then answers: the baseline, what the same parent turn costs without a
  child;
- child alone: the child's own run (one model step that answers with the finding) on an
  agent built beforehand: the child's own steps;
- delegated: the same parent run where ``investigate`` is a `Delegate` whose child makes
  that one step: projection of the parent's Environment, building the child agent, its run,
  its events forwarded to the parent's bus under a path, its calls admitted by and counted
  into the parent's budget, and its result.

The delegation's own cost is ``delegated - inline - child alone`` (goal: at most 1 ms of CPU
per delegation). Each is CPU time of the process (``time.process_time``) per run, the median
over rounds in which the three take turns (the machine is shared; side by side, round by
round, they see the same load).

Usage: python benchmarks/bench_delegation.py [--runs 200] [--rounds 7] [--children 1]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _bench_rounds import interleaved

from agent_flow import AgentConfig, AgentExecutor, ContextConfig, Delegate
from agent_flow.llm.base import LLMRequest
from agent_flow.testing import FunctionLLM, Reply, call, reply
from agent_flow.tools import tool

CONTEXT = ContextConfig(max_tokens=8000, counter="approx")
FINDING = "total() iterates prices[1:], so it skips the first price"


def parent_model(children: int) -> FunctionLLM:
    def play(request: LLMRequest) -> Reply:
        if request.messages[-1].role == "tool":
            return reply("fixed")
        return reply(tool_calls=[call("investigate", task=f"q{i}") for i in range(children)])

    return FunctionLLM(play, model="parent")


CHILD = FunctionLLM(lambda _request: reply(FINDING), model="child")


@tool
def investigate(task: str) -> str:
    """Investigate.

    Args:
        task: The question.
    """
    return FINDING


def parent(children: int) -> AgentExecutor:
    agent = AgentExecutor(parent_model(children), config=AgentConfig(context=CONTEXT))
    agent.environment.set("/knowledge/discovered_facts", ["a fact"] * 20)
    return agent


def inline(children: int) -> Callable[[], Awaitable[object]]:
    agent = parent(children)
    agent.tools.register(investigate)
    return lambda: agent.run("fix it")


def delegated(children: int, delegate: Delegate[object]) -> Callable[[], Awaitable[object]]:
    agent = parent(children)
    delegate.add_to(agent)
    return lambda: agent.run("fix it")


def child_alone(children: int) -> Callable[[], Awaitable[object]]:
    agents = [AgentExecutor(CHILD, config=AgentConfig(context=CONTEXT)) for _ in range(children)]

    async def run() -> None:
        for i, agent in enumerate(agents):
            await agent.run(f"q{i}")

    return run


async def timed(make: Callable[[], Callable[[], Awaitable[object]]], runs: int) -> float:
    """CPU seconds per run of `runs` runs, each on a freshly made agent (made untimed)."""
    ready = [make() for _ in range(runs)]
    start = time.process_time()
    for run in ready:
        await run()
    return (time.process_time() - start) / runs


async def main(runs: int, rounds: int, children: int) -> None:
    delegate: Delegate[object] = Delegate(
        "investigate",
        "Investigate.",
        llm=CHILD,
        projection=["/task/objective", "/knowledge/discovered_facts"],
        budget=CONTEXT,
    )
    makers: dict[str, Callable[[], Callable[[], Awaitable[object]]]] = {
        "inline": lambda: inline(children),
        "child alone": lambda: child_alone(children),
        "delegated": lambda: delegated(children, delegate),
    }
    for make in makers.values():  # warm up: imports, price data, caches
        await timed(make, 5)
    samples: dict[str, list[float]] = {name: [] for name in makers}
    for name in interleaved(list(makers), rounds):
        samples[name].append(await timed(makers[name], runs))
    median = {name: statistics.median(values) * 1000 for name, values in samples.items()}
    overhead = (median["delegated"] - median["inline"] - median["child alone"]) / children
    print(f"{runs} runs x {rounds} rounds, {children} delegation(s) per parent run")
    print(f"{'':<34}{'CPU ms per run':>16}")
    print(f"{'inline tool call (baseline)':<34}{median['inline']:>16.3f}")
    print(f"{'child run alone':<34}{median['child alone']:>16.3f}")
    print(f"{'delegated':<34}{median['delegated']:>16.3f}")
    print(f"delegation overhead per child: {overhead:.3f} ms of CPU (goal <= 1 ms)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--children", type=int, default=1)
    args = parser.parse_args()
    asyncio.run(main(args.runs, args.rounds, args.children))
