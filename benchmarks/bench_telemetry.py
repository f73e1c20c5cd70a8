"""Per-turn overhead of tracing: off, OpenTelemetry API only (no SDK), SDK with in-memory export.

The same agent loop, in one process: an `AgentExecutor` on an in-process scripted model that
calls ``add`` K times and then answers (no network, so the loop's own cost is all there is and
any overhead shows at its largest), tiktoken budgeting on. Three configurations:

- off: no instrumentation;
- api: ``instrument(agent)`` with no SDK configured: OpenTelemetry's no-op tracer and meter
  (what an application pays that has the API installed and exports nothing);
- sdk: ``instrument(agent)`` with an SDK `TracerProvider` (simple processor, in-memory
  exporter) and `MeterProvider` whose periodic reader collects every second into memory, as
  an application's exporting reader does (every 60 s by default): every span and point kept.

Rounds interleave the configurations (off, api, sdk, off, ...) so that machine load affects
them alike. Each configuration's median run is reported per model turn, as wall-clock time and
as the process's CPU time (steadier on a loaded machine: waiting for a core is not counted),
then its fastest run's CPU time (the least disturbed by other processes).

Then the hook alone, the overhead without the loop's noise: one recorded run's events replayed
through each configuration's event hook, CPU time per turn; for sdk also the cost of the
metric points it queued, which the SDK records when its reader collects (in the reader's
thread, off the loop), shown apart.

With ``--latency-ms`` the model waits that long before each streamed chunk (a turn streams a
few chunks): overhead measured against a loop that also waits on a model, as real ones do.

Usage: python benchmarks/bench_telemetry.py [--runs 30] [--k 20] [--latency-ms 0] [--quick]
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
from opentelemetry.sdk.metrics.export import (
    MetricExporter,
    MetricExportResult,
    MetricsData,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from agent_flow import AgentExecutor
from agent_flow.config import AgentConfig, ContextConfig
from agent_flow.events import AgentEvent
from agent_flow.llm.base import LLMRequest, Usage
from agent_flow.telemetry import _KINDS, instrument
from agent_flow.telemetry._metrics import flush_pending
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


class InMemoryMetricExporter(MetricExporter):
    """Keeps the last collection in memory (the SDK ships an in-memory span exporter only)."""

    def __init__(self) -> None:
        super().__init__()
        self.last: MetricsData | None = None

    def export(
        self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: object
    ) -> MetricExportResult:
        self.last = metrics_data
        return MetricExportResult.SUCCESS

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: object) -> None:
        return None


def setups() -> dict[str, Callable[[AgentExecutor], None]]:
    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    reader = PeriodicExportingMetricReader(InMemoryMetricExporter(), export_interval_millis=1000)
    meter_provider = MeterProvider(metric_readers=[reader])

    def sdk(agent: AgentExecutor) -> None:
        instrument(agent, tracer_provider=tracer_provider, meter_provider=meter_provider)
        exporter.clear()

    return {"off": lambda agent: None, "api": lambda agent: instrument(agent), "sdk": sdk}


async def one_run(
    k: int, setup: Callable[[AgentExecutor], None], latency: float = 0.0
) -> tuple[float, float]:
    """One run's wall-clock and CPU seconds per model turn."""
    agent = make_agent(k, latency)
    setup(agent)
    started, cpu = time.perf_counter(), time.process_time()
    outcome = await agent.run("add numbers")
    elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
    assert outcome.iterations == k + 1, outcome.stop_reason
    return elapsed / outcome.iterations, cpu / outcome.iterations


async def recorded_run(k: int) -> list[AgentEvent]:
    """The events of one run, as the telemetry hook receives them."""
    agent = make_agent(k)
    events: list[AgentEvent] = []
    agent.events.on(set(_KINDS), events.append)
    await agent.run("add numbers")
    return events


def hook_cost(events: list[AgentEvent], turns: int, rounds: int) -> dict[str, tuple[float, float]]:
    """CPU seconds per turn in each configuration's hook, and in recording its queued points."""
    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    meter_provider = MeterProvider(metric_readers=[])
    costs: dict[str, tuple[float, float]] = {}
    for name, providers in (
        ("api", {}),
        ("sdk", {"tracer_provider": tracer_provider, "meter_provider": meter_provider}),
    ):
        in_hook, deferred = [], []
        for _ in range(rounds):
            flush_pending()
            hook = instrument(make_agent(1), **providers)._tracer  # type: ignore[arg-type]
            started = time.process_time()
            for event in events:
                hook(event)
            in_hook.append(time.process_time() - started)
            started = time.process_time()
            flush_pending()
            deferred.append(time.process_time() - started)
            exporter.clear()
        costs[name] = (min(in_hook) / turns, min(deferred) / turns)
    return costs


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
    parser.add_argument("--quick", action="store_true", help="10 runs (a quick look)")
    args = parser.parse_args()
    if args.quick:
        args.runs = 10
    configs = setups()
    for setup in configs.values():  # warm up: imports, price data, tokenizer
        await one_run(2, setup)
    walls: dict[str, list[float]] = {name: [] for name in configs}
    cpus: dict[str, list[float]] = {name: [] for name in configs}
    for _ in range(args.runs):
        for name, setup in configs.items():
            wall, cpu = await one_run(args.k, setup, args.latency_ms / 1000)
            walls[name].append(wall)
            cpus[name].append(cpu)
    print(
        f"per model turn, median of {args.runs} runs of {args.k + 1} turns, model latency "
        f"{args.latency_ms:g} ms per chunk (lower is better)"
    )
    wall_base, cpu_base = statistics.median(walls["off"]), statistics.median(cpus["off"])
    best_base = min(cpus["off"])
    for name in configs:
        wall, cpu, best = (
            statistics.median(walls[name]),
            statistics.median(cpus[name]),
            min(cpus[name]),
        )
        print(
            f"  {name:>3}: wall {wall * 1e3:6.3f} ms ({_vs(wall, wall_base)})"
            f"  cpu {cpu * 1e3:6.3f} ms ({_vs(cpu, cpu_base)})"
            f"  best cpu {best * 1e3:6.3f} ms ({_vs(best, best_base)})"
        )

    events = await recorded_run(args.k)
    print(f"the hook alone, CPU per turn, best of {args.runs} replays of one run's events:")
    for name, (in_hook, deferred) in hook_cost(events, args.k + 1, args.runs).items():
        line = (
            f"  {name:>3}: {in_hook * 1e6:6.1f} us in the loop ({in_hook / best_base * 100:4.1f}%"
        )
        line += " of off's best cpu per turn)"
        if name == "sdk":
            line += f", + {deferred * 1e6:6.1f} us recording its metric points at collection"
        print(line)


def _vs(value: float, base: float) -> str:
    return f"{(value / base - 1) * 100:+5.1f}% vs off"


if __name__ == "__main__":
    asyncio.run(main())
