"""Whole agent runs for bench_scale.py (part ``runs``): plain (DBOS off) or durable (on).

A run is `STEPS` steps against a local instant OpenAI-compatible model (tests/openai_server.py,
one per process): the model calls ``add`` once per turn until it has `steps` results, then
answers ``Done.``. Each step is saved to the store (`save_step`, timed by `TimedStore`).

- plain: `AgentExecutor` with the store, runs started by the process itself;
- durable: `DurableWorker` processes executing runs a `DurableClient` enqueued (DBOS on: the
  run is a workflow, each model call and tool call a checkpoint in the session store).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.openai_server import (
    OpenAIServer,
    Reply,
    completion_body,
    json_reply,
    sse_reply,
    text_chunks,
    tool_call_chunks,
)

CONCURRENCY = 10  # runs in flight per process


def _tool_arguments(tool: str, done: int, steps: int) -> dict[str, Any]:
    if tool == "update_plan":  # a loop-control tool every configured agent has
        return {
            "steps": [{"description": f"step {i}", "completed": i < done} for i in range(steps)]
        }
    return {"a": done, "b": 1}


def model(steps: int, tool: str = "add") -> Any:
    """An instant model: call `tool` until `steps` tool results came back, then answer.

    `tool` is ``add`` (the benches' own tool) or ``update_plan``.
    """

    def answer(request: Any) -> Reply:
        body = json.loads(request.raw_body)
        done = sum(1 for m in body["messages"] if m["role"] == "tool")
        stream = bool(body.get("stream"))
        if done < steps:
            arguments = json.dumps(_tool_arguments(tool, done, steps))
            calls = [(f"call_{done}", tool, arguments)]
            if stream:
                return sse_reply(tool_call_chunks(calls))
            return json_reply(completion_body(None, tool_calls=calls, finish_reason="tool_calls"))
        return sse_reply(text_chunks("Done.")) if stream else json_reply(completion_body("Done."))

    return answer


def model_server(steps: int, url: Any, stop: Any, tool: str = "add") -> None:
    """Serve `model` until `stop` is set, its address put on `url` (a process's target)."""

    async def main() -> None:
        async with OpenAIServer(handler=model(steps, tool)) as server:
            server.record = False
            url.put(server.base_url)
            await asyncio.to_thread(stop.wait)

    asyncio.run(main())


def config() -> Any:
    from agent_flow import AgentConfig, ContextConfig

    return AgentConfig(
        control_tools=False,
        context=ContextConfig(max_tokens=64_000),
        max_iterations=1000,
        stuck_threshold=1000,
    )


def tools(idempotent: bool = True) -> Any:
    """The ``add`` tool; `idempotent=False`: a durable run records each call's start first."""
    from agent_flow.tools import ToolExecutor, ToolPolicy, tool

    @tool(policy=ToolPolicy(idempotent=idempotent))
    def add(a: int, b: int) -> int:
        """Add two integers.

        Args:
            a: The first.
            b: The second.
        """
        return a + b

    return ToolExecutor([add])


class TimedStore:
    """A session store that times each `save_step` (everything else passes through)."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.latencies: list[float] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def save_step(self, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return await self._inner.save_step(*args, **kwargs)
        finally:
            self.latencies.append(time.perf_counter() - start)


async def run_seconds(store: Any, session_ids: list[str]) -> list[float]:
    """Each run's own duration: its first event to its `run_finished` (queue wait excluded)."""
    spans = []
    for sid in session_ids:
        events = await store.events(sid)
        assert events, sid
        assert events[-1].kind == "run_finished", (sid, [e.kind for e in events])
        spans.append((events[-1].timestamp - events[0].timestamp).total_seconds())
    return spans


async def plain_runs(store_url: str, runs: int, steps: int, concurrency: int) -> dict[str, Any]:
    """`runs` plain runs in this process, `concurrency` at a time."""
    from agent_flow import AgentExecutor, OpenAIClient
    from agent_flow.sessions import open_store

    async with OpenAIServer(handler=model(steps)) as server, open_store(store_url) as inner:
        server.record = False
        store = TimedStore(inner)
        llm = OpenAIClient("m", base_url=server.base_url, api_key="k")
        sessions = [(await inner.create(agent="bench")).id for _ in range(runs)]
        gate = asyncio.Semaphore(concurrency)

        async def one(sid: str) -> None:
            async with gate:
                agent = AgentExecutor(
                    llm, config=config(), tools=tools(), store=store, session_id=sid
                )
                async with agent:
                    outcome = await agent.run("Add the numbers.")
                assert outcome.final_text == "Done.", outcome

        started = time.time()
        await asyncio.gather(*(one(sid) for sid in sessions))
        ended = time.time()
        spans = await run_seconds(inner, sessions)
        await llm.aclose()
    return {"started": started, "ended": ended, "saves": store.latencies, "spans": spans}


def durable_config(system_url: str, concurrency: int) -> Any:
    from agent_flow.durable import DurableConfig

    return DurableConfig(
        enabled=True,
        system_database_url=system_url,
        worker_concurrency=concurrency,
        poll_seconds=0.05,
    )


@contextlib.asynccontextmanager
async def durable_worker(
    store_url: str, system_url: str, steps: int, concurrency: int, idempotent: bool = True
) -> Any:
    """A `DurableWorker` in this process, on its own instant model; yields its timed store."""
    from agent_flow import OpenAIClient
    from agent_flow.durable import DurableWorker
    from agent_flow.sessions import open_store

    async with OpenAIServer(handler=model(steps)) as server, open_store(store_url) as inner:
        server.record = False
        store = TimedStore(inner)
        llm = OpenAIClient("m", base_url=server.base_url, api_key="k")
        async with DurableWorker(
            durable_config(system_url, concurrency),
            store,
            config(),
            llm_factory=lambda _config: (llm, None),
            tools_factory=lambda _config: tools(idempotent),
        ):
            yield store
        await llm.aclose()


async def enqueue_and_wait(
    store: Any, client: Any, runs: int, poll: float = 0.05
) -> tuple[float, float, list[str]]:
    """Create `runs` sessions, enqueue a run on each, wait until every one succeeded.

    Returns the clock at the first enqueue, at the last run's end, and the session ids.
    """
    sessions = [(await store.create(agent="bench")).id for _ in range(runs)]
    started = time.time()
    handles = [await client.enqueue(sid, "Add the numbers.") for sid in sessions]
    ids = [handle.run_id for handle in handles]
    while True:
        listed = await client._client.list_workflows_async(
            workflow_ids=ids, load_input=False, load_output=False
        )
        failed = [w for w in listed if w.status not in ("SUCCESS", "PENDING", "ENQUEUED")]
        assert not failed, failed[0]
        if sum(w.status == "SUCCESS" for w in listed) == runs:
            ended = max(w.updated_at for w in listed) / 1000
            return started, ended, sessions
        await asyncio.sleep(poll)


def _xact_commits(admin_url: str, databases: list[str]) -> int:
    """Committed transactions of `databases` so far (read from the ``postgres`` database)."""
    import psycopg

    with psycopg.connect(admin_url.rpartition("/")[0] + "/postgres", autocommit=True) as conn:
        conn.execute("SELECT pg_stat_clear_snapshot()")
        row = conn.execute(
            "SELECT sum(xact_commit) FROM pg_stat_database WHERE datname = ANY(%s)", (databases,)
        ).fetchone()
    return int(row[0]) if row and row[0] is not None else 0


#: PostgreSQL flushes a backend's statistics when it has been idle a while: wait this long
#: before reading the commits of a phase.
STATS_FLUSH_SECONDS = 11.0


async def paired_runs(
    store_url: str, system_url: str, runs: int, steps: int, idempotent: bool = True
) -> dict[str, Any]:
    """`runs` pairs, one at a time in this process: a plain run, then a durable run.

    Alternating in one process cancels most of the drift of a loaded machine: each pair sees
    about the same load. Returns each run's own duration (queue wait excluded) and the CPU
    time of this process over it (worker, client and model server: the same in both modes),
    per mode; on PostgreSQL also the commits of the store's and the system database's (a
    phase of plain runs, then one of durable runs, each read after the statistics flush).
    """
    from agent_flow import AgentExecutor, OpenAIClient
    from agent_flow.durable import DurableClient

    async with durable_worker(store_url, system_url, steps, 1, idempotent) as store:
        inner = store._inner
        async with (
            OpenAIServer(handler=model(steps)) as server,
            DurableClient(durable_config(system_url, 1)) as client,
        ):
            server.record = False
            llm = OpenAIClient("m", base_url=server.base_url, api_key="k")

            async def plain_run() -> str:
                sid = (await inner.create(agent="bench")).id
                agent = AgentExecutor(
                    llm, config=config(), tools=tools(idempotent), store=store, session_id=sid
                )
                async with agent:
                    await agent.run("Add the numbers.")
                return sid

            async def durable_run() -> str:
                sid = (await inner.create(agent="bench")).id
                # Polled slowly: the run's span is read from its stored events, not from here.
                await (await client.enqueue(sid, "Add the numbers.")).outcome(poll_seconds=0.25)
                return sid

            plain, durable, cpu_off, cpu_on = [], [], [], []
            for _ in range(runs + 1):  # the first pair warms up (imports, connections)
                cpu = time.process_time()
                plain.append(await plain_run())
                cpu_off.append(time.process_time() - cpu)
                cpu = time.process_time()
                durable.append(await durable_run())
                cpu_on.append(time.process_time() - cpu)
            commits: dict[str, float] = {}
            if store_url.startswith("postgres"):
                databases = [
                    store_url.partition("?")[0].rpartition("/")[2],
                    system_url.rpartition("/")[2],
                ]
                phase = min(runs, 5)
                for mode, one in (("off", plain_run), ("on", durable_run)):
                    await asyncio.sleep(STATS_FLUSH_SECONDS)
                    before = _xact_commits(system_url, databases)
                    for _ in range(phase):
                        await one()
                    await asyncio.sleep(STATS_FLUSH_SECONDS)
                    after = _xact_commits(system_url, databases)
                    commits[mode] = (after - before) / phase
            await llm.aclose()
        return {
            "off": (await run_seconds(inner, plain))[1:],
            "on": (await run_seconds(inner, durable))[1:],
            "cpu_off": cpu_off[1:],
            "cpu_on": cpu_on[1:],
            "commits": commits,
        }


def _paired(
    store_url: str, system_url: str, runs: int, steps: int, idempotent: bool
) -> dict[str, Any]:
    return asyncio.run(paired_runs(store_url, system_url, runs, steps, idempotent))


async def durable_in_one_process(
    store_url: str, system_url: str, runs: int, steps: int, concurrency: int
) -> dict[str, Any]:
    """Durable runs enqueued and executed by this one process (the SQLite deployment)."""
    from agent_flow.durable import DurableClient

    async with durable_worker(store_url, system_url, steps, concurrency) as store:
        async with DurableClient(durable_config(system_url, concurrency)) as client:
            started, ended, sessions = await enqueue_and_wait(store._inner, client, runs)
        spans = await run_seconds(store._inner, sessions)
    return {"started": started, "ended": ended, "saves": store.latencies, "spans": spans}


def worker_process(
    store_url: str, system_url: str, steps: int, concurrency: int, ready: Any, stop: Any, out: Any
) -> None:
    """A durable worker process: executes runs until `stop`, then reports its save latencies."""

    async def main() -> None:
        async with durable_worker(store_url, system_url, steps, concurrency) as store:
            ready.set()
            await asyncio.to_thread(stop.wait)
            out.put(store.latencies)

    asyncio.run(main())


def new_id() -> str:
    return uuid.uuid4().hex[:8]


# -- orchestration (the main process) ---------------------------------------------------------


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))] if ordered else 0.0


