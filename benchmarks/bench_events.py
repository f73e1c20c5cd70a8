"""What a subscriber's policy costs a publisher: the event bus now against the bus before it.

The baseline is the bus as it was before ``drop_deltas_first`` (``agent_flow/events/bus.py`` at
``--baseline-rev``, loaded from git beside the current one), measured in the same run on the
same events: a run's mix of 90% text deltas and 10% lifecycle events.

Cases, each the cost of one ``publish`` (microseconds, best of ``--repeat``):

- three readers that keep up (each publish is followed by one turn of the event loop, in
  which they read it), default subscriptions (``"wait"``);
- a bounded subscriber (64) whose reader keeps up: nothing is ever dropped (``"wait"`` was
  the default before, ``"drop_deltas_first"`` is now);
- a bounded subscriber (64) nobody reads: every publish drops one event
  (``drop_oldest`` before and now; ``drop_deltas_first`` now);
- a bounded subscriber (2,000) nobody reads, whose queue fills with lifecycle events first
  (2,000 of them, then the mix): ``drop_deltas_first`` must look past them for a delta.

Usage: python benchmarks/bench_events.py [--events 20000] [--repeat 5] [--baseline-rev REV]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from agent_flow.events import AgentEvent, TextDelta, ToolCallCompleted
from agent_flow.events import bus as current

ROOT = Path(__file__).resolve().parents[1]
BASELINE_REV = "1ea7fab89f82b7ae964ba1b371d7bcd61f781721"


def baseline_bus(rev: str) -> ModuleType:
    source = subprocess.run(
        ["git", "-C", str(ROOT), "show", f"{rev}:agent_flow/events/bus.py"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    path = Path(tempfile.mkdtemp()) / "baseline_bus.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("baseline_bus", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def mixed(count: int, *, lifecycle_first: int = 0) -> list[AgentEvent]:
    events: list[AgentEvent] = []
    for seq in range(count):
        if seq < lifecycle_first or seq % 10 == 9:
            events.append(
                ToolCallCompleted(
                    run_id="r", seq=seq, call_id="c", name="t", content="ok", duration_ms=1.0
                )
            )
        else:
            events.append(TextDelta(run_id="r", seq=seq, text="word "))
    return events


async def publish_all(
    module: ModuleType, events: Sequence[AgentEvent], subscribe: Callable[[Any], list[Any]]
) -> float:
    bus = module.EventBus()
    subscriptions = subscribe(bus)
    readers = [asyncio.create_task(drain(s)) for s in subscriptions if s is not None]
    started = time.perf_counter()
    if readers:
        for event in events:
            await bus.publish(event)
            await asyncio.sleep(0)  # the readers take it: they keep up
    else:
        for event in events:
            await bus.publish(event)
    elapsed = time.perf_counter() - started
    bus.close()
    for reader in readers:
        reader.cancel()
    return elapsed / len(events) * 1e6


async def drain(subscription: Any) -> None:
    async for _ in subscription:
        pass


async def case(
    module: ModuleType, events: Sequence[AgentEvent], policy: str, *, read: bool, size: int
) -> float:
    kept: list[Any] = []

    def subscribe(bus: Any) -> list[Any]:
        subscription = bus.subscribe(maxsize=size, policy=policy)
        kept.append(subscription)  # held, never read
        return []

    if read:
        return await publish_all(
            module, events, lambda bus: [bus.subscribe(maxsize=size, policy=policy)]
        )
    return await publish_all(module, events, subscribe)


async def measure(args: argparse.Namespace) -> None:
    old = baseline_bus(args.baseline_rev)
    events = mixed(args.events)
    lifecycle_heavy = mixed(args.events, lifecycle_first=2000)

    async def best(fn: Callable[[], Any]) -> float:
        return min([await fn() for _ in range(args.repeat)])

    runs: list[tuple[str, str, Callable[[], Any]]] = [
        (
            "3 readers keeping up (wait)",
            "before",
            lambda: publish_all(old, events, lambda b: [b.subscribe() for _ in range(3)]),
        ),
        (
            "3 readers keeping up (wait)",
            "now",
            lambda: publish_all(current, events, lambda b: [b.subscribe() for _ in range(3)]),
        ),
        (
            "bounded 64, reader keeping up",
            "before, wait (its default)",
            lambda: case(old, events, "wait", read=True, size=64),
        ),
        (
            "bounded 64, reader keeping up",
            "now, drop_deltas_first",
            lambda: case(current, events, "drop_deltas_first", read=True, size=64),
        ),
        (
            "bounded 64, never read",
            "before, drop_oldest",
            lambda: case(old, events, "drop_oldest", read=False, size=64),
        ),
        (
            "bounded 64, never read",
            "now, drop_oldest",
            lambda: case(current, events, "drop_oldest", read=False, size=64),
        ),
        (
            "bounded 64, never read",
            "now, drop_deltas_first",
            lambda: case(current, events, "drop_deltas_first", read=False, size=64),
        ),
        (
            "bounded 2000, lifecycle events first",
            "before, drop_oldest",
            lambda: case(old, lifecycle_heavy, "drop_oldest", read=False, size=2000),
        ),
        (
            "bounded 2000, lifecycle events first",
            "now, drop_deltas_first",
            lambda: case(current, lifecycle_heavy, "drop_deltas_first", read=False, size=2000),
        ),
    ]
    results = {(name, who): await best(fn) for name, who, fn in runs}
    print(f"{'case':<38} {'bus':<24} {'us/publish':>10}")
    for (name, who), value in results.items():
        print(f"{name:<38} {who:<24} {value:>10.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--baseline-rev", default=BASELINE_REV)
    asyncio.run(measure(parser.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
