"""Per-turn overhead of tracing: off, OpenTelemetry API only (no SDK), SDK with in-memory export.

The same agent loop, in one process: an `AgentExecutor` on an in-process scripted model that
calls ``add`` K times and then answers (no network, so the loop's own cost is all there is and
any overhead shows at its largest), tiktoken budgeting on. Three configurations:

- off: no instrumentation;
- api: ``instrument(agent)`` with no SDK configured: OpenTelemetry's no-op tracer and meter
  (what an application pays that has the API installed and exports nothing);
- sdk: ``instrument(agent)`` with an SDK `TracerProvider` (simple processor, in-memory
  exporter) and `MeterProvider` (in-memory reader): every span and point recorded.

Rounds interleave the configurations (off, api, sdk, off, ...) so that machine load affects
them alike; the median run of each is reported, per model turn.

With ``--latency-ms`` the model waits that long before each streamed chunk (a turn streams a
few chunks): overhead measured against a loop that also waits on a model, as real ones do.

Usage: python benchmarks/bench_telemetry.py [--runs 30] [--k 20] [--latency-ms 0]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from agent_flow import AgentExecutor
from agent_flow.config import AgentConfig, ContextConfig
from agent_flow.llm.base import LLMRequest, Usage
from agent_flow.telemetry import instrument
from agent_flow.testing import FunctionLLM, ScriptedReply, call, reply
from tests.helpers import add

USAGE = Usage(prompt_tokens=1000, completion_tokens=50)


def make_agent(k: int, latency: float = 0.0) -> AgentExecutor:
    turns = 0

    def answer(request: LLMRequest) -> ScriptedReply:
        nonlocal turns
        turns += 1
        if turns > k:
            return reply("done", usage=USAGE)
        return reply(tool_calls=[call("add", a=turns, b=1)], usage=USAGE)

    agent = AgentExecutor(
        FunctionLLM(answer, model="gpt-4o-mini", delay=latency),
        config=AgentConfig(context=ContextConfig(max_tokens=32_000), max_iterations=k + 5),
    )
    agent.tools.register(add)
    return agent


def setups() -> dict[str, Callable[[AgentExecutor], None]]:
    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    meter_provider = MeterProvider(metric_readers=[InMemoryMetricReader()])

    def sdk(agent: AgentExecutor) -> None:
        instrument(agent, tracer_provider=tracer_provider, meter_provider=meter_provider)
        exporter.clear()

    return {"off": lambda agent: None, "api": lambda agent: instrument(agent), "sdk": sdk}


async def one_run(k: int, setup: Callable[[AgentExecutor], None], latency: float = 0.0) -> float:
    agent = make_agent(k, latency)
    setup(agent)
    started = time.perf_counter()
    outcome = await agent.run("add numbers")
    elapsed = time.perf_counter() - started
    assert outcome.iterations == k + 1, outcome.stop_reason
    return elapsed / outcome.iterations


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--runs", type=int, default=30, help="runs per configuration")
    parser.add_argument("--k", type=int, default=20, help="tool turns per run")
    parser.add_argument(
        "--latency-ms",
        type=float,
        default=0.0,
        help="the model's simulated latency per streamed chunk (0: answers at once)",
    )
    args = parser.parse_args()
    configs = setups()
    for setup in configs.values():  # warm up: imports, price data, tokenizer
        await one_run(2, setup)
    times: dict[str, list[float]] = {name: [] for name in configs}
    for _ in range(args.runs):
        for name, setup in configs.items():
            times[name].append(await one_run(args.k, setup, args.latency_ms / 1000))
    base = statistics.median(times["off"])
    print(
        f"per model turn, median of {args.runs} runs of {args.k + 1} turns, model latency "
        f"{args.latency_ms:g} ms per chunk (lower is better)"
    )
    for name, values in times.items():
        median = statistics.median(values)
        print(f"  {name:>3}: {median * 1e3:7.3f} ms  ({(median / base - 1) * 100:+5.1f}% vs off)")


if __name__ == "__main__":
    asyncio.run(main())
