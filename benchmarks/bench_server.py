"""`agent-flow serve` under load: N sessions at once, each a 10-step tool loop, all streamed.

Three kinds of process, as in a deployment: a local OpenAI-compatible model server
(tests/openai_server.py, its own process; it answers instantly: the model calls ``add`` ten
times, then answers), the process that runs the agents, and the clients. Two ways to drive N
concurrent sessions against the same model server, each measured in a fresh child process:

- in-process (the baseline): N `AgentExecutor`s with a session store, one subscriber each,
  in the agents' process (a subscriber there is what an SSE client is over HTTP);
- http: the app of `agent-flow serve` on uvicorn; the clients' process (this one) creates N
  sessions over HTTP, opens N SSE streams, sends N messages and reads every stream to its
  ``run_finished``.

Both modes alternate ``--repeat`` times (ABAB: the machine's load falls on both alike); the
table shows medians, and ``[min-max]`` of p99 over the repetitions.

Reported: runs/s; CPU per model turn of the process that runs the agents (read from /proc;
neither the model server's nor the clients' CPU is counted); event delivery latency p50/p99
(the event's timestamp to the moment the chunk that carries it was read by the client); RSS
growth per session; and whether every stream was complete and in order (the run's ids, its
first id plus 0..n-1: no gap, no duplicate, ending with ``run_finished``).

``--profile DIR`` runs the HTTP server under cProfile and writes ``DIR/server_N.prof``;
``--diagnose`` adds the server's event-loop lag (how late a 5 ms timer fires: the time a
ready callback waits behind the others) and the ready queue's length when each event is
published.

The sessions share one model client unless ``--client-per-session`` gives each its own, as
`agent-flow serve` does without an ``llm_factory`` (a shared client's connection pool is
scanned on every request; measured here, one client per session costs no less CPU per turn
and about four times the memory per session).

Usage: python benchmarks/bench_server.py [--sessions 10,100,500] [--repeat 3]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import json
import os
import resource
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _bench_diagnosis import Diagnosis
from _bench_sse_reader import Reader, client_for, read_streams
from attribute import Sampler

from tests.openai_server import OpenAIServer, Reply, sse_reply, text_chunks, tool_call_chunks

K = 10
TURNS = K + 1


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


async def in_process(
    n: int, model_url: str, *, waves: int, per_session: bool, sample: str | None = None
) -> dict[str, Any]:
    from agent_flow import AgentExecutor
    from agent_flow.sessions import InMemorySessionStore

    config, tools = config_and_tools()
    clients = _model_clients(model_url, per_session=per_session)
    store = InMemorySessionStore()
    latencies: list[float] = []
    complete = True

    async def one() -> None:
        nonlocal complete
        agent = AgentExecutor(clients(), config=config, tools=tools(None), store=store)
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
        complete = complete and outcome.iterations == TURNS and seqs == list(range(len(seqs)))

    await one()  # warm-up
    latencies.clear()
    rss0 = _rss_mb(os.getpid())
    usage0 = resource.getrusage(resource.RUSAGE_SELF)
    start = time.perf_counter()
    with Sampler() if sample else contextlib.nullcontext() as sampler:
        for _ in range(waves):
            await asyncio.gather(*(one() for _ in range(n)))
    elapsed = time.perf_counter() - start
    if sampler is not None and sample:
        sampler.write(sample)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    kernel = usage.ru_stime - usage0.ru_stime
    cpu = usage.ru_utime - usage0.ru_utime + kernel
    rss = _rss_mb(os.getpid()) - rss0
    return _summary(n, waves, elapsed, cpu, rss, latencies, complete, kernel)


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
    diagnosis = Diagnosis() if diagnose else None
    if diagnosis is not None:
        diagnosis.install()
    sock = _listening_socket()
    Path(port_file).write_text(str(sock.getsockname()[1]))  # noqa: ASYNC240 (once, tiny)
    server = uvicorn.Server(
        uvicorn.Config(app, log_level="warning", backlog=4096, timeout_keep_alive=60)
    )
    # CPU time, not wall time: on a loaded machine other processes' turns are not ours.
    profiler = cProfile.Profile(time.process_time) if profile else None
    if profiler is not None:
        profiler.enable()
    sampler = Sampler().__enter__() if sample else None
    try:
        await server.serve(sockets=[sock])
    finally:
        if sampler is not None and sample:
            sampler.__exit__()
            sampler.write(sample)
        if profiler is not None and profile:
            profiler.disable()
            profiler.dump_stats(profile)
        if diagnosis is not None and diagnose:
            Path(diagnose).write_text(json.dumps(diagnosis.report()))  # noqa: ASYNC240


async def drive(base: str, pid: int, n: int, waves: int) -> dict[str, Any]:
    """Create the sessions, have the clients' process open their streams and run the waves."""
    async with client_for(base, n) as client:
        warm = (await client.post("/sessions", json={})).json()["id"]
        async with client.stream("GET", f"/sessions/{warm}/events") as response:
            await client.post(f"/sessions/{warm}/messages", json={"message": "Add."})
            await Reader().read(response)
        sessions = [
            [(await client.post("/sessions", json={})).json()["id"] for _ in range(n)]
            for _ in range(waves)
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
        rss0, (user0, sys0) = _rss_mb(pid), _cpu_seconds(pid)
        start = time.perf_counter()
        clients.stdin.write(b"go\n")  # it sends each wave's messages at once, as the baseline
        await clients.stdin.drain()
        read = json.loads(await clients.stdout.readline())
        elapsed = time.perf_counter() - start
        user, system = _cpu_seconds(pid)
        cpu, kernel, rss = user - user0 + system - sys0, system - sys0, _rss_mb(pid) - rss0
        await clients.wait()
    result = _summary(n, waves, elapsed, cpu, rss, read["latencies"], read["complete"], kernel)
    result["slowest_kinds"] = read["slowest_kinds"]
    return result


def over_http(
    n: int,
    model_url: str,
    *,
    waves: int,
    profile: str | None,
    diagnose: bool,
    per_session: bool,
    sample: str | None = None,
) -> dict[str, Any]:
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
        args += ["--sample-file", f"{sample}/http_{n}.txt"]
    server, port = _spawn(*args)
    try:
        result = asyncio.run(drive(f"http://127.0.0.1:{port}", server.pid, n, waves))
    finally:
        _stop(server)
    if diagnose and report.exists():
        result.update(json.loads(report.read_text()))
        report.unlink()
    return result


def _summary(
    n: int,
    waves: int,
    elapsed: float,
    cpu: float,
    rss: float,
    latencies: list[float],
    complete: bool,
    kernel: float,
) -> dict[str, Any]:
    ordered = sorted(latencies)
    return {
        "runs_per_s": n * waves / elapsed,
        "cpu_ms_per_turn": cpu * 1000 / (n * waves * TURNS),
        "sys_ms_per_turn": kernel * 1000 / (n * waves * TURNS),
        "p50_ms": statistics.median(ordered),
        "p99_ms": ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))],
        "rss_kb_per_session": rss * 1024 / n,  # the sessions of one wave
        "events": len(latencies),
        "complete": complete,
    }


