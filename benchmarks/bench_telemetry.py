"""Per-turn overhead of tracing: off, the API alone, the SDK in memory, the SDK exporting OTLP.

The same agent loop, in one process: an `AgentExecutor` on an in-process scripted model that
calls ``add`` K times and then answers (no network, so the loop's own cost is all there is and
any overhead shows at its largest), tiktoken budgeting on. Four configurations:

- off: no instrumentation;
- api: ``instrument(agent)`` with no SDK configured: OpenTelemetry's no-op tracer and meter
  (what an application pays that has the API installed and exports nothing);
- sdk: ``instrument(agent)`` with an SDK `TracerProvider` (simple processor, in-memory
  exporter) and `MeterProvider` whose periodic reader collects every second into memory;
- otlp: what ``agent-flow --otel`` runs (`configure_otlp`): the SDK with a batch span
  processor and a periodic metric reader, exporting over OTLP/HTTP to a receiver in another
  process (``python -m tests.otlp_receiver``, which decodes nothing), every span and point;
- otlp 1/10: the same with ``OTEL_TRACES_SAMPLER=traceidratio`` and
  ``OTEL_TRACES_SAMPLER_ARG=0.1``: one run in ten traced, every run's metrics recorded.

Rounds interleave the configurations (off, api, sdk, otlp, otlp 1/10, off, ...) so that machine load
affects them alike. A configuration's CPU per model turn is the main thread's CPU time during
its runs plus all the CPU time its own background threads spent (the SDK's export and collect
threads, read per thread), the recording of the metric points its runs queued (done after
each run, so that no other configuration's reader records them) and the final flush of what
its threads still held: what the process pays for the turn, wherever it pays it; waiting for a
core is not counted. Each configuration's
median run is printed per model turn beside off's, split into the loop and the threads.

Then the profile: the hook alone, one recorded run's events replayed through each
configuration's event hook and model-call observer, CPU per turn, the queued metric points
recorded apart; and with ``--profile``, where the otlp configuration's CPU per turn goes: the
hook and the model-call observer in the loop, the span and the metric export apart.

With ``--http`` the loop is the real one: `OpenAIClient` streaming from the scripted server
(`bench_loop`'s answers) over loopback HTTP, the server on a thread of its own whose CPU time is
counted nowhere. With ``--latency-ms`` the in-process model waits that long before each
streamed chunk (a turn streams a few chunks): overhead against a loop that also waits.

Usage: python benchmarks/bench_telemetry.py [--runs 30] [--k 20] [--latency-ms 0] [--quick]
    [--profile] [--http]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
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
from agent_flow.llm.base import LLMClient, LLMRequest, Usage
from agent_flow.llm.openai_client import OpenAIClient
from agent_flow.telemetry import _KINDS, OTLPExport, configure_otlp, instrument
from agent_flow.telemetry._metrics import flush_pending
from agent_flow.testing import FunctionLLM, ScriptedReply, call, reply
from benchmarks.bench_loop import make_handler
from tests.helpers import add
from tests.openai_server import OpenAIServer

ROOT = Path(__file__).resolve().parents[1]
USAGE = Usage(prompt_tokens=1000, completion_tokens=50)


#: The model every run talks to: None (an in-process `FunctionLLM`) or an `OpenAIClient`.
CLIENT: list[LLMClient] = []


def make_agent(k: int, latency: float = 0.0) -> AgentExecutor:
    turns = 0

    def answer(request: LLMRequest) -> ScriptedReply:
        nonlocal turns
        turns += 1
        if turns > k:
            return reply("done", usage=USAGE)
        return reply(tool_calls=[call("add", a=turns, b=1)], usage=USAGE)

    llm = CLIENT[0] if CLIENT else FunctionLLM(answer, model="gpt-4o-mini", delay=latency)
    agent = AgentExecutor(
        llm, config=AgentConfig(context=ContextConfig(max_tokens=32_000), max_iterations=k + 5)
    )
    agent.tools.register(add)
    return agent


class ServerThread:
    """The scripted OpenAI server (`bench_loop`'s answers: K tool calls, then text) on a thread
    of its own: its CPU time is neither the loop's nor a configuration's."""

    def __init__(self, k: int) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.server = OpenAIServer(handler=make_handler(k, stream=True))
        self.server.record = False
        asyncio.run_coroutine_threadsafe(self.server.start(), self.loop).result()

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.server.stop(), self.loop).result()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()


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


def _thread_cpu(thread: threading.Thread) -> float:
    """CPU seconds `thread` has used so far (0 once it has ended)."""
    if thread.ident is None or not thread.is_alive():
        return 0.0
    try:
        return time.clock_gettime(time.pthread_getcpuclockid(thread.ident))
    except OSError:
        return 0.0


@dataclass
class Setup:
    """One configuration: how it instruments an agent, and the threads it started."""

    instrument: Callable[[AgentExecutor], None]
    threads: list[threading.Thread] = field(default_factory=list)
    flush: Callable[[], None] = lambda: None

    def thread_cpu(self) -> float:
        return sum(_thread_cpu(thread) for thread in self.threads)


def _started_since(before: set[threading.Thread]) -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread not in before]


def _otlp(endpoint: str, **variables: str) -> tuple[Setup, OTLPExport]:
    """The otlp configuration (with these ``OTEL_*`` variables set while it is built)."""
    before = set(threading.enumerate())
    saved = {name: os.environ.get(name) for name in variables}
    os.environ.update(variables, OTEL_EXPORTER_OTLP_ENDPOINT=endpoint)
    try:
        export = configure_otlp("bench", set_global=False)
    finally:
        for name, value in saved.items():
            if value is None:
                del os.environ[name]
            else:
                os.environ[name] = value

    def otlp(agent: AgentExecutor) -> None:
        instrument(
            agent, tracer_provider=export.tracer_provider, meter_provider=export.meter_provider
        )

    def flush() -> None:
        export.tracer_provider.force_flush()
        export.meter_provider.force_flush()

    return Setup(otlp, _started_since(before), flush), export


def setups(endpoint: str) -> tuple[dict[str, Setup], list[OTLPExport]]:
    before = set(threading.enumerate())
    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    reader = PeriodicExportingMetricReader(InMemoryMetricExporter(), export_interval_millis=1000)
    meter_provider = MeterProvider(metric_readers=[reader])

    def sdk(agent: AgentExecutor) -> None:
        instrument(agent, tracer_provider=tracer_provider, meter_provider=meter_provider)
        exporter.clear()

    sdk_threads = _started_since(before)
    otlp, export = _otlp(endpoint)
    # One run in ten traced (the standard sampler variables): the others record metrics only.
    sampled, sampled_export = _otlp(
        endpoint, OTEL_TRACES_SAMPLER="traceidratio", OTEL_TRACES_SAMPLER_ARG="0.1"
    )
    return {
        "off": Setup(lambda agent: None),
        "api": Setup(lambda agent: instrument(agent)),
        "sdk": Setup(sdk, sdk_threads),
        "otlp": otlp,
        "otlp 1/10": sampled,
    }, [export, sampled_export]


async def one_run(k: int, setup: Setup, latency: float = 0.0) -> tuple[float, float, int]:
    """One run's wall-clock and main-thread CPU seconds, and its model turns."""
    agent = make_agent(k, latency)
    setup.instrument(agent)
    started, cpu = time.perf_counter(), time.thread_time()
    outcome = await agent.run("add numbers")
    elapsed, cpu = time.perf_counter() - started, time.thread_time() - cpu
    assert outcome.iterations == k + 1, outcome.stop_reason
    return elapsed, cpu, outcome.iterations


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


async def profile_otlp(k: int, runs: int, endpoint: str) -> None:
    """Where the otlp configuration's CPU per turn goes: in the loop, and in the exporter.

    In the loop: the CPU time spent inside the event hook and the model-call observer
    (SDK span work they call included), against the main thread's whole time; the rest is
    what the loop pays around them (the event bus calling the hook, contexts, allocation).
    In the exporter: its own SDK providers whose batch holds everything until the end, then
    the span export (OTLP protobuf encoding and sending) and the metric export (recording the
    queued points, encoding, sending) timed apart.
    """
    from agent_flow.telemetry._spans import _EventTracer

    spent: dict[str, int] = {}

    def timed(name: str, method: Callable[..., object]) -> Callable[..., object]:
        def run(*args: object, **kwargs: object) -> object:
            started = time.thread_time_ns()
            try:
                return method(*args, **kwargs)
            finally:
                spent[name] = spent.get(name, 0) + time.thread_time_ns() - started

        return run

    patched = {
        name: getattr(_EventTracer, name)
        for name in ("__call__", "call_started", "first_chunk", "attempt_failed", "call_finished")
    }
    os.environ.update(
        OTEL_BSP_SCHEDULE_DELAY="3600000",
        OTEL_BSP_MAX_QUEUE_SIZE="1000000",
        OTEL_BSP_MAX_EXPORT_BATCH_SIZE="1000000",
        OTEL_EXPORTER_OTLP_ENDPOINT=endpoint,
    )
    export = configure_otlp("bench", set_global=False)
    setup = Setup(
        lambda agent: instrument(
            agent, tracer_provider=export.tracer_provider, meter_provider=export.meter_provider
        )
    )
    await one_run(k, setup)
    export.tracer_provider.force_flush()
    export.meter_provider.force_flush()
    for name, method in patched.items():
        setattr(_EventTracer, name, timed(name if name != "__call__" else "hook", method))
    loop = recording = 0.0
    turns = 0
    flush_pending()
    try:
        for _ in range(runs):
            _, cpu, n = await one_run(k, setup)
            loop += cpu
            turns += n
            started = time.thread_time()
            flush_pending()  # before another configuration's reader records them
            recording += time.thread_time() - started
    finally:
        for name, method in patched.items():
            setattr(_EventTracer, name, method)
    started = time.thread_time()
    export.tracer_provider.force_flush()
    spans = time.thread_time() - started
    started = time.thread_time()
    export.meter_provider.force_flush()
    metrics = time.thread_time() - started + recording
    export.shutdown()
    hook = spent.get("hook", 0) / 1e9
    observer = sum(v for name, v in spent.items() if name != "hook") / 1e9
    total = loop / turns * 1e6
    print(f"where otlp's CPU per turn goes ({runs} runs; the loop's whole: {total:.0f} us):")
    for label, seconds in (
        ("in the loop: the event hook (span work included)", hook),
        ("in the loop: the model-call observer (chat spans opened)", observer),
        ("exporter: spans encoded to OTLP protobuf and sent", spans),
        ("exporter: metric points recorded, encoded and sent", metrics),
    ):
        print(f"  {seconds / turns * 1e6:6.1f} us  {label}")


def main() -> None:
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
    parser.add_argument(
        "--profile", action="store_true", help="where the otlp configuration's CPU goes"
    )
    parser.add_argument(
        "--http",
        action="store_true",
        help="the real OpenAIClient, streaming from the scripted server over loopback HTTP "
        "(on a thread of its own), instead of the in-process model",
    )
    args = parser.parse_args()
    if args.quick:
        args.runs = 10
    server = ServerThread(args.k) if args.http else None
    if server is not None:
        CLIENT.append(OpenAIClient("gpt-4o-mini", base_url=server.server.base_url, api_key="k"))
    # The receiver serves in its own process until its standard input closes.
    receiver = subprocess.Popen(
        [sys.executable, "-m", "tests.otlp_receiver"],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert receiver.stdout is not None
    assert receiver.stdin is not None
    try:
        configs, exports = setups(receiver.stdout.readline().strip())
        asyncio.run(measure(args, configs))
        for export in exports:
            export.shutdown()
    finally:
        receiver.stdin.close()
        receiver.wait()
        if server is not None:
            server.stop()


async def measure(args: argparse.Namespace, configs: dict[str, Setup]) -> None:
    for setup in configs.values():  # warm up: imports, price data, tokenizer
        await one_run(args.k, setup)
    flush_pending()
    thread_cpu = {name: setup.thread_cpu() for name, setup in configs.items()}
    walls: dict[str, list[float]] = {name: [] for name in configs}
    cpus: dict[str, list[float]] = {name: [] for name in configs}
    # The metric points a run queued are recorded by whichever reader collects next, in its
    # thread: record them after each run instead, charged to the run's configuration.
    recorded = dict.fromkeys(configs, 0.0)
    turns = 0
    for _ in range(args.runs):
        for name, setup in configs.items():
            wall, cpu, turns = await one_run(args.k, setup, args.latency_ms / 1000)
            walls[name].append(wall / turns)
            cpus[name].append(cpu / turns)
            started = time.thread_time()
            flush_pending()
            recorded[name] += time.thread_time() - started
    # The threads' CPU, and the export of what they still hold (a flush runs it in the
    # calling thread), spread over every turn of the configuration's runs.
    threads = {}
    for name, setup in configs.items():
        flushed = time.thread_time()
        setup.flush()
        flushed = time.thread_time() - flushed
        spent = setup.thread_cpu() - thread_cpu[name] + flushed + recorded[name]
        threads[name] = spent / (args.runs * turns)
    model = "OpenAIClient over loopback HTTP" if CLIENT else "an in-process model"
    print(
        f"per model turn, median of {args.runs} runs of {args.k + 1} turns, {model}, "
        f"model latency {args.latency_ms:g} ms per chunk (lower is better)"
    )
    wall_base = statistics.median(walls["off"])
    cpu_base = statistics.median(cpus["off"]) + threads["off"]
    for name in configs:
        wall = statistics.median(walls[name])
        loop = statistics.median(cpus[name])
        total = loop + threads[name]
        print(
            f"  {name:>9}: wall {wall * 1e3:6.3f} ms ({_vs(wall, wall_base)})"
            f"  cpu {total * 1e3:6.3f} ms ({_vs(total, cpu_base)})"
            f"  = loop {loop * 1e3:6.3f} ms + threads {threads[name] * 1e3:6.3f} ms"
        )

    events = await recorded_run(args.k)
    print(f"the hook alone, CPU per turn, best of {args.runs} replays of one run's events:")
    best_base = min(cpus["off"])
    for name, (in_hook, deferred) in hook_cost(events, args.k + 1, args.runs).items():
        line = (
            f"  {name:>4}: {in_hook * 1e6:6.1f} us in the loop ({in_hook / best_base * 100:4.1f}%"
        )
        line += " of off's best cpu per turn)"
        if name == "sdk":
            line += f", + {deferred * 1e6:6.1f} us recording its metric points at collection"
        print(line)
    if args.profile:
        await profile_otlp(args.k, args.runs, os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"])


def _vs(value: float, base: float) -> str:
    return f"{(value / base - 1) * 100:+5.1f}% vs off"


if __name__ == "__main__":
    main()