class Postgres:
    """Fresh names on the benchmark's server: a store schema and a DBOS system database."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.made: list[tuple[str, str]] = []

    def store(self) -> str:
        schema = f"af_bench_{new_id()}"
        self.made.append(("schema", schema))
        return f"{self.url}{'&' if '?' in self.url else '?'}schema={schema}"

    def system(self) -> str:
        import psycopg
        from psycopg import sql

        database = f"af_bench_dbos_{new_id()}"
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(database)))
        self.made.append(("database", database))
        return f"{self.url.rpartition('/')[0]}/{database}"

    def drop(self) -> None:
        import psycopg
        from psycopg import sql

        with psycopg.connect(self.url, autocommit=True) as conn:
            for kind, name in self.made:
                if kind == "schema":
                    conn.execute(
                        sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name))
                    )
                else:
                    conn.execute(
                        sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                            sql.Identifier(name)
                        )
                    )
        self.made.clear()


def _plain(store_url: str, runs: int, steps: int, concurrency: int) -> dict[str, Any]:
    return asyncio.run(plain_runs(store_url, runs, steps, concurrency))


def _durable_one(
    store_url: str, system_url: str, runs: int, steps: int, concurrency: int
) -> dict[str, Any]:
    return asyncio.run(durable_in_one_process(store_url, system_url, runs, steps, concurrency))


async def _calibration(pg_url: str, system_url: str, count: int = 50) -> dict[str, Any]:
    """What one PostgreSQL round trip and one empty DBOS step cost on this machine now."""
    import psycopg
    from dbos import DBOS

    async def empty() -> str:
        return ""

    @DBOS.workflow(name="bench_scale.calibrate")
    async def steps() -> float:
        start = time.perf_counter()
        for _ in range(count):
            await DBOS.run_step_async({"name": "empty"}, empty)
        return (time.perf_counter() - start) / count

    DBOS(config={"name": "bench_scale", "system_database_url": system_url, "log_level": "WARNING"})
    DBOS.launch()
    try:
        step = min([await steps() for _ in range(3)])
    finally:
        DBOS.destroy()
    async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as conn:
        start = time.perf_counter()
        for _ in range(count):
            await conn.execute("SELECT 1")
        trip = (time.perf_counter() - start) / count
    return {"step": step, "trip": trip}


def _calibrate(pg_url: str, system_url: str) -> dict[str, Any]:
    return asyncio.run(_calibration(pg_url, system_url))


def in_child(fn: Any, *args: Any) -> dict[str, Any]:
    """Run `fn(*args)` in a fresh process (DBOS is one per process) and return its result."""
    import multiprocessing

    with multiprocessing.get_context("spawn").Pool(1) as pool:
        result: dict[str, Any] = pool.apply(fn, args)
    return result


def plain_processes(store_url: str, runs: int, steps: int, workers: int) -> dict[str, Any]:
    import multiprocessing

    shares = [runs // workers + (1 if i < runs % workers else 0) for i in range(workers)]
    with multiprocessing.get_context("spawn").Pool(workers) as pool:
        results = pool.starmap(_plain, [(store_url, n, steps, CONCURRENCY) for n in shares])
    return {
        "started": min(r["started"] for r in results),
        "ended": max(r["ended"] for r in results),
        "saves": [x for r in results for x in r["saves"]],
        "spans": [x for r in results for x in r["spans"]],
    }


async def durable_processes(
    store_url: str, system_url: str, runs: int, steps: int, workers: int
) -> dict[str, Any]:
    """`workers` worker processes execute `runs` runs this process enqueues."""
    import multiprocessing

    from agent_flow.durable import DurableClient
    from agent_flow.sessions import open_store

    context = multiprocessing.get_context("spawn")
    async with DurableClient(durable_config(system_url, CONCURRENCY)) as client:
        stop, out = context.Event(), context.Queue()
        readies = [context.Event() for _ in range(workers)]
        procs = [
            context.Process(
                target=worker_process,
                args=(store_url, system_url, steps, CONCURRENCY, ready, stop, out),
            )
            for ready in readies
        ]
        for proc in procs:
            proc.start()
        try:
            for ready in readies:
                await asyncio.to_thread(ready.wait, 120)
            async with open_store(store_url) as store:
                started, ended, sessions = await enqueue_and_wait(store, client, runs)
                spans = await run_seconds(store, sessions)
            stop.set()
            saves = [x for _ in procs for x in await asyncio.to_thread(out.get, True, 60)]
        finally:
            stop.set()
            for proc in procs:
                await asyncio.to_thread(proc.join, 30)
                if proc.is_alive():
                    proc.kill()
    return {"started": started, "ended": ended, "saves": saves, "spans": spans}


def row(label: str, workers: int, runs: int, steps: int, result: dict[str, Any]) -> float:
    """Print one table row; return the mean ms per step of a run."""
    elapsed = result["ended"] - result["started"]
    per_step = statistics.fmean(result["spans"]) / steps * 1000
    saves = result["saves"]
    print(
        f"{label:<18}{workers:>8}{runs / elapsed:>9.1f}{runs * steps / elapsed:>9.0f}"
        f"{per_step:>10.2f}{percentile(saves, 0.5) * 1000:>9.2f}"
        f"{percentile(saves, 0.99) * 1000:>9.2f}",
        flush=True,
    )
    assert len(result["spans"]) == runs
    return per_step


HEADER = (
    f"{'configuration':<18}{'workers':>8}{'runs/s':>9}{'steps/s':>9}{'ms/step':>10}"
    f"{'save p50':>9}{'save p99':>9}"
)


COST_HEADER = f"""
1. durability cost per step: {{seq}} pairs of runs x {{steps}} steps, one run at a time,
   DBOS off then on, alternating in one process; ms/step is a run's own duration (first
   event to run_finished) / steps, median of the runs
   (CPU: this process's, worker, client and model server, over each run; commits: the
   store's and system database's per step, PostgreSQL only, from pg_stat_database)
{"store, tool":<24}{"DBOS off":>10}{"DBOS on":>10}{"cost":>8}{"cost p25-p75":>16}\
{"CPU cost":>10}{"commits off/on":>16}"""


def bench_runs(args: Any, workers: list[int]) -> None:
    """Part ``runs`` of bench_scale.py (see its doc)."""
    import tempfile

    pg = Postgres(args.postgres)
    steps, seq = args.steps, args.sequential
    try:
        with tempfile.TemporaryDirectory() as folder:
            where = Path(folder)

            def sqlite(name: str) -> tuple[str, str]:
                return f"sqlite://{where / name}.db", f"sqlite:///{where / name}.dbos"

            calibration = in_child(_calibrate, pg.url, pg.system())
            print(
                f"\n0. this machine now: a PostgreSQL round trip {calibration['trip'] * 1000:.2f} "
                f"ms, an empty DBOS step on PostgreSQL {calibration['step'] * 1000:.2f} ms"
            )
            if seq > 0:
                print(COST_HEADER.format(seq=seq, steps=steps))
            kinds = [(k, i) for k in ("sqlite", "postgres") for i in (True, False)]
            for kind, idempotent in kinds if seq > 0 else ():
                store, system = sqlite("seq") if kind == "sqlite" else (pg.store(), pg.system())
                result = in_child(_paired, store, system, seq, steps, idempotent)
                label = f"{kind}, {'idempotent' if idempotent else 'not idempotent'}"
                off = [x / steps * 1000 for x in result["off"]]
                on = [x / steps * 1000 for x in result["on"]]
                costs = [b - a for a, b in zip(off, on, strict=True)]
                cpu = [
                    (b - a) / steps * 1000
                    for a, b in zip(result["cpu_off"], result["cpu_on"], strict=True)
                ]
                commits = result["commits"]
                shown = (
                    f"{commits['off'] / steps:.1f} / {commits['on'] / steps:.1f}"
                    if commits
                    else "-"
                )
                print(
                    f"{label:<24}{statistics.median(off):>10.2f}{statistics.median(on):>10.2f}"
                    f"{statistics.median(costs):>8.2f}"
                    f"{percentile(costs, 0.25):>8.2f}..{percentile(costs, 0.75):<6.2f}"
                    f"{statistics.median(cpu):>10.2f}{shown:>16}",
                    flush=True,
                )
            if seq > 0:
                print("   (goal: durability adds <= 2 ms/step on PostgreSQL)")

            runs = args.runs
            print(f"\n2. throughput: {runs} runs x {steps} steps, {CONCURRENCY} in flight/process")
            print(HEADER)
            store, system = sqlite("one")
            result = in_child(_plain, store, runs, steps, CONCURRENCY)
            row("sqlite DBOS off", 1, runs, steps, result)
            store, system = sqlite("one2")
            row(
                "sqlite DBOS on",
                1,
                runs,
                steps,
                in_child(_durable_one, store, system, runs, steps, CONCURRENCY),
            )
            for count in workers:
                row(
                    "postgres DBOS off",
                    count,
                    runs,
                    steps,
                    plain_processes(pg.store(), runs, steps, count),
                )
                result = asyncio.run(durable_processes(pg.store(), pg.system(), runs, steps, count))
                row("postgres DBOS on", count, runs, steps, result)
    finally:
        pg.drop()
