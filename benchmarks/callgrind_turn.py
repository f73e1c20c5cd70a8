"""Instructions per model turn (callgrind ``Ir``) of agent_flow's loop and of the plain loop.

Wall and CPU times on a shared machine move with everyone else's load; the number of
instructions a fixed workload executes does not. This runs `bench_loop`'s workload (the
local scripted server in process, runs of K ``add`` steps then an answer) under valgrind's
callgrind and prints, per loop, the instructions per model turn, in one process::

    python benchmarks/callgrind_turn.py [--runs 5] [--k 10] [--stream]
        [--loops agent_flow,handwritten,floor] [--out DIR]

Each loop is warmed up first (imports, connections, the tokenizer; for agent_flow, the price
data it loads in a background thread and prices from on the next call), then callgrind's
counters are cleared, `runs` runs of that loop are made one after another, and the counters
are dumped: the dump holds only that loop's runs. (Runs all at once do not survive valgrind:
under its slowdown the SDK's 5 s connect timeout expires while many runs connect.)
Counters are cleared and dumped through callgrind's client requests, from a tiny C helper
built with ``gcc`` on first use (valgrind's ``callgrind.h`` must be installed), so the
boundaries are exact; the warm-up is dumped too (zeroing clears only the calling thread's
counters, a dump every thread's). The dumps stay in ``--out`` (one file per loop) for
``callgrind_annotate``. As in `bench_loop`, the in-process
server's cost is in every column: nearly equal (parsing each request costs it about 0.14 M
instructions per agent_flow turn, whose bodies carry more tool schemas, and 0.09 M per turn
of the hand-written loop); the ratio is agent_flow's instructions over the hand-written loop's.

Instructions are not time: the hand-written loop runs about 10 G instructions per CPU second
here (pydantic-core's validation in Rust), agent_flow's Python about 4 G, and system calls
(the thread hand-off of a sync tool, socket reads) are not counted at all. Use this to see
whether a change removed work; use `bench_loop` for what a turn costs.

Counts vary by a fraction of a percent from one run to the next (socket reads that return
a response in one or two pieces, hash seeds): compare changes larger than that.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import gc
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

_HELPER = r"""
#include <valgrind/callgrind.h>
void cg_zero(void) { CALLGRIND_ZERO_STATS; }
void cg_dump(const char *name) { CALLGRIND_DUMP_STATS_AT(name); }
"""


def _helper() -> ctypes.CDLL:
    """Build (once, in the temp directory) and load the client-request helper."""
    directory = Path(tempfile.gettempdir()) / "agent_flow_callgrind"
    directory.mkdir(exist_ok=True)
    library = directory / "cg_helper.so"
    if not library.exists():
        source = directory / "cg_helper.c"
        source.write_text(_HELPER)
        compiler = shutil.which("gcc") or shutil.which("cc")
        if compiler is None:
            raise SystemExit("callgrind_turn needs gcc (or cc) to build its helper; install one")
        partial = directory / f"cg_helper.{os.getpid()}.so"
        subprocess.run(
            [compiler, "-O1", "-shared", "-fPIC", "-o", str(partial), str(source)], check=True
        )
        partial.replace(library)
    return ctypes.CDLL(str(library))


async def _measure(loops: list[str], stream: bool, k: int, runs: int) -> dict[str, int]:
    from benchmarks.bench_loop import serving

    helper = _helper()
    turns: dict[str, int] = {}
    async with serving(stream, k) as one:
        for loop in loops:
            # Warm-up: a run, the one-off work it started (price data), and a run after it.
            await one(loop)
            _settle()
            await one(loop)
            await one(loop)
            gc.collect()
            # Zeroing clears only this thread's counters; a dump clears every thread's (the
            # price data's loader thread ran during the warm-up), so dump the warm-up first.
            helper.cg_dump(b"warm-up")
            helper.cg_zero()
            count = 0
            for _ in range(runs):
                count += await one(loop)
            helper.cg_dump(loop.encode())
            turns[loop] = count
    return turns


def _settle() -> None:
    """Let one-off background work finish before counting (the price data's loader thread)."""
    pricing = sys.modules.get("agent_flow.pricing")
    loader = getattr(pricing, "_loader", None)
    if loader is not None:
        loader.join()


_TOTALS = re.compile(r"^(?:totals|summary):\s+(\d+)", re.MULTILINE)


def _instructions(out: Path, loop: str) -> int:
    """The Ir of the dump named after `loop` in `out`."""
    for path in out.iterdir():
        text = path.read_text(errors="replace")
        trigger = re.search(rf"^desc: Trigger: Client Request: {loop}$", text, re.MULTILINE)
        if trigger:
            match = _TOTALS.search(text)
            if match:
                return int(match.group(1))
    raise SystemExit(f"no callgrind dump for {loop!r} in {out}; see valgrind's output above")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--runs", type=int, default=5, help="measured runs per loop")
    parser.add_argument("--k", type=int, default=10, help="tool steps per run")
    parser.add_argument("--stream", action="store_true", help="stream the model's answers")
    parser.add_argument("--loops", default="agent_flow,handwritten,floor", help="comma-separated")
    parser.add_argument("--out", type=Path, default=None, help="directory for the dumps")
    parser.add_argument(
        "--server",
        choices=("same", "own"),
        default="same",
        help="the scripted server in the counted process (the default) or in its own, "
        "outside valgrind: only the loops' instructions counted",
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    loops = args.loops.split(",")
    if args.child:
        import benchmarks.bench_loop

        benchmarks.bench_loop.SERVER_PLACE = args.server
        turns = asyncio.run(_measure(loops, args.stream, args.k, args.runs))
        print(" ".join(f"{loop}={count}" for loop, count in turns.items()))
        return
    out = args.out or Path(tempfile.mkdtemp(prefix="callgrind_turn_"))
    out.mkdir(parents=True, exist_ok=True)
    for stale in out.glob("cg.out*"):
        stale.unlink()
    command = [
        "valgrind",
        "--tool=callgrind",
        f"--callgrind-out-file={out / 'cg.out'}",
        sys.executable,
        __file__,
        "--child",
        "--runs",
        str(args.runs),
        "--k",
        str(args.k),
        "--loops",
        args.loops,
        "--server",
        args.server,
    ]
    command += ["--stream"] if args.stream else []
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        sys.stderr.write(result.stderr[-4000:])
        raise SystemExit(f"callgrind run failed with exit code {result.returncode}")
    last = result.stdout.strip().splitlines()[-1]
    turns = {name: int(value) for name, value in (pair.split("=") for pair in last.split())}
    per_turn = {loop: _instructions(out, loop) / turns[loop] for loop in loops}
    print(
        f"K={args.k} stream={args.stream} runs={args.runs}, one after another: "
        "instructions (Ir) per model turn"
    )
    for loop in loops:
        print(f"  {loop:<12} {per_turn[loop]:>14,.0f}  ({turns[loop]} turns)")
    if "agent_flow" in per_turn and "handwritten" in per_turn:
        print(
            f"  ratio agent_flow/handwritten {per_turn['agent_flow'] / per_turn['handwritten']:.3f}"
        )
    print(f"dumps: {out}")


if __name__ == "__main__":
    main()
