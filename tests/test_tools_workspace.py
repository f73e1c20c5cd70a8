from __future__ import annotations

import asyncio
import json
import os
import select
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent_flow.errors import ToolError, UserError
from agent_flow.messages import ToolCall
from agent_flow.tools import (
    PolicyEngine,
    RiskLevel,
    ShellSettings,
    Tool,
    ToolContext,
    ToolExecutor,
    ToolResult,
    UnsafePathError,
    Workspace,
    workspace_tools,
)

# The process-group tests below read pids the command writes: only meaningful unconfined
# (a confined command has its own pid namespace); tests/test_tools_shell.py covers bubblewrap.
UNCONFINED = ShellSettings(sandbox="none")


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    return _build_outside(tmp_path)


def _build_outside(base: Path) -> Path:
    secret = base / "outside"
    secret.mkdir()
    (secret / "secret.txt").write_text("top secret\n")
    return secret


@pytest.fixture
def root(tmp_path: Path, outside: Path) -> Path:
    return _build_root(tmp_path, outside)


def _build_root(tmp_path: Path, outside: Path) -> Path:
    """A workspace with a few files and every kind of symlink trap."""
    ws = tmp_path / "ws"
    (ws / "src" / "pkg").mkdir(parents=True)
    (ws / "src" / "main.py").write_text("import os\n\ndef main():\n    return 42\n")
    (ws / "src" / "pkg" / "util.py").write_text("def helper():\n    return 'help'\n")
    (ws / "README.md").write_text("# Project\nSome words.\n")
    (ws / "notes").mkdir()
    (ws / "link_out_file").symlink_to(outside / "secret.txt")
    (ws / "link_out_dir").symlink_to(outside)
    (ws / "link_dangling_out").symlink_to(outside / "does-not-exist.txt")
    (ws / "link_in").symlink_to(ws / "src" / "main.py")
    (ws / "src" / "up").symlink_to(Path(".."))  # points at ws: inside, fine
    (ws / "src" / "upup").symlink_to(Path("../.."))  # points above ws
    return ws


@pytest.fixture
def workspace(root: Path) -> Workspace:
    return Workspace(root)


@pytest.fixture
def tools(workspace: Workspace) -> dict[str, Tool]:
    return {t.name: t for t in workspace_tools(workspace, command_timeout=5.0, shell=UNCONFINED)}


async def run(tools: dict[str, Tool], name: str, **arguments: object) -> ToolResult:
    output = await tools[name].run(arguments, ToolContext(tool_name=name))  # type: ignore[arg-type]
    assert isinstance(output, ToolResult)
    return output


ESCAPES = [
    "/etc/passwd",
    "/",
    "//etc/passwd",
    "\\\\server\\share\\x",
    "C:\\Windows\\win.ini",
    "C:relative",
    "c:/x",
    "..",
    "../outside/secret.txt",
    "src/../../outside/secret.txt",
    "src/../..",
    "./../outside",
    "..\\outside\\secret.txt",
    "src/..\\..\\outside",
    "~",
    "~/.ssh/id_rsa",
    "~root/x",
    "src/\x00/main.py",
    "main.py\x00.txt",
    "link_out_file",
    "link_out_dir",
    "link_out_dir/secret.txt",
    "link_out_dir/new_file.txt",
    "link_dangling_out",
    "src/upup",
    "src/upup/outside/secret.txt",
    "src/up/link_out_dir/secret.txt",
]


@pytest.fixture(scope="module")
def shared_workspace(tmp_path_factory: pytest.TempPathFactory) -> Workspace:
    base = tmp_path_factory.mktemp("shared")
    return Workspace(_build_root(base, _build_outside(base)))


PARTS = [
    "..",
    ".",
    "",
    "src",
    "pkg",
    "up",
    "upup",
    "link_in",
    "link_out_dir",
    "link_out_file",
    "link_dangling_out",
    "new",
    "~",
    "C:",
    "\\",
    "..\\..",
    "a\x00b",
    "outside",
    "secret.txt",
]