def _median_row(rows: list[dict[str, Any]]) -> dict[str, Any]:
    numeric = [
        key
        for key, value in rows[0].items()
        if isinstance(value, int | float) and not isinstance(value, bool)
    ]
    row: dict[str, Any] = {key: statistics.median(r[key] for r in rows) for key in numeric}
    row["complete"] = all(r["complete"] for r in rows)
    row["p99_spread"] = (min(r["p99_ms"] for r in rows), max(r["p99_ms"] for r in rows))
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--sessions", default="10,100,500", help="concurrent sessions")
    parser.add_argument("--repeat", type=int, default=3, help="repetitions of each mode (ABAB)")
    parser.add_argument(
        "--waves",
        type=int,
        help="waves of N new sessions, one after another (default: enough for 500 turns)",
    )
    parser.add_argument("--profile", metavar="DIR", help="run the server under cProfile")
    parser.add_argument(
        "--sample",
        metavar="DIR",
        help="sample both modes' agent processes (DIR/in_process_N.txt, DIR/http_N.txt; "
        "the server's whole life, warm-up included); read with attribute.py",
    )
    parser.add_argument("--diagnose", action="store_true", help="server loop lag and queue")
    parser.add_argument(
        "--client-per-session",
        action="store_true",
        help="a model client per session (as agent-flow serve makes them), not one shared",
    )
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--model", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--in-process", type=int, help=argparse.SUPPRESS)
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
    if args.in_process:
        result = in_process(
            args.in_process,
            args.model_url,
            waves=args.waves,
            per_session=args.client_per_session,
            sample=args.sample_file,
        )
        print(json.dumps(asyncio.run(result)))
        return
    if args.sample:
        Path(args.sample).mkdir(parents=True, exist_ok=True)
    model, model_port = _spawn("--model")
    model_url = f"http://127.0.0.1:{model_port}/v1"
    print(f"{K}-step tool loops, N sessions at once; http = agent-flow serve + SSE clients;")
    print("model server, agents and clients each in their own process")
    head = f"{'N':>4} {'mode':>10} | {'runs/s':>7} | {'CPU ms/turn':>11} | {'p50 ms':>7} |"
    print(
        head + f" {'p99 ms':>7} {'[min-max]':>15} | {'RSS KB/sess':>11} | {'events':>7} | complete"
    )
    try:
        for n in (int(value) for value in args.sessions.split(",")):
            # A cell of a few runs is measured in ticks of /proc's 10 ms: too coarse.
            waves = args.waves or max(1, -(-500 // (n * TURNS)))
            rows: dict[str, list[dict[str, Any]]] = {"in-process": [], "http": []}
            for _ in range(args.repeat):
                out = subprocess.run(
                    [
                        sys.executable,
                        __file__,
                        "--in-process",
                        str(n),
                        "--model-url",
                        model_url,
                        "--waves",
                        str(waves),
                        *(["--client-per-session"] if args.client_per_session else []),
                        *(
                            ["--sample-file", f"{args.sample}/in_process_{n}.txt"]
                            if args.sample
                            else []
                        ),
                    ],
                    check=True,
                    capture_output=True,
                    text=True,
                ).stdout
                rows["in-process"].append(json.loads(out.strip().splitlines()[-1]))
                rows["http"].append(
                    over_http(
                        n,
                        model_url,
                        waves=waves,
                        profile=args.profile,
                        diagnose=args.diagnose,
                        per_session=args.client_per_session,
                        sample=args.sample,
                    )
                )
            medians = {mode: _median_row(runs) for mode, runs in rows.items()}
            for mode, row in medians.items():
                low, high = row["p99_spread"]
                spread = f"[{low:.0f}-{high:.0f}]"
                print(
                    f"{n:>4} {mode:>10} | {row['runs_per_s']:>7.1f} |"
                    f" {row['cpu_ms_per_turn']:>11.2f} |"
                    f" {row['p50_ms']:>7.1f} | {row['p99_ms']:>7.1f} {spread:>15} |"
                    f" {row['rss_kb_per_session']:>11.0f}"
                    f" | {row['events']:>7.0f} | {row['complete']}"
                )
            http, baseline = medians["http"], medians["in-process"]
            overhead = http["cpu_ms_per_turn"] / baseline["cpu_ms_per_turn"] - 1
            print(
                f"{'':>4} {'':>10}   HTTP+SSE CPU overhead per turn: {overhead:+.0%}"
                f" (in the kernel: {baseline['sys_ms_per_turn']:.2f} ms in-process,"
                f" {http['sys_ms_per_turn']:.2f} ms http)"
            )
            if args.diagnose:
                keys = [
                    key
                    for key in http
                    if key.startswith(("lag_", "ready_", "created_", "batched_"))
                ]
                last = rows["http"][-1]
                print(f"{'':>4} {'':>10}   p99 by kind (ms), last run: {last['slowest_kinds']}")
                print(
                    f"{'':>4} {'':>10}   created to published, p99 by kind (ms), last run: "
                    + last["created_to_publish_slowest"]
                )
                print(
                    f"{'':>4} {'':>10}   server loop: "
                    + ", ".join(f"{key} {http[key]:.1f}" for key in keys)
                )
            sys.stdout.flush()
    finally:
        _stop(model)


if __name__ == "__main__":
    main()
