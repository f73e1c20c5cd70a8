"""Every script in benchmarks/ imports: a helper one of them takes from another still exists.

The benchmarks are not run by the tests (their numbers are not assertions), so a name removed
from one script silently broke three others once (`bench_server._rss_mb`, used by
`bench_process_memory`, `bench_first_messages` and the idle part of `bench_scale`). Each is
imported here, in one child process with the benchmarks' own ``sys.path`` (the repository and
benchmarks/), as ``python benchmarks/NAME.py`` would; the child names every one that fails.
`bench_loop.py` with its scripted server in a process of its own is also run, for one run.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
SCRIPTS = sorted(path.stem for path in BENCHMARKS.glob("*.py"))

_IMPORT = """
import importlib, json, sys, traceback
sys.path[:0] = [{root!r}, {benchmarks!r}]
failed = {{}}
for name in {names!r}:
    try:
        importlib.import_module(name)
    except BaseException:
        failed[name] = traceback.format_exc(limit=3)
print(json.dumps(failed))
"""


def test_every_benchmark_script_imports() -> None:
    assert {"bench_loop", "bench_server", "bench_process_memory", "_bench_idle"} <= set(SCRIPTS)
    code = _IMPORT.format(root=str(BENCHMARKS.parent), benchmarks=str(BENCHMARKS), names=SCRIPTS)
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    failed = json.loads(done.stdout.strip().splitlines()[-1])
    assert failed == {}, "\n".join(f"{name}:\n{trace}" for name, trace in failed.items())


def test_bench_loop_runs_with_its_server_in_a_process_of_its_own() -> None:
    # `--server own` starts the scripted server as a child and stops it when stdin closes:
    # one run of each loop, whose turns (K tool steps and the answer) come back as JSON.
    script = str(BENCHMARKS / "bench_loop.py")
    for loop in ("handwritten", "agent_flow"):
        command = [sys.executable, script, "--child", "--loop", loop, "--k-one", "2"]
        done = subprocess.run(
            [*command, "--runs", "1", "--server", "own"],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        assert json.loads(done.stdout.strip().splitlines()[-1])["turns"] == 3