@given(parts=st.lists(st.sampled_from(PARTS), min_size=1, max_size=6), absolute=st.booleans())
def test_resolve_either_refuses_a_path_or_returns_one_inside_the_root(
    shared_workspace: Workspace, parts: list[str], absolute: bool
) -> None:
    path = ("/" if absolute else "") + "/".join(parts)
    try:
        resolved = shared_workspace.resolve(path)
    except UnsafePathError:
        return
    real = Path(os.path.realpath(resolved))
    assert real == resolved
    assert shared_workspace.contains(real)


@pytest.mark.parametrize("path", ESCAPES)
def test_every_escape_attempt_is_refused_by_resolve(workspace: Workspace, path: str) -> None:
    with pytest.raises(UnsafePathError):
        workspace.resolve(path)


def _untouched(outside: Path) -> bool:
    """Whether the directory outside the workspace still holds just its secret, unchanged."""
    names = sorted(p.name for p in outside.iterdir())
    return names == ["secret.txt"] and (outside / "secret.txt").read_text() == "top secret\n"


async def _escapes_not_refused(
    tools: dict[str, Tool], tool_name: str, extra: dict[str, object], key: str = "path"
) -> list[tuple[str, str]]:
    """Run `tool_name` on every escape; return those that were not refused as unsafe."""
    failures: list[tuple[str, str]] = []
    for path in ESCAPES:
        try:
            result = await run(tools, tool_name, **{key: path}, **extra)
        except UnsafePathError:
            continue
        except Exception as err:  # refused, but for the wrong reason
            failures.append((path, f"{type(err).__name__}: {err}"))
        else:
            failures.append((path, f"ran: {result.content[:80]}"))
    return failures


@pytest.mark.parametrize(
    ("tool_name", "extra"),
    [
        ("read_file", {}),
        ("write_file", {"content": "pwned"}),
        ("list_directory", {}),
        ("directory_tree", {}),
        ("search_text", {"pattern": "secret"}),
    ],
)
async def test_every_file_tool_refuses_every_escape_attempt(
    tools: dict[str, Tool], outside: Path, tool_name: str, extra: dict[str, object]
) -> None:
    assert await _escapes_not_refused(tools, tool_name, extra) == []
    assert _untouched(outside)


async def test_run_command_refuses_every_working_directory_outside(tools: dict[str, Tool]) -> None:
    assert await _escapes_not_refused(tools, "run_command", {"command": "pwd"}, key="cwd") == []


async def test_escapes_through_the_executor_are_error_results_the_model_can_read(
    workspace: Workspace,
) -> None:
    executor = ToolExecutor(workspace_tools(workspace))
    outcome = await executor.execute_one(
        ToolCall(id="1", name="read_file", arguments='{"path": "../outside/secret.txt"}')
    )
    assert outcome.result.error_kind == "tool_error"
    assert outcome.result.content == (
        "path '../outside/secret.txt' contains '..'; paths must stay inside the workspace root"
    )


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("", "."),
        (".", "."),
        ("./", "."),
        ("src", "src"),
        ("src/./main.py", "src/main.py"),
        ("src//pkg/", "src/pkg"),
        ("link_in", "src/main.py"),
        ("src/up/README.md", "README.md"),
        ("new/dir/file.txt", "new/dir/file.txt"),
        ("weird name with spaces.txt", "weird name with spaces.txt"),
    ],
)
def test_safe_paths_resolve_inside_the_root(workspace: Workspace, path: str, expected: str) -> None:
    assert workspace.relative(workspace.resolve(path)) == expected


def test_a_missing_root_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="is not a directory"):
        Workspace(tmp_path / "missing")


