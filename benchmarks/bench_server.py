"""`agent-flow serve` under load: N sessions at once, each a 10-step tool loop, all streamed.

Three kinds of process, as in a deployment: a local OpenAI-compatible model server
(tests/openai_server.py, its own process; it answers instantly: the model calls ``add`` ten
times, then answers), the process that runs the agents, and the clients. Two ways to drive N
concurrent sessions against the same model server, taking turns in the same agents' process
(one process per N; on these machines one process runs up to 40% faster or slower than the
next with the same code, so the two modes are compared within one):

- in-process (the baseline): N `AgentExecutor`s with a session store, one subscriber each,
  in the agents' process (a subscriber there is what an SSE client is over HTTP), started by
  a request to a route this benchmark adds to the app (``/_bench/in-process``);
- http: the app of `agent-flow serve` on uvicorn; the clients' process creates N sessions
  over HTTP, opens N SSE streams, sends N messages and reads every stream to its
  ``run_finished``.

A round is, in each mode in turn (alternating which goes first), waves of N new sessions one
after another until they make 220 turns (one wave from N = 20 on); ``--rounds`` (9). Reported
per mode: runs/s;
CPU per model turn of the process that runs the agents (read from /proc around each wave;
neither the model server's nor the clients' CPU is counted), the median of the rounds; event
delivery latency p50/p99 over all rounds (the event's timestamp to the moment the chunk that
carries it was read by the client); and whether every stream was complete and in order (the
run's ids, its first id plus 0..n-1: no gap, no duplicate, ending with ``run_finished``).
The overhead is the median of each round's HTTP / in-process ratio; beside it, the event
streams' body writes per turn over HTTP (each one ``send``: a step's events go out in one,
`agent_flow.server._batching`) against the events per turn.

``--sample DIR`` records the agents' process with `attribute.py`'s sampler, each mode's waves
apart (``DIR/in_process_N.txt``, ``DIR/http_N.txt``; read them with ``attribute.py FILE
--turns T``); ``--profile DIR`` runs it under cProfile for its whole life and writes
``DIR/server_N.prof``; ``--diagnose`` adds the server's event-loop lag (how late a 5 ms timer
fires: the time a ready callback waits behind the others) and the ready queue's length when
each event is published. Memory per session is `bench_memory.py`'s and
`bench_process_memory.py`'s.

The sessions share one model client unless ``--client-per-session`` gives each its own, as
`agent-flow serve` does without an ``llm_factory`` (a shared client's connection pool is
scanned on every request; measured here, one client per session costs no less CPU per turn
and about four times the memory per session).

Usage: python benchmarks/bench_server.py [--sessions 10,100,500] [--rounds R]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _bench_diagnosis import Diagnosis
from _bench_sse_reader import Reader, client_for, read_streams
from attribute import Sampler

from tests.openai_server import OpenAIServer, Reply, sse_reply, text_chunks, tool_call_chunks
from tests.server_harness import BodyWrites

K = 10
TURNS = K + 1
MODES = ("in-process", "http")


def make_handler() -> Any:
    calls = [
        sse_reply(tool_call_chunks([(f"call_{n}", "add", json.dumps({"a": n, "b": 1}))]))
        for n in range(K)
    ]
    final = sse_reply(text_chunks("Done."))

    def handler(request: Any) -> Reply:
        messages = json.loads(request.raw_body)["messages"]
        # The steps of this run: the tool results since the session's last message.
        last = max(i for i, m in enumerate(messages) if m["role"] == "user")
        done = sum(1 for m in messages[last:] if m["role"] == "tool")
        return calls[done] if done < K else final

    return handler


def config_and_tools() -> tuple[Any, Any]:
    from agent_flow import AgentConfig, ContextConfig
    from agent_flow.tools import ToolExecutor, tool

    @tool
    def add(a: int, b: int) -> int:
        """Add two integers.

        Args:
            a: The first.
            b: The second.
        """
        return a + b

    config = AgentConfig(
        system_prompt="You are a calculator agent. Use the add tool.\n{environment}",
        context=ContextConfig(max_tokens=64_000),
        max_iterations=1000,
        stuck_threshold=1000,
    )

    def tools(_: Any) -> Any:
        executor = ToolExecutor()
        executor.register(add)
        return executor

    return config, tools


def _cpu_seconds(pid: int) -> tuple[float, float]:
    """User and system CPU seconds of process `pid` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def _rss_mb(pid: int) -> float:
    """The resident memory of process `pid` in MB (`bench_process_memory`, `_bench_idle` and
    `bench_first_messages` read it through here)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _listening_socket() -> socket.socket:
    # IPPROTO_TCP, not the default 0: asyncio sets TCP_NODELAY only on sockets whose proto
    # says TCP, and without it Nagle's algorithm meets the client's delayed ACK (~40 ms).
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    sock.listen(4096)
    return sock


def _spawn(
    *args: str, script: str = __file__, env: dict[str, str] | None = None
) -> tuple[subprocess.Popen[bytes], str]:
    """Start `script` (this one) as a child with `args` plus a port file; wait for its port."""
    port_file = Path(f"/tmp/bench_server_{os.getpid()}_{time.monotonic_ns()}.port")
    child = subprocess.Popen(
        [sys.executable, script, *args, "--port-file", str(port_file)], env=env
    )
    try:
        while not port_file.exists() or not port_file.read_text():
            if child.poll() is not None:
                raise RuntimeError(f"{args[0]} exited with {child.returncode}")
            time.sleep(0.05)
        return child, port_file.read_text()
    finally:
        port_file.unlink(missing_ok=True)


def _stop(child: subprocess.Popen[bytes]) -> None:
    child.send_signal(signal.SIGINT)
    try:
        child.wait(timeout=30)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()


async def _until_interrupted() -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGINT, stop.set)
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()


# -- the model server --------------------------------------------------------------------


async def model_server(port_file: str) -> None:
    server = OpenAIServer(handler=make_handler())
    server.record = False
    sock = _listening_socket()
    # The test server binds its own socket; a listening one of ours gives the big backlog.
    server._server = await asyncio.start_server(server._serve, sock=sock)
    Path(port_file).write_text(str(sock.getsockname()[1]))  # noqa: ASYNC240 (once, tiny)
    await _until_interrupted()
    await server.stop()


# -- in-process baseline ---------------------------------------------------------------


def _model_clients(model_url: str, *, per_session: bool) -> Any:
    """The sessions' model clients: one shared, or one per session as `agent-flow serve` makes
    them without an ``llm_factory`` (a shared one's connection pool is scanned per request)."""
    from agent_flow import OpenAIClient

    shared = OpenAIClient("m", base_url=model_url, api_key="k")

    def client(_: Any = None) -> Any:
        return OpenAIClient("m", base_url=model_url, api_key="k") if per_session else shared

    return client


class InProcessWaves:
    """The baseline, run in the serving process: waves of N runs at once, one subscriber each."""

    def __init__(self, model_url: str, *, per_session: bool) -> None:
        from agent_flow.sessions import InMemorySessionStore

        self.config, self.tools = config_and_tools()
        self.clients = _model_clients(model_url, per_session=per_session)
        self.store = InMemorySessionStore()

    async def wave(self, n: int) -> dict[str, Any]:
        """Run `n` runs at once; their events' latencies and whether each was complete."""
        from agent_flow import AgentExecutor

        latencies: list[float] = []
        complete = True

        async def one() -> None:
            nonlocal complete
            agent = AgentExecutor(
                self.clients(), config=self.config, tools=self.tools(None), store=self.store
            )
            subscription = agent.subscribe()

            async def drain() -> list[int]:
                seqs = []
                async for event in subscription:
                    latencies.append((time.time() - event.timestamp.timestamp()) * 1000)
                    seqs.append(event.seq)
                return seqs

            reader = asyncio.create_task(drain())
            outcome = await agent.run("Add the numbers.")
            seqs = await reader
            in_order = seqs == list(range(len(seqs)))
            complete = complete and outcome.iterations == TURNS and in_order

        await asyncio.gather(*(one() for _ in range(n)))
        return {"latencies": latencies, "complete": complete}


# -- over HTTP -------------------------------------------------------------------------


async def serve(
    port_file: str,
    model_url: str,
    diagnose: str | None,
    profile: str | None,
    *,
    per_session: bool,
    sample: str | None = None,
) -> None:
    import uvicorn

    from agent_flow.server import create_app
    from agent_flow.sessions import InMemorySessionStore

    config, tools = config_and_tools()
    app = create_app(
        config,
        store=InMemorySessionStore(),
        llm_factory=_model_clients(model_url, per_session=per_session),
        tools_factory=tools,
    )
    waves = InProcessWaves(model_url, per_session=per_session)
    samples: dict[str, Counter[str]] = {mode: Counter() for mode in MODES}
    sampler = Sampler() if sample else None

    async def in_process(n: int) -> dict[str, Any]:
        return await waves.wave(n)

    async def mode(name: str) -> None:
        """Sample what follows as `name`'s (both modes run in this process)."""
        if sampler is not None:
            sampler.stacks = samples[name]

    writes = BodyWrites(app, "/events")

    async def written() -> int:
        return writes.count

    app.add_api_route("/_bench/in-process", in_process, methods=["POST"])
    app.add_api_route("/_bench/mode", mode, methods=["POST"])
    app.add_api_route("/_bench/writes", written, methods=["GET"])
    diagnosis = Diagnosis() if diagnose else None
    if diagnosis is not None:
        diagnosis.install()
    sock = _listening_socket()
    Path(port_file).write_text(str(sock.getsockname()[1]))  # noqa: ASYNC240 (once, tiny)
    server = uvicorn.Server(
        uvicorn.Config(writes, log_level="warning", backlog=4096, timeout_keep_alive=60)
    )
    # CPU time, not wall time: on a loaded machine other processes' turns are not ours.
    profiler = cProfile.Profile(time.process_time) if profile else None
    if profiler is not None:
        profiler.enable()
    if sampler is not None:
        sampler.__enter__()
    try:
        await server.serve(sockets=[sock])
    finally:
        if sampler is not None and sample:
            sampler.__exit__()
            for name, stacks in samples.items():
                sampler.stacks = stacks
                sampler.write(sample.format(mode=name.replace("-", "_")))
        if profiler is not None and profile:
            profiler.disable()
            profiler.dump_stats(profile)
        if diagnosis is not None and diagnose:
            Path(diagnose).write_text(json.dumps(diagnosis.report()))  # noqa: ASYNC240


async def drive(base: str, pid: int, n: int, rounds: int) -> dict[str, list[dict[str, Any]]]:
    """Create the sessions, have the clients' process open their streams, run the rounds.

    Each round is a wave of N runs in each mode, in alternating order; each wave's CPU is the
    agents' process's, read from /proc around it.
    """
    records: dict[str, list[dict[str, Any]]] = {mode: [] for mode in MODES}
    async with client_for(base, n) as client:
        warm = (await client.post("/sessions", json={})).json()["id"]
        async with client.stream("GET", f"/sessions/{warm}/events") as response:
            await client.post(f"/sessions/{warm}/messages", json={"message": "Add."})
            await Reader().read(response)
        (await client.post("/_bench/in-process", params={"n": 1}, json={})).raise_for_status()
        # A round's waves in one mode make at least 220 turns: /proc counts in 10 ms ticks.
        per_round = max(1, -(-220 // (n * TURNS)))
        sessions = [
            [(await client.post("/sessions", json={})).json()["id"] for _ in range(n)]
            for _ in range(rounds * per_round)
        ]
        clients = await asyncio.create_subprocess_exec(
            sys.executable,
            __file__,
            "--read-streams",
            base,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            limit=2**30,
        )
        assert clients.stdin is not None
        assert clients.stdout is not None
        clients.stdin.write(json.dumps(sessions).encode() + b"\n")
        await clients.stdin.drain()
        assert (await clients.stdout.readline()).strip() == b"open"

        async def wave(mode: str, index: int) -> dict[str, Any]:
            assert clients.stdin is not None
            assert clients.stdout is not None
            if mode == "in-process":
                answer = await client.post("/_bench/in-process", params={"n": n}, json={})
                answer.raise_for_status()
                return dict(answer.json())
            # The clients send the wave's messages at once, as the baseline starts its runs.
            clients.stdin.write(f"go {index}\n".encode())
            await clients.stdin.drain()
            return dict(json.loads(await clients.stdout.readline()))

        for index in range(rounds):
            for mode in MODES if index % 2 == 0 else MODES[::-1]:
                first = index * per_round
                if mode == "http":  # the clients' streams, open before the clock starts
                    for w in range(per_round):
                        clients.stdin.write(f"open {first + w}\n".encode())
                        await clients.stdin.drain()
                        assert (await clients.stdout.readline()).strip() == b"opened"
                (
                    await client.post("/_bench/mode", params={"name": mode}, json={})
                ).raise_for_status()
                writes0 = (await client.get("/_bench/writes")).json()
                (user0, sys0), start = _cpu_seconds(pid), time.perf_counter()
                reads = [await wave(mode, first + w) for w in range(per_round)]
                elapsed = time.perf_counter() - start
                user, system = _cpu_seconds(pid)
                writes = (await client.get("/_bench/writes")).json() - writes0
                records[mode].append(
                    {
                        "latencies": [value for read in reads for value in read["latencies"]],
                        "complete": all(read["complete"] for read in reads),
                        "runs": n * per_round,
                        "cpu": user - user0 + system - sys0,
                        "kernel": system - sys0,
                        "elapsed": elapsed,
                        "writes": writes,
                    }
                )
        clients.stdin.write(b"end\n")
        await clients.stdin.drain()
        slowest = json.loads(await clients.stdout.readline())["slowest_kinds"]
        await clients.wait()
    records["http"][0]["slowest_kinds"] = slowest
    return records


def cell(
    n: int,
    model_url: str,
    *,
    rounds: int,
    profile: str | None,
    diagnose: bool,
    per_session: bool,
    sample: str | None = None,
) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """Both modes' rounds at N in one agents' process: each mode's summary, and the overhead."""
    args = ["--serve", "--model-url", model_url]
    if per_session:
        args.append("--client-per-session")
    report = Path(f"/tmp/bench_server_{os.getpid()}_{n}.diagnosis")
    if diagnose:
        args += ["--diagnose-file", str(report)]
    if profile:
        Path(profile).mkdir(parents=True, exist_ok=True)
        args += ["--profile-file", f"{profile}/server_{n}.prof"]
    if sample:
        Path(sample).mkdir(parents=True, exist_ok=True)
        args += ["--sample-file", f"{sample}/{{mode}}_{n}.txt"]
    server, port = _spawn(*args)
    try:
        records = asyncio.run(drive(f"http://127.0.0.1:{port}", server.pid, n, rounds))
    finally:
        _stop(server)
    summaries = {mode: _summary(runs) for mode, runs in records.items()}
    paired = zip(records["in-process"], records["http"], strict=True)
    overhead = {
        "ratio": statistics.median(http["cpu"] / base["cpu"] - 1 for base, http in paired),
        "slowest_kinds": records["http"][0]["slowest_kinds"],
    }
    if diagnose and report.exists():
        overhead.update(json.loads(report.read_text()))
        report.unlink()
    return summaries, overhead


def _summary(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """One mode's rounds: runs/s, the median CPU per turn, latencies over all rounds."""
    ordered = sorted(latency for r in rounds for latency in r["latencies"])
    turns = sum(r["runs"] * TURNS for r in rounds)
    return {
        "runs_per_s": sum(r["runs"] for r in rounds) / sum(r["elapsed"] for r in rounds),
        "cpu_ms_per_turn": statistics.median(r["cpu"] * 1e3 / (r["runs"] * TURNS) for r in rounds),
        "sys_ms_per_turn": statistics.median(
            r["kernel"] * 1e3 / (r["runs"] * TURNS) for r in rounds
        ),
        "p50_ms": statistics.median(ordered),
        "p99_ms": ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))],
        "events": len(ordered),
        "complete": all(r["complete"] for r in rounds),
        "writes_per_turn": sum(r["writes"] for r in rounds) / turns,
        "events_per_turn": len(ordered) / turns,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--sessions", default="10,100,500", help="concurrent sessions")
    parser.add_argument(
        "--rounds",
        type=int,
        default=9,
        help="rounds (in each, waves of N new sessions in each mode, 220 turns at least)",
    )
    parser.add_argument("--profile", metavar="DIR", help="run the server under cProfile")
    parser.add_argument(
        "--sample",
        metavar="DIR",
        help="sample the agents' process, each mode apart (DIR/in_process_N.txt, "
        "DIR/http_N.txt); read with attribute.py",
    )
    parser.add_argument("--diagnose", action="store_true", help="server loop lag and queue")
    parser.add_argument(
        "--client-per-session",
        action="store_true",
        help="a model client per session (as agent-flow serve makes them), not one shared",
    )
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--model", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--model-url", help=argparse.SUPPRESS)
    parser.add_argument("--port-file", help=argparse.SUPPRESS)
    parser.add_argument("--diagnose-file", help=argparse.SUPPRESS)
    parser.add_argument("--profile-file", help=argparse.SUPPRESS)
    parser.add_argument("--sample-file", help=argparse.SUPPRESS)
    parser.add_argument("--read-streams", metavar="BASE_URL", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.model:
        asyncio.run(model_server(args.port_file))
        return
    if args.serve:
        # uvicorn stops on SIGINT, then raises it again once it has shut down.
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(
                serve(
                    args.port_file,
                    args.model_url,
                    args.diagnose_file,
                    args.profile_file,
                    per_session=args.client_per_session,
                    sample=args.sample_file,
                )
            )
        return
    if args.read_streams:
        asyncio.run(read_streams(args.read_streams))
        return
    model, model_port = _spawn("--model")
    model_url = f"http://127.0.0.1:{model_port}/v1"
    print(f"{K}-step tool loops, N sessions at once; http = agent-flow serve + SSE clients;")
    print("model server, agents and clients each in their own process; the two modes take")
    print("turns in one agents' process per N, round by round")
    head = f"{'N':>4} {'mode':>10} | {'runs/s':>7} | {'CPU ms/turn':>11} | {'p50 ms':>7} |"
    print(head + f" {'p99 ms':>7} | {'events':>7} | complete")
    try:
        for n in (int(value) for value in args.sessions.split(",")):
            rounds = args.rounds
            summaries, overhead = cell(
                n,
                model_url,
                rounds=rounds,
                profile=args.profile,
                diagnose=args.diagnose,
                per_session=args.client_per_session,
                sample=args.sample,
            )
            for mode, row in summaries.items():
                print(
                    f"{n:>4} {mode:>10} | {row['runs_per_s']:>7.1f} |"
                    f" {row['cpu_ms_per_turn']:>11.2f} |"
                    f" {row['p50_ms']:>7.1f} | {row['p99_ms']:>7.1f} |"
                    f" {row['events']:>7.0f} | {row['complete']}"
                )
            http, baseline = summaries["http"], summaries["in-process"]
            print(
                f"{'':>4} {'':>10}   HTTP+SSE CPU overhead per turn: {overhead['ratio']:+.0%}"
                f" (median of {rounds} paired rounds; in the kernel:"
                f" {baseline['sys_ms_per_turn']:.2f} ms in-process,"
                f" {http['sys_ms_per_turn']:.2f} ms http; stream writes per turn:"
                f" {http['writes_per_turn']:.1f} for {http['events_per_turn']:.1f} events)",
                flush=True,
            )
            if args.diagnose:
                keys = [
                    key
                    for key in overhead
                    if key.startswith(("lag_", "ready_", "created_", "batched_"))
                    and key != "created_to_publish_slowest"
                ]
                print(f"{'':>4} {'':>10}   p99 by kind (ms), http: {overhead['slowest_kinds']}")
                print(
                    f"{'':>4} {'':>10}   created to published, p99 by kind (ms): "
                    + overhead["created_to_publish_slowest"]
                )
                print(
                    f"{'':>4} {'':>10}   server loop, both modes: "
                    + ", ".join(f"{key} {overhead[key]:.1f}" for key in keys)
                )
    finally:
        _stop(model)


if __name__ == "__main__":
    main()
