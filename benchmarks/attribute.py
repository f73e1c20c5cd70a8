"""Attribute a profile of bench_loop to packages: where a model turn's CPU goes.

Record a child run of `bench_loop` with this script's own sampler, which samples the main
thread every millisecond of the process's CPU time (``ITIMER_PROF``: idle waits are never
sampled, however loaded the machine), and print the tables::

    python benchmarks/attribute.py --record /tmp/af.txt [--stream] [--concurrent] [--runs 100]

or record with py-spy and read its raw output here (py-spy may sample idle threads, such as
the worker threads of ``asyncio.to_thread``, as busy on a loaded machine)::

    py-spy record -r 2000 -f raw -o /tmp/af.txt -- \\
        python benchmarks/bench_loop.py --child --loop agent_flow --k-one 10 --runs 100
    python benchmarks/attribute.py /tmp/af.txt --turns 1111

Samples taken while importing or loading the tokenizer (the warm-up) are left out. Two
tables: by the package of the function on top of the stack (its own time), and by who asked
for it: the innermost agent_flow module on the stack (the time agent_flow's code causes,
whatever library does the work), else the package on top.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import signal
import sys
import time
from collections import Counter
from pathlib import Path
from types import FrameType

_FRAME = re.compile(r"\(([^:()]+):\d+\)$")
_WARM_UP = ("_find_and_load", "load_tiktoken_bpe", "_load_encoding", "_installed_encoding")


def package(path: str) -> str:
    """The package of a py-spy frame's short path (agent_flow by subpackage)."""
    parts = path.split("/")
    if parts[0] == "agent_flow" and len(parts) > 1:
        return "agent_flow." + parts[1].removesuffix(".py")
    if parts[0] == "asyncio":
        return "asyncio"
    if len(parts) == 1:
        return "(scripts and stdlib modules)" if path.endswith(".py") else path
    return parts[0]


_INTERVAL = 0.001  # seconds of process CPU time between samples


def _short(path: str, roots: list[str]) -> str:
    """`path` relative to the longest import root holding it (as py-spy shortens it)."""
    for root in roots:
        if path.startswith(root):
            return path[len(root) :]
    return path


class Sampler:
    """Samples the main thread's stack every `_INTERVAL` of the process's CPU time.

    Use as a context manager around the work to sample, then `write` the collapsed stacks
    (py-spy's raw format: one stack a line, frames joined by ``;``, then its count).
    """

    def __init__(self) -> None:
        self.stacks: Counter[str] = Counter()
        self.cpu = 0.0
        self._roots = sorted({p.rstrip("/") + "/" for p in sys.path if p}, key=len, reverse=True)
        self._start = 0.0

    def _sample(self, signum: int, frame: FrameType | None) -> None:
        frames = []
        while frame is not None:
            code = frame.f_code
            frames.append(
                f"{code.co_name} ({_short(code.co_filename, self._roots)}:{frame.f_lineno})"
            )
            frame = frame.f_back
        self.stacks[";".join(reversed(frames))] += 1

    def __enter__(self) -> Sampler:
        signal.signal(signal.SIGPROF, self._sample)
        signal.setitimer(signal.ITIMER_PROF, _INTERVAL, _INTERVAL)
        self._start = time.process_time()
        return self

    def __exit__(self, *_: object) -> None:
        signal.setitimer(signal.ITIMER_PROF, 0, 0)
        self.cpu += time.process_time() - self._start

    @property
    def rate(self) -> float:
        """Samples per CPU second (the kernel's timer ticks coarser than asked)."""
        return sum(self.stacks.values()) / self.cpu if self.cpu else 0.0

    def write(self, out: str) -> None:
        with open(out, "w") as lines:
            for stack, count in self.stacks.items():
                lines.write(f"{stack} {count}\n")


def record(
    out: str, *, stream: bool, concurrent: bool, runs: int, k: int, loop: str = "agent_flow"
) -> tuple[int, float]:
    """Run one of `bench_loop`'s loops under a CPU-time sampler; return its model turns."""
    here = Path(__file__).resolve().parent
    sys.path.insert(0, str(here))
    import bench_loop

    with Sampler() as sampler:
        result = asyncio.run(bench_loop.measure(loop, stream, k, runs, concurrent))
    sampler.write(out)
    turns = int(result["turns"])
    rate = sampler.rate
    print(f"{turns} turns, {result['ms_per_turn']:.3f} CPU ms per turn; {rate:.0f} samples/s")
    return turns, rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("raw", help="collapsed stacks (py-spy's raw output, or --record's)")
    parser.add_argument("--turns", type=int, help="model turns in the run: print samples/turn")
    parser.add_argument("--rate", type=float, default=2000, help="py-spy's samples per second")
    parser.add_argument("--record", action="store_true", help="record `raw` with the sampler")
    parser.add_argument("--stream", action="store_true", help="record streamed runs")
    parser.add_argument("--concurrent", action="store_true", help="record all runs at once")
    parser.add_argument("--runs", type=int, default=100, help="runs to record")
    parser.add_argument("--k", type=int, default=10, help="tool steps per run")
    parser.add_argument(
        "--loop", default="agent_flow", help="the loop to record: agent_flow, floor, handwritten"
    )
    args = parser.parse_args()
    if args.record:
        args.turns, args.rate = record(
            args.raw,
            stream=args.stream,
            concurrent=args.concurrent,
            runs=args.runs,
            k=args.k,
            loop=args.loop,
        )

    own: Counter[str] = Counter()
    cause: Counter[str] = Counter()
    total = 0
    with open(args.raw) as lines:
        for line in lines:
            stack, _, count_text = line.rstrip("\n").rpartition(" ")
            if any(marker in stack for marker in _WARM_UP):
                continue
            count = int(count_text)
            frames = [m.group(1) for f in stack.split(";") if (m := _FRAME.search(f))]
            if not frames:
                continue
            total += count
            top = package(frames[-1])
            own[top] += count
            ours = [package(f) for f in frames if f.startswith("agent_flow/")]
            cause[ours[-1] if ours else top] += count
    scale = 1e6 / args.rate / args.turns if args.turns else None
    for title, table in (("own time (top of stack)", own), ("caused by", cause)):
        unit = "us/turn" if scale else "samples"
        print(f"{title:<32} {unit:>9} {'share':>6}")
        for name, count in table.most_common():
            if count / total < 0.005:
                continue
            value = count * scale if scale else count
            print(f"  {name:<30} {value:>9.0f} {count / total:>6.1%}")
        print()


if __name__ == "__main__":
    main()