def test_a_symlink_swapped_in_after_the_check_is_not_followed(
    workspace: Workspace, root: Path, outside: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = root / "notes" / "file.txt"
    target.write_text("mine")
    checked = workspace.resolve("notes/file.txt")
    # Between the check and the open, "notes" becomes a symlink to the outside directory.
    (root / "notes" / "file.txt").unlink()
    (root / "notes").rmdir()
    (root / "notes").symlink_to(outside)
    (outside / "file.txt").write_text("theirs")
    monkeypatch.setattr(workspace, "resolve", lambda path: checked)
    with pytest.raises(UnsafePathError, match="symbolic link that changed"):
        workspace.open_file("notes/file.txt", os.O_RDONLY)
    # the final component swapped for a link is caught the same way
    monkeypatch.undo()
    (root / "notes").unlink()
    (root / "notes").mkdir()
    (root / "notes" / "file.txt").symlink_to(outside / "file.txt")
    monkeypatch.setattr(workspace, "resolve", lambda path: root / "notes" / "file.txt")
    with pytest.raises(UnsafePathError):
        workspace.open_file("notes/file.txt", os.O_RDONLY)


async def test_a_symlink_created_by_a_command_cannot_be_used_to_escape(
    tools: dict[str, Tool], outside: Path
) -> None:
    result = await run(
        tools, "run_command", command=f"ln -s {outside} escape && ln -s {outside}/secret.txt s"
    )
    assert result.data is not None
    assert not result.is_error
    for path in ("escape/secret.txt", "s", "escape/new.txt"):
        with pytest.raises(UnsafePathError):
            await run(tools, "read_file", path=path)
        with pytest.raises(UnsafePathError):
            await run(tools, "write_file", path=path, content="x")
    assert _untouched(outside)


# --- read_file ----------------------------------------------------------------------------


async def test_read_file_returns_the_whole_file_or_a_line_range(tools: dict[str, Tool]) -> None:
    whole = await run(tools, "read_file", path="src/main.py")
    assert whole.content == "import os\n\ndef main():\n    return 42\n"
    part = await run(tools, "read_file", path="src/main.py", start_line=3, end_line=4)
    assert part.content == "def main():\n    return 42\n"
    assert part.data == {"path": "src/main.py", "start_line": 3, "end_line": 4, "truncated": False}


async def test_read_file_reads_through_symlinks_that_stay_inside(tools: dict[str, Tool]) -> None:
    assert (await run(tools, "read_file", path="link_in")).content.startswith("import os")


async def test_read_file_stops_at_the_size_limit_and_says_how_to_go_on(root: Path) -> None:
    (root / "big.txt").write_text("".join(f"line {i:04d}\n" for i in range(1000)))
    small = {t.name: t for t in workspace_tools(Workspace(root, max_read_bytes=100))}
    result = await run(small, "read_file", path="big.txt")
    assert result.content.startswith("line 0000\nline 0001\n")
    assert result.content.endswith(
        "[output limit of 100 bytes reached after line 10; read on with start_line=11]"
    )
    more = await run(small, "read_file", path="big.txt", start_line=11, end_line=12)
    assert more.content == "line 0010\nline 0011\n"


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"path": "src"}, "is a directory"),
        ({"path": "missing.txt"}, "does not exist"),
        ({"path": "src/main.py", "start_line": 50}, "has only 4 lines"),
        ({"path": "src/main.py", "start_line": 3, "end_line": 2}, "is before start_line"),
        ({"path": "blob.bin"}, "is a binary file"),
        ({"path": "fifo"}, "is not a regular file"),
    ],
)
async def test_read_file_errors_are_readable(
    tools: dict[str, Tool], root: Path, arguments: dict[str, object], message: str
) -> None:
    (root / "blob.bin").write_bytes(b"\x89PNG\x00\x01\x02")
    os.mkfifo(root / "fifo")
    with pytest.raises(ToolError, match=message):
        await run(tools, "read_file", **arguments)


# --- write_file ---------------------------------------------------------------------------


async def test_write_file_creates_overwrites_and_appends(
    tools: dict[str, Tool], root: Path
) -> None:
    created = await run(tools, "write_file", path="out/deep/a.txt", content="one\n")
    assert created.content == "created out/deep/a.txt (4 bytes)"
    assert created.data == {
        "path": "out/deep/a.txt",
        "bytes_written": 4,
        "mode": "overwrite",
        "created": True,
    }
    await run(tools, "write_file", path="out/deep/a.txt", content="two\n", mode="append")
    assert (root / "out/deep/a.txt").read_text() == "one\ntwo\n"
    replaced = await run(tools, "write_file", path="out/deep/a.txt", content="three\n")
    assert replaced.content == "overwrote out/deep/a.txt (6 bytes)"
    assert (root / "out/deep/a.txt").read_text() == "three\n"


