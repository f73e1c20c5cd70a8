"""Every script in benchmarks/ imports: a helper one of them takes from another still exists.

The benchmarks are not run by the tests (their numbers are not assertions), so a name removed
from one script silently broke three others once (`bench_server._rss_mb`, used by
`bench_process_memory`, `bench_first_messages` and the idle part of `bench_scale`). Each is
imported here, in a child process with the benchmarks' own ``sys.path`` (the repository and
benchmarks/), as ``python benchmarks/NAME.py`` would.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
SCRIPTS = sorted(path.stem for path in BENCHMARKS.glob("*.py"))

_IMPORT = """
import importlib, sys
sys.path[:0] = [{root!r}, {benchmarks!r}]
importlib.import_module({name!r})
"""


def test_the_benchmarks_are_found() -> None:
    assert {"bench_loop", "bench_server", "bench_process_memory", "_bench_idle"} <= set(SCRIPTS)


@pytest.mark.parametrize("name", SCRIPTS)
def test_a_benchmark_script_imports(name: str) -> None:
    code = _IMPORT.format(root=str(BENCHMARKS.parent), benchmarks=str(BENCHMARKS), name=name)
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
