"""Attribute a py-spy profile of bench_loop to packages: where a model turn's CPU goes.

Record a child run of `bench_loop` with py-spy (a sampling profiler: it samples only while
the process runs on a CPU, and barely slows it down), then read its raw output here::

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
import re
from collections import Counter

_FRAME = re.compile(r"\(([^:()]+):\d+\)$")
_WARM_UP = ("_find_and_load", "load_tiktoken_bpe", "_load_encoding")


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("raw", help="py-spy raw (collapsed stacks) output")
    parser.add_argument("--turns", type=int, help="model turns in the run: print samples/turn")
    parser.add_argument("--rate", type=int, default=2000, help="py-spy's samples per second")
    args = parser.parse_args()

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