async def test_write_file_in_create_mode_never_replaces_a_file(
    tools: dict[str, Tool], root: Path
) -> None:
    with pytest.raises(ToolError, match="already exists"):
        await run(tools, "write_file", path="README.md", content="gone", mode="create")
    assert (root / "README.md").read_text().startswith("# Project")


async def test_write_file_refuses_oversized_content(root: Path) -> None:
    small = {t.name: t for t in workspace_tools(Workspace(root, max_write_bytes=10))}
    with pytest.raises(ToolError, match="over the 10-byte limit"):
        await run(small, "write_file", path="x.txt", content="x" * 11)


def test_writing_and_running_commands_need_approval_by_default(tools: dict[str, Tool]) -> None:
    engine = PolicyEngine()
    assert (
        engine.evaluate("write_file", tools["write_file"].policy, {}).verdict == "requires_approval"
    )
    assert engine.evaluate(
        "run_command", tools["run_command"].policy, {"command": "ls"}
    ).verdict == ("requires_approval")
    assert tools["run_command"].policy.risk == RiskLevel.HIGH
    for name in ("read_file", "list_directory", "directory_tree", "search_text"):
        assert tools[name].policy.read_only
        assert engine.evaluate(name, tools[name].policy, {}).verdict == "allowed"


# --- listing ------------------------------------------------------------------------------


async def test_list_directory_shows_directories_first_and_where_links_point(
    tools: dict[str, Tool],
) -> None:
    result = await run(tools, "list_directory")
    assert result.content.splitlines() == [
        "notes/",
        "src/",
        "README.md (22 bytes)",
        "link_dangling_out -> (outside the workspace)",
        "link_in -> src/main.py",
        "link_out_dir -> (outside the workspace)",
        "link_out_file -> (outside the workspace)",
    ]


async def test_directory_tree_lists_a_bounded_tree_and_never_follows_links(
    tools: dict[str, Tool], root: Path
) -> None:
    (root / ".git").mkdir()
    (root / ".git" / "HEAD").write_text("ref")
    main_size = (root / "src" / "main.py").stat().st_size
    result = await run(tools, "directory_tree", path="src")
    assert result.content.splitlines() == [
        "src/",
        "├── pkg/",
        "│   └── util.py",
        "├── main.py",
        "├── up ->",
        "└── upup ->",
    ]
    assert result.data == {
        "root": "src",
        "entries": [
            {"path": "src/pkg", "kind": "directory", "size": None},
            {"path": "src/main.py", "kind": "file", "size": main_size},
            {"path": "src/up", "kind": "symlink", "size": None},
            {"path": "src/upup", "kind": "symlink", "size": None},
            {"path": "src/pkg/util.py", "kind": "file", "size": 32},
        ],
        "complete": True,
        "max_depth": 3,
    }
    whole = await run(tools, "directory_tree")
    assert ".git" not in whole.content


async def test_directory_tree_says_when_it_was_cut_short(tools: dict[str, Tool]) -> None:
    shallow = await run(tools, "directory_tree", max_depth=1)
    assert isinstance(shallow.data, dict)
    assert shallow.data["complete"] is False
    assert shallow.content.endswith("[listing incomplete: limited to depth 1 and 300 entries]")
    few = await run(tools, "directory_tree", max_entries=2)
    assert isinstance(few.data, dict)
    assert len(few.data["entries"]) == 2  # type: ignore[arg-type]
    assert few.data["complete"] is False


# --- search -------------------------------------------------------------------------------


async def test_search_text_finds_regex_matches_with_paths_and_lines(tools: dict[str, Tool]) -> None:
    result = await run(tools, "search_text", pattern=r"def \w+\(")
    assert result.content.splitlines() == [
        "src/main.py:3: def main():",
        "src/pkg/util.py:1: def helper():",
    ]
    only_py = await run(tools, "search_text", pattern="project", glob="*.md", ignore_case=True)
    assert only_py.content == "README.md:1: # Project"


