"""What keeping a session's usage and cost totals costs a step save, early and late in a session.

Two sessions are saved step by step, interleaved so that machine load hits both alike: in
``calls`` each step publishes two ``ModelResponded`` events (the agent's and the
summarizer's) and a text delta, which the store adds to the session's totals in the step's
transaction; in ``baseline`` the same step publishes three text deltas of the same kind of
size (nothing to add). Both append the same history entries and environment change. It
prints the median save latency over the first and the last tenth of the steps: the totals
are updated from the step's new events only, so the late steps should cost what the early
ones do, and ``calls`` what ``baseline`` does, give or take noise.

Usage: python benchmarks/bench_session_totals.py [--steps 1000] [--quick]
       [--stores memory,sqlite,postgres] [--postgres postgresql://postgres@127.0.0.1:5432/test]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
import uuid
from pathlib import Path

from agent_flow.environment import Environment
from agent_flow.events import AgentEvent, ModelResponded, TextDelta
from agent_flow.history import AgentMessage, History, UserMessage
from agent_flow.sessions import SessionStore, SQLiteSessionStore, open_store
from agent_flow.tokens import ApproxCounter


def _call(run: str, seq: int, source: str) -> ModelResponded:
    return ModelResponded(
        run_id=run,
        seq=seq,
        iteration=seq,
        finish_reason="stop",
        prompt_tokens=1200 + seq,
        completion_tokens=80,
        tool_calls=1,
        duration_ms=250.0,
        source=source,  # type: ignore[arg-type]
        model="gpt-4o-mini",
        cost_usd=0.000228,
    )


def step_events(run: str, step: int, with_calls: bool) -> list[AgentEvent]:
    seq = 3 * step
    if with_calls:
        return [
            TextDelta(run_id=run, seq=seq, text="x" * 200),
            _call(run, seq + 1, "agent"),
            _call(run, seq + 2, "summarizer"),
        ]
    return [TextDelta(run_id=run, seq=seq + i, text="x" * 200) for i in range(3)]


def _open(target: str) -> SessionStore:
    # SQLite without an fsync per step: the fsync would drown what is measured here.
    if target.startswith("sqlite://"):
        return SQLiteSessionStore(target.removeprefix("sqlite://"), synchronous="normal")
    return open_store(target)


async def measure(target: str, steps: int) -> dict[str, list[float]]:
    latencies: dict[str, list[float]] = {"calls": [], "baseline": []}
    state = {
        name: (History(counter=ApproxCounter()), Environment(max_changes=16)) for name in latencies
    }
    async with _open(target) as store:
        ids = {name: (await store.create(task=name)).id for name in latencies}
        for step in range(steps):
            for name in latencies:
                history, environment = state[name]
                history.extend(
                    [UserMessage(content=f"step {step}"), AgentMessage(content=f"done {step}")]
                )
                environment.set("/extensions/progress", {"step": step})
                events = step_events(f"run-{name}", step, name == "calls")
                started = time.perf_counter()
                info = await store.save_step(
                    ids[name], history=history, environment=environment, events=events
                )
                latencies[name].append((time.perf_counter() - started) * 1000)
        assert info.model_calls == 0  # the baseline session, saved last
        calls = await store.info(ids["calls"])
        assert calls.model_calls == 2 * steps
        assert calls.cost_usd is not None
    return latencies


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--quick", action="store_true", help="200 steps, memory and SQLite")
    parser.add_argument("--stores", default="memory,sqlite")
    parser.add_argument("--postgres", default="postgresql://postgres@127.0.0.1:5432/test")
    args = parser.parse_args()
    steps = 200 if args.quick else args.steps
    stores = ["memory", "sqlite"] if args.quick else args.stores.split(",")
    tenth = max(1, steps // 10)
    print(f"{steps} steps per session; median step-save latency in ms (noisy on a shared machine)")
    print(f"{'store':<10}{'session':>10}{'first 10%':>11}{'last 10%':>10}")
    with tempfile.TemporaryDirectory() as folder:
        for kind in stores:
            schema = f"bench_{uuid.uuid4().hex[:10]}"
            target = {
                "memory": "memory://",
                "sqlite": f"sqlite://{Path(folder) / 'sessions.db'}",
                "postgres": f"{args.postgres}?schema={schema}",
            }[kind]
            try:
                latencies = asyncio.run(measure(target, steps))
            finally:
                if kind == "postgres":
                    import psycopg

                    with psycopg.connect(args.postgres, autocommit=True) as conn:
                        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
            for name, values in latencies.items():
                early = statistics.median(values[:tenth])
                late = statistics.median(values[-tenth:])
                print(f"{kind:<10}{name:>10}{early:>11.3f}{late:>10.3f}")


if __name__ == "__main__":
    main()
