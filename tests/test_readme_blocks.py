"""Every Python block of the README is a program that runs, or says what it is.

A block is one of:

- a complete program, run here as written (a file in a fresh directory, the fake OpenAI server
  as ``OPENAI_BASE_URL``) unless another test named in `RUN_ELSEWHERE` runs it;
- marked ``<!-- not run: REASON -->`` on the line before it: a complete program that needs
  what the tests cannot give it (a PostgreSQL deployment with workers, say); it must still
  compile as a file (no top-level ``await`` or ``async with``) and its imports must resolve;
- marked ``<!-- fragment -->``: lines to put into your own program (names it does not define,
  ``await`` at the top level); its imports must still resolve.

So a block pasted into a file either works, or the README said it would not.
"""

from __future__ import annotations

import ast
import asyncio
import importlib
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.openai_server import OpenAIServer, sse_reply, text_chunks

README = Path(__file__).resolve().parents[1] / "README.md"

#: Blocks other tests run as written, by the heading of their section: (test file, test).
RUN_ELSEWHERE = {
    "Quickstart": (
        "tests/test_readme.py",
        "test_the_quickstart_runs_against_an_openai_compatible_endpoint",
    ),
    "The pruning lab": ("tests/test_cli_lab.py", "test_the_readme_lab_example_runs_as_written"),
    "Testing your own code": (
        "tests/test_readme.py",
        "test_the_readme_property_test_for_your_own_code_passes",
    ),
}
# (The section's first Python block is the one those tests take.)

_MARK = re.compile(r"<!-- (fragment|not run: [^>]+) -->")


@dataclass(frozen=True)
class Block:
    line: int
    heading: str
    mark: str | None  # "fragment", "not run: ...", or None
    code: str


def blocks() -> list[Block]:
    text = README.read_text()
    found = []
    for match in re.finditer(r"```python\n(.*?)```", text, re.S):
        before = text[: match.start()]
        headings = re.findall(r"^##+ (.+)$", before, re.M)
        previous = before.rstrip().splitlines()[-1] if before.strip() else ""
        mark = _MARK.fullmatch(previous.strip())
        found.append(
            Block(
                line=before.count("\n") + 1,
                heading=headings[-1] if headings else "",
                mark=mark.group(1) if mark else None,
                code=match.group(1),
            )
        )
    return found


def _ids(block: Block) -> str:
    return f"line{block.line}"


def _check_imports(code: str) -> None:
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            module = importlib.import_module(node.module)
            for alias in node.names:
                if not hasattr(module, alias.name):
                    importlib.import_module(f"{node.module}.{alias.name}")  # a submodule
        elif isinstance(node, ast.Import):
            for alias in node.names:
                importlib.import_module(alias.name)


@pytest.mark.parametrize("block", blocks(), ids=_ids)
def test_every_block_compiles_as_what_it_says_it_is_and_its_imports_resolve(block: Block) -> None:
    name = f"README.md:{block.line}"
    if block.mark == "fragment":
        compile(block.code, name, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    else:
        # A program: pasted into a file, it must at least compile (no top-level await).
        compile(block.code, name, "exec")
    _check_imports(block.code)


def test_blocks_run_elsewhere_are_run_by_tests_that_exist() -> None:
    root = README.parent
    headings = {block.heading for block in blocks() if block.mark is None}
    for heading, (path, test) in RUN_ELSEWHERE.items():
        assert heading in headings, f"no unmarked block under {heading!r} any more"
        assert f"def {test}(" in (root / path).read_text(), (path, test)


def test_the_block_checks_see_the_marks_and_catch_a_top_level_await() -> None:
    marks = {block.mark for block in blocks()}
    assert "fragment" in marks and None in marks
    with pytest.raises(SyntaxError):
        compile("async with x:\n    pass\n", "pasted.py", "exec")


_RUN_HERE = [
    block for block in blocks() if block.mark is None and block.heading not in RUN_ELSEWHERE
]


@pytest.mark.parametrize("block", _RUN_HERE, ids=_ids)
async def test_every_unmarked_block_runs_as_a_program(block: Block, tmp_path: Path) -> None:
    script = tmp_path / "example.py"
    script.write_text(block.code)
    async with OpenAIServer() as server:
        server.script(*(sse_reply(text_chunks("Done.")) for _ in range(20)))
        env = {
            **os.environ,
            "OPENAI_BASE_URL": server.base_url,
            "OPENAI_API_KEY": "test",
            "HOME": str(tmp_path),
            "XDG_DATA_HOME": str(tmp_path / "data"),
        }
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            str(script),
            cwd=tmp_path,
            env=env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        _, err = await asyncio.wait_for(process.communicate(), 120)
    assert process.returncode == 0, f"README.md:{block.line}\n{err.decode()[-3000:]}"