async def test_search_text_limits_results_and_skips_binary_files(
    tools: dict[str, Tool], root: Path
) -> None:
    (root / "many.txt").write_text("hit\n" * 20)
    (root / "blob.bin").write_bytes(b"hit\x00hit")
    result = await run(tools, "search_text", pattern="hit", max_results=5)
    assert isinstance(result.data, dict)
    assert result.data["truncated"] is True
    assert len(result.data["matches"]) == 5  # type: ignore[arg-type]
    assert result.content.endswith("[stopped after 5 matches; narrow the search]")
    assert "blob.bin" not in result.content


async def test_search_text_reports_a_bad_pattern_and_no_matches(tools: dict[str, Tool]) -> None:
    with pytest.raises(ToolError, match="not a valid regular expression"):
        await run(tools, "search_text", pattern="(unclosed")
    assert (
        await run(tools, "search_text", pattern="zzz_nothing")
    ).content == "no matches for 'zzz_nothing'"


# --- run_command --------------------------------------------------------------------------


async def test_run_command_returns_exit_code_and_output_in_the_working_directory(
    tools: dict[str, Tool], root: Path
) -> None:
    result = await run(tools, "run_command", command="pwd; echo oops >&2; exit 3", cwd="src")
    assert result.content == f"exit code 3\n{root / 'src'}\noops\n"
    assert isinstance(result.data, dict)
    assert (result.data["exit_code"], result.data["cwd"], result.data["timed_out"]) == (
        3,
        "src",
        False,
    )
    assert not result.is_error


async def test_run_command_keeps_head_and_tail_of_long_output(workspace: Workspace) -> None:
    small = {
        t.name: t
        for t in workspace_tools(workspace, max_command_output_bytes=400, shell=UNCONFINED)
    }
    result = await run(small, "run_command", command="seq 1 2000")
    assert result.content.startswith("exit code 0\n1\n2\n3\n")
    assert result.content.endswith("1999\n2000\n")
    assert "bytes of output omitted ...]" in result.content
    assert isinstance(result.data, dict)
    assert result.data["output_truncated"] is True


def _dies(pid: int) -> bool:
    """Wait (on the process's pidfd, at most 5 s) for `pid` to end; return whether it did."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True  # already gone and reaped
    try:
        readable, _, _ = select.select([fd], [], [], 5.0)
    finally:
        os.close(fd)
    return bool(readable)


async def test_run_command_kills_the_whole_process_group_on_timeout(
    tools: dict[str, Tool], root: Path
) -> None:
    result = await run(
        tools,
        "run_command",
        command="sleep 60 & echo $! > child.pid; echo started; wait",
        timeout_seconds=0.5,
    )
    assert result.is_error
    assert result.error_kind == "timeout"
    assert result.content.startswith(
        "command timed out after 0.5s and was killed; output so far:\nstarted"
    )
    child = int((root / "child.pid").read_text())
    assert _dies(child)


async def test_run_command_kills_background_children_when_the_command_ends(
    tools: dict[str, Tool], root: Path
) -> None:
    result = await run(tools, "run_command", command="sleep 60 & echo $! > child.pid; echo done")
    assert result.content == "exit code 0\ndone\n"
    assert _dies(int((root / "child.pid").read_text()))


async def test_cancelling_a_command_kills_it(workspace: Workspace, root: Path) -> None:
    executor = ToolExecutor(
        workspace_tools(workspace, shell=UNCONFINED), policy=PolicyEngine(auto_approve=True)
    )
    os.mkfifo(root / "ready")
    command = "echo $$ > shell.pid; sleep 60 & echo $! > child.pid; echo go > ready; wait"
    call = ToolCall(id="1", name="run_command", arguments=json.dumps({"command": command}))
    task = asyncio.create_task(executor.execute([call]))
    # Reading the FIFO returns once the command has written its pids and signalled.
    assert await asyncio.to_thread((root / "ready").read_text) == "go\n"
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert _dies(int((root / "child.pid").read_text()))
    assert _dies(int((root / "shell.pid").read_text()))
