"""Step-save latency and throughput of the session stores: PostgreSQL against SQLite.

What it measures: the store part of a run only. Each "run" is a session of ``--steps`` steps;
a step adds what an agent step adds (an assistant turn with a tool call, its result, one
environment change, two events) and is saved with `SessionStore.save_step`: one transaction
appending only what is new. ``--runs`` runs are split over W worker processes, each with its
own store object (its own connection or pool), all writing into one database; per W it reports
runs/s and steps/s (from when every worker is connected to when the last one is done) and the
step-save latency p50/p99 seen by the workers. A run's ``create`` is inside the clock.

Stores: ``sqlite-full`` (the default store: an fsync per step), ``sqlite-normal`` (no fsync
per step) and ``postgres`` (a fresh schema on ``--postgres``, dropped at the end).

Part ``runs`` (benchmarks/_bench_runs.py): whole agent runs of ``--steps`` steps against a local
instant OpenAI-compatible model (one per process), DBOS off (plain `AgentExecutor` runs) and
on (`DurableWorker` processes executing runs a `DurableClient` enqueued on the DBOS queue):

1. durability cost per step: one process, one run at a time (``--sequential`` runs), on
   SQLite (store and DBOS system database: the one-machine deployment) and on PostgreSQL;
   ms/step is a run's own duration (first event to ``run_finished``, from the stored event
   timestamps: the queue wait is not in it) over its steps; cost = on - off; with the
   agent's tool idempotent (its records ride with the step's save) and not (each call's
   start and result are stored in transactions of their own);
2. throughput: ``--runs`` runs, 10 in flight per process: SQLite in one process (the
   baseline), PostgreSQL with W worker processes (the main process enqueues and waits).

Part ``idle`` (benchmarks/_bench_idle.py): one durable worker with nothing queued, at the default
``poll_seconds`` and at 0.05 s: its CPU ms per second, the system database's commits per
second, how soon a run enqueued then starts, and its RSS idle and after 100 runs.

Numbers taken on a loaded machine are noisy: compare rows of one invocation only.

Usage: python benchmarks/bench_scale.py [--quick] [--part stores,runs,idle] [--runs 200]
       [--steps 10] [--workers 1,2,4] [--sequential 20]
       [--postgres postgresql://postgres@127.0.0.1:5432/test] [--stores sqlite-full,postgres]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from agent_flow.environment import Environment
from agent_flow.events import AgentEvent, TextDelta, ToolCallCompleted
from agent_flow.history import AgentMessage, History, ToolCallEntry, ToolResultEntry, UserMessage
from agent_flow.messages import ToolCall
from agent_flow.sessions import SessionStore, SQLiteSessionStore, open_store
from agent_flow.tokens import ApproxCounter

RESULT = "def parse(line):\n    return line.split(',')  # field separator\n" * 3


def add_step(history: History, environment: Environment, run: str, step: int) -> list[AgentEvent]:
    call_id = f"call_{step}"
    history.extend(
        [
            AgentMessage(content=f"Step {step}: reading the next file."),
            ToolCallEntry(
                call=ToolCall(id=call_id, name="read_file", arguments=f'{{"path": "m{step}.py"}}')
            ),
            ToolResultEntry(call_id=call_id, tool_name="read_file", content=RESULT),
        ]
    )
    environment.set("/extensions/progress", {"step": step})
    return [
        TextDelta(run_id=run, seq=2 * step, text=f"Step {step}"),
        ToolCallCompleted(
            run_id=run,
            seq=2 * step + 1,
            call_id=call_id,
            name="read_file",
            content=RESULT,
            duration_ms=0.1,
        ),
    ]


async def worker(
    target: str, runs: int, steps: int, barrier: Any
) -> tuple[float, float, list[float]]:
    """Write `runs` sessions of `steps` steps once every worker is ready.

    Returns when it started and ended (wall clock) and each save's latency, in seconds.
    """
    latencies: list[float] = []
    store: SessionStore = (
        SQLiteSessionStore(target.removeprefix("normal:"), synchronous="normal")
        if target.startswith("normal:")
        else open_store(target)
    )
    async with store:
        await store.list(limit=1)  # connected and migrated before the clock starts
        barrier.wait()
        started = time.time()
        for _ in range(runs):
            history, environment = History(counter=ApproxCounter()), Environment()
            history.add(UserMessage(content="fix the parser"))
            info = await store.create(title="bench")
            run = uuid.uuid4().hex[:8]
            for step in range(steps):
                events = add_step(history, environment, run, step)
                status = "completed" if step == steps - 1 else None
                start = time.perf_counter()
                await store.save_step(
                    info.id, history=history, environment=environment, events=events, status=status
                )
                latencies.append(time.perf_counter() - start)
        ended = time.time()
    return started, ended, latencies


def run_worker(
    target: str, runs: int, steps: int, barrier: Any
) -> tuple[float, float, list[float]]:
    return asyncio.run(worker(target, runs, steps, barrier))


def target_for(store: str, folder: Path, postgres: str, schema: str) -> str:
    if store == "postgres":
        return f"{postgres}{'&' if '?' in postgres else '?'}schema={schema}"
    path = folder / f"{store}.db"
    # open_store opens SQLite with synchronous=FULL; `worker` builds the "normal" variant.
    return f"normal:{path}" if store == "sqlite-normal" else str(path)


def measure(target: str, runs: int, steps: int, workers: int) -> tuple[float, list[float]]:
    shares = [runs // workers + (1 if i < runs % workers else 0) for i in range(workers)]
    context = multiprocessing.get_context("spawn")
    with context.Manager() as manager, context.Pool(workers) as pool:
        barrier = manager.Barrier(workers)
        results = pool.starmap(run_worker, [(target, share, steps, barrier) for share in shares])
    elapsed = max(end for _, end, _ in results) - min(start for start, _, _ in results)
    return elapsed, [latency for _, _, latencies in results for latency in latencies]


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def drop_schema(postgres: str, schema: str) -> None:
    import psycopg
    from psycopg import sql

    with psycopg.connect(postgres, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="defaults of 40 runs, 1-2 workers, 5 sequential"
    )
    parser.add_argument(
        "--part", default="stores,runs,idle", help="any of stores, runs, idle (comma-separated)"
    )
    parser.add_argument("--runs", type=int)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--workers")
    parser.add_argument("--sequential", type=int, help="pairs of the cost part (0: skip it)")
    parser.add_argument("--stores", default="sqlite-full,sqlite-normal,postgres")
    parser.add_argument("--postgres", default="postgresql://postgres@127.0.0.1:5432/test")
    args = parser.parse_args()
    quick = {"runs": 40, "workers": "1,2", "sequential": 5}
    full = {"runs": 200, "workers": "1,2,4", "sequential": 20}
    for name, value in (quick if args.quick else full).items():
        if getattr(args, name) is None:  # what the command line gives wins
            setattr(args, name, value)
    workers = [int(w) for w in args.workers.split(",")]
    parts = args.part.split(",")
    if "stores" in parts:
        bench_stores(args, workers)
    if "runs" in parts:
        from _bench_runs import bench_runs

        bench_runs(args, workers)
    if "idle" in parts:
        from _bench_idle import bench_idle

        bench_idle(args)


def bench_stores(args: argparse.Namespace, workers: list[int]) -> None:
    print(
        f"{args.runs} runs x {args.steps} steps per configuration; latency of one save_step "
        "as seen by the writing process"
    )
    print(f"{'store':<14}{'workers':>8}{'runs/s':>10}{'steps/s':>10}{'p50 ms':>9}{'p99 ms':>9}")
    with tempfile.TemporaryDirectory() as folder:
        for store in args.stores.split(","):
            for count in workers:
                schema = f"af_bench_{uuid.uuid4().hex[:8]}"
                target = target_for(store, Path(folder) / f"w{count}", args.postgres, schema)
                try:
                    elapsed, latencies = measure(target, args.runs, args.steps, count)
                finally:
                    if store == "postgres":
                        drop_schema(args.postgres, schema)
                print(
                    f"{store:<14}{count:>8}{args.runs / elapsed:>10.1f}"
                    f"{len(latencies) / elapsed:>10.0f}"
                    f"{percentile(latencies, 0.5) * 1000:>9.2f}"
                    f"{percentile(latencies, 0.99) * 1000:>9.2f}",
                    flush=True,
                )
                assert len(latencies) == args.runs * args.steps
                assert statistics.fmean(latencies) > 0


if __name__ == "__main__":
    main()
