"""Memory of the real `agent-flow serve` and `agent-flow worker` processes: idle, then after runs.

Each process is started from the command line as a deployment starts it (its agent from an
``agent.toml`` whose model is a local instant server in a process of its own), and its
resident memory (``VmRSS``) read from /proc:

- idle: once it answers (serve: its first HTTP answer; worker: once it has been listening for
  queued runs a few seconds), before any run;
- after N runs: N runs of K tool steps (the model calls ``update_plan`` K times, then
  answers), one after another (serve: a session and a message each over HTTP, read to their
  end on the session's event stream; worker: enqueued through `DurableClient`, each waited
  for);
- the tokenizer's share: the same process's model counts tokens with tiktoken's
  ``cl100k_base`` (the model ``m`` is not known to tiktoken); the same rows with
  ``counter = 'approx'`` (no tokenizer loaded) show what the tokenizer costs a process.

For scale: a bare interpreter that imported the openai SDK (what any loop on it pays).

The worker needs PostgreSQL (DBOS's system database and the session store, in a database made
for the run and dropped after); without it only serve is measured.

Usage: python benchmarks/bench_process_memory.py [--runs 100] [--k 2]
    [--postgres postgresql://postgres@127.0.0.1:5432/test]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

sys.path.insert(0, str(ROOT / "benchmarks"))

from _bench_runs import model_server  # noqa: E402  (found through sys.path, set above)
from bench_server import _rss_mb as rss_mb  # noqa: E402
from bench_server import _stop  # noqa: E402

from tests.server_harness import free_port  # noqa: E402


def _config(folder: Path, base_url: str, counter: str, durable: str | None) -> Path:
    path = folder / f"agent-{counter}.toml"
    text = (
        "[agent]\nname = 'memory'\n"
        f"[agent.llm]\nmodel = 'm'\nbase_url = '{base_url}'\napi_key_env = 'BENCH_MEMORY_KEY'\n"
        f"[agent.context]\ncounter = '{counter}'\n"
    )
    if durable is not None:
        text += f"[durable]\nenabled = true\nsystem_database_url = '{durable}'\n"
    path.write_text(text)
    return path


def _start(command: list[str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as errors:
        return subprocess.Popen(
            command,
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=errors,
            env={**os.environ, "BENCH_MEMORY_KEY": "k"},
        )


async def _serve_runs(port: int, runs: int, process: subprocess.Popen[bytes]) -> float:
    """Wait for serve to answer; its idle RSS; then `runs` runs over HTTP, one at a time."""
    import httpx2

    async with httpx2.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=60) as http:
        for _ in range(800):
            if process.poll() is not None:
                raise RuntimeError("serve exited at start")
            try:
                await http.get("/sessions")
                break
            except httpx2.ConnectError:
                await asyncio.sleep(0.025)
        await asyncio.sleep(2.0)
        idle = rss_mb(process.pid)
        for _ in range(runs):
            sid = (await http.post("/sessions", json={})).json()["id"]
            async with http.stream("GET", f"/sessions/{sid}/events") as events:
                posted = await http.post(f"/sessions/{sid}/messages", json={"message": "Plan."})
                assert posted.status_code < 300, posted.text
                async for line in events.aiter_lines():
                    if line.startswith("event: run_finished"):
                        break
        return idle


def measure_serve(folder: Path, base_url: str, counter: str, runs: int) -> tuple[float, float]:
    config = _config(folder, base_url, counter, None)
    port = free_port()
    command = [
        sys.executable, "-m", "agent_flow.cli", "serve", "--config", str(config),
        "--db", str(folder / f"serve-{counter}.db"), "--port", str(port), "--no-token",
    ]  # fmt: skip
    process = _start(command, folder / f"serve-{counter}.log")
    try:
        idle = asyncio.run(_serve_runs(port, runs, process))
        after = rss_mb(process.pid)
    finally:
        _stop(process)
    return idle, after


async def _worker_runs(store_url: str, system_url: str, runs: int) -> None:
    from agent_flow.durable import DurableClient, DurableConfig
    from agent_flow.sessions import open_store

    durable = DurableConfig(enabled=True, system_database_url=system_url)
    async with open_store(store_url) as store, DurableClient(durable) as client:
        for _ in range(runs):
            info = await store.create(agent="memory")
            handle = await client.enqueue(info.id, "Plan.")
            await asyncio.wait_for(handle.outcome(poll_seconds=0.05), 120)


def measure_worker(
    folder: Path, base_url: str, counter: str, runs: int, admin_url: str
) -> tuple[float, float]:
    import psycopg
    from psycopg import sql

    database = f"af_memory_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(database)))
    system_url = f"{admin_url.rpartition('/')[0]}/{database}"
    store_url = f"{system_url}?schema=sessions"
    config = _config(folder, base_url, counter, system_url)
    command = [
        sys.executable, "-m", "agent_flow.cli", "worker", "--config", str(config),
        "--db", store_url, "--system-db", system_url,
    ]  # fmt: skip
    log = folder / f"worker-{counter}.log"
    process = _start(command, log)
    try:
        time.sleep(8.0)  # started: DBOS launched, listening, the tokenizer loaded
        if process.poll() is not None:
            raise RuntimeError(f"the worker exited: {log.read_text()[-2000:]}")
        idle = rss_mb(process.pid)
        asyncio.run(_worker_runs(store_url, system_url, runs))
        after = rss_mb(process.pid)
    finally:
        _stop(process)
        with psycopg.connect(admin_url, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(database))
            )
    return idle, after


def _bare_openai() -> float:
    code = (
        "import openai, pathlib\n"
        "print([l for l in pathlib.Path('/proc/self/status').read_text().splitlines()"
        " if l.startswith('VmRSS:')][0].split()[1])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return int(out.stdout) / 1024


def _postgres_up(url: str) -> bool:
    try:
        import psycopg

        with psycopg.connect(url, connect_timeout=3):
            return True
    except Exception:
        return False


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--k", type=int, default=2, help="tool steps per run")
    parser.add_argument("--postgres", default="postgresql://postgres@127.0.0.1:5432/test")
    args = parser.parse_args()
    context = multiprocessing.get_context("spawn")
    stop, url = context.Event(), context.Queue()
    server = context.Process(target=model_server, args=(args.k, url, stop, "update_plan"))
    server.start()
    rows: list[tuple[str, str, float, float]] = []
    try:
        base_url = url.get(timeout=60)
        with tempfile.TemporaryDirectory() as name:
            folder = Path(name)
            for counter in ("tiktoken", "approx"):
                idle, after = measure_serve(folder, base_url, counter, args.runs)
                rows.append(("agent-flow serve (SQLite)", counter, idle, after))
            if _postgres_up(args.postgres):
                for counter in ("tiktoken", "approx"):
                    idle, after = measure_worker(
                        folder, base_url, counter, args.runs, args.postgres
                    )
                    rows.append(("agent-flow worker (PostgreSQL)", counter, idle, after))
            else:
                print(f"no PostgreSQL at {args.postgres}: the worker is not measured")
    finally:
        stop.set()
        server.join(30)
    load = os.getloadavg()[0]
    print(
        f"RSS of each process (MB); {args.runs} runs of {args.k} tool steps one after another;"
        f" load {load:.2f} on {os.cpu_count()} cores"
    )
    print(f"{'process':<32}{'counter':>10}{'idle':>9}{'after runs':>12}")
    for process, counter, idle, after in rows:
        print(f"{process:<32}{counter:>10}{idle:>9.1f}{after:>12.1f}")
    print(f"{'python + import openai':<32}{'':>10}{_bare_openai():>9.1f}")


if __name__ == "__main__":
    main()
