"""Start-up cost: importing agent_flow and running ``agent-flow --help``, beside ``import openai``.

Each command runs in a fresh interpreter, several times; the best run is kept (others' load
only ever adds). CPU is the child's user+system time, wall its elapsed time; max RSS is its
peak memory. The last column lists the heavy dependencies the command imported: the goal is
that nothing is imported that the command does not use (``--help`` and ``import agent_flow``
need none of them).

Usage: python benchmarks/bench_import.py [--repeat 5]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

BIN = Path(sys.executable).parent
HEAVY = (
    "openai",
    "mcp",
    "rich",
    "sqlite3",
    "fastapi",
    "dbos",
    "opentelemetry",
    "tiktoken",
    "jsonschema",
    "pydantic",
    "asyncio",
)
# Prints the heavy modules the code before it imported (as a last JSON line).
_REPORT = (
    "import sys, json; print(json.dumps(sorted({m.split('.')[0] for m in sys.modules} & "
    f"{set(HEAVY)!r})))"
)
CASES = {
    "python -c pass (interpreter)": [sys.executable, "-c", "pass"],
    "import openai (the plain loop)": [sys.executable, "-c", f"import openai\n{_REPORT}"],
    "import agent_flow": [sys.executable, "-c", f"import agent_flow\n{_REPORT}"],
    "from agent_flow import AgentExecutor": [
        sys.executable,
        "-c",
        f"from agent_flow import AgentExecutor, AgentConfig\n{_REPORT}",
    ],
    "... and OpenAIClient (a real agent)": [
        sys.executable,
        "-c",
        f"from agent_flow import AgentExecutor, AgentConfig, OpenAIClient\n{_REPORT}",
    ],
    "agent-flow --help": [
        sys.executable,
        "-c",
        "import sys, contextlib, io\nfrom agent_flow.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n    main(['--help'])\n" + _REPORT,
    ],
    "agent-flow --version (script)": [str(BIN / "agent-flow"), "--version"],
}


def run_once(command: list[str]) -> tuple[float, float, float, str]:
    """Run `command`; return its CPU seconds, wall seconds, max RSS (MB) and modules line."""
    start = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    output = process.stdout.read()
    process.stdout.close()
    # Reap it here: wait4 reports this one child's own CPU time and peak memory.
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - start
    if process.returncode != 0:
        raise SystemExit(f"{command} failed with exit code {process.returncode}")
    cpu = usage.ru_utime + usage.ru_stime
    last = output.strip().splitlines()[-1] if output.strip() else ""
    return cpu, wall, usage.ru_maxrss / 1024, last if last.startswith("[") else ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--repeat", type=int, default=5, help="runs per command (best kept)")
    args = parser.parse_args()
    print(f"best of {args.repeat} fresh interpreters; CPU = user+system of the child")
    print(f"{'command':<38} {'CPU s':>6} {'wall s':>6} {'max RSS MB':>10}  heavy modules imported")
    for name, command in CASES.items():
        runs = [run_once(command) for _ in range(args.repeat)]
        cpu = min(r[0] for r in runs)
        wall = min(r[1] for r in runs)
        rss = min(r[2] for r in runs)
        modules = ", ".join(json.loads(runs[-1][3])) if runs[-1][3] else ""
        print(f"{name:<38} {cpu:>6.3f} {wall:>6.3f} {rss:>10.1f}  {modules}", flush=True)


if __name__ == "__main__":
    main()
