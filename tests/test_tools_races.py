"""Symlink races: a directory swapped for a symlink to the outside while a file tool works.

Every file tool checks a path, then opens it. These tests swap a directory inside the
workspace for a symlink to a directory outside it, once exactly between the check and the
open (deterministic), and over and over from a concurrent thread (the real attack), and
assert that nothing outside is ever read, listed or written.
"""

from __future__ import annotations

import os
import shutil
import sys
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from agent_flow.errors import ToolError
from agent_flow.tools import (
    ShellSettings,
    Tool,
    ToolContext,
    ToolResult,
    UnsafePathError,
    Workspace,
    workspace_tools,
)

OUTSIDE_NAME = "outside-only.txt"
OUTSIDE_TEXT = "TOP-SECRET-OUTSIDE"


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    directory = tmp_path / "outside"
    directory.mkdir()
    (directory / OUTSIDE_NAME).write_text(f"{OUTSIDE_TEXT}\n")
    (directory / "sub").mkdir()
    (directory / "sub" / "deeper.txt").write_text(f"{OUTSIDE_TEXT} deeper\n")
    return directory


@pytest.fixture
def root(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    (ws / "notes" / "inner").mkdir(parents=True)
    (ws / "notes" / "file.txt").write_text("inside text\n")
    (ws / "notes" / "inner" / "more.txt").write_text("inside more\n")
    (ws / "README.md").write_text("hello\n")
    return ws


@pytest.fixture
def workspace(root: Path) -> Workspace:
    return Workspace(root)


@pytest.fixture
def tools(workspace: Workspace) -> dict[str, Tool]:
    built = workspace_tools(workspace, shell=ShellSettings(sandbox="none"))
    return {t.name: t for t in built}


async def call(tools: dict[str, Tool], name: str, **arguments: object) -> ToolResult:
    output = await tools[name].run(arguments, ToolContext(tool_name=name))  # type: ignore[arg-type]
    assert isinstance(output, ToolResult)
    return output


def leaked(result: ToolResult) -> bool:
    text = f"{result.content}\n{result.data!r}"
    return OUTSIDE_NAME in text or OUTSIDE_TEXT in text or "deeper" in text


def untouched(outside: Path) -> bool:
    return sorted(p.name for p in outside.iterdir()) == [OUTSIDE_NAME, "sub"]


class Swapper:
    """Swaps ``notes`` between the real directory and a symlink to `outside`."""

    def __init__(self, root: Path, outside: Path) -> None:
        self.notes = root / "notes"
        self.parked = root.parent / "parked-notes"  # outside the root, so never listed
        self.link = root.parent / "link-notes"
        self.link.symlink_to(outside)

    def to_link(self) -> None:
        os.rename(self.notes, self.parked)
        while True:
            try:
                os.rename(self.link, self.notes)
                return
            except OSError:
                shutil.rmtree(self.notes, ignore_errors=True)  # made by write_file meanwhile

    def to_directory(self) -> None:
        os.rename(self.notes, self.link)
        while True:
            try:
                os.rename(self.parked, self.notes)
                return
            except OSError:
                shutil.rmtree(self.notes, ignore_errors=True)  # made by write_file meanwhile


def swap_after_check(
    workspace: Workspace, swap: Callable[[], None], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Make the first `resolve` swap the directory right after its check passed."""
    real = workspace.resolve
    done = False

    def resolve(path: str) -> Path:
        nonlocal done
        resolved = real(path)
        if not done:
            done = True
            swap()
        return resolved

    monkeypatch.setattr(workspace, "resolve", resolve)


# --- one swap, exactly between the check and the open ------------------------------------

CASES: list[tuple[str, dict[str, object]]] = [
    ("read_file", {"path": "notes/file.txt"}),
    ("write_file", {"path": "notes/new.txt", "content": "x"}),
    ("write_file", {"path": "notes/inner/new.txt", "content": "x"}),
    ("list_directory", {"path": "notes"}),
    ("list_directory", {"path": "notes/inner"}),
    ("directory_tree", {"path": "notes"}),
    ("search_text", {"pattern": "SECRET|inside", "path": "notes"}),
]


@pytest.mark.parametrize(
    ("name", "arguments"), CASES, ids=[c[0] + str(i) for i, c in enumerate(CASES)]
)
async def test_a_directory_swapped_for_a_symlink_after_the_check_is_never_followed(
    tools: dict[str, Tool],
    workspace: Workspace,
    root: Path,
    outside: Path,
    monkeypatch: pytest.MonkeyPatch,
    name: str,
    arguments: dict[str, object],
) -> None:
    swapper = Swapper(root, outside)
    swap_after_check(workspace, swapper.to_link, monkeypatch)
    with pytest.raises(UnsafePathError, match="symbolic link"):
        await call(tools, name, **arguments)
    assert untouched(outside)
    assert not (outside / "new.txt").exists()


async def test_a_directory_swapped_during_a_tree_walk_is_not_descended(
    tools: dict[str, Tool],
    workspace: Workspace,
    root: Path,
    outside: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The walk lists the root (where notes is a directory), then opens notes by itself.
    swapper = Swapper(root, outside)
    opened = workspace._open_directory
    seen: list[Path] = []

    def open_directory(resolved: Path) -> int:
        seen.append(resolved)
        if resolved == root / "notes":
            swapper.to_link()
        return opened(resolved)

    monkeypatch.setattr(workspace, "_open_directory", open_directory)
    result = await call(tools, "directory_tree", path=".")
    assert root / "notes" in seen
    assert not leaked(result)
    assert "notes/" in result.content  # listed as the directory it was, not followed


# --- a concurrent swapper ------------------------------------------------------------------


@pytest.fixture
def fast_switching() -> Iterator[None]:
    # Hand the GIL over often, so the swapper thread interleaves with every step of a tool.
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(before)


CONCURRENT: list[tuple[str, dict[str, object]]] = [
    ("list_directory", {"path": "notes"}),
    ("directory_tree", {"path": "."}),
    ("read_file", {"path": "notes/file.txt"}),
    ("search_text", {"pattern": "SECRET|inside"}),
    ("write_file", {"path": "notes/new.txt", "content": "x", "mode": "overwrite"}),
]


@pytest.mark.usefixtures("fast_switching")
@pytest.mark.parametrize(("name", "arguments"), CONCURRENT, ids=[c[0] for c in CONCURRENT])
async def test_no_file_tool_ever_reaches_outside_while_a_thread_swaps_symlinks(
    tools: dict[str, Tool],
    root: Path,
    outside: Path,
    name: str,
    arguments: dict[str, object],
) -> None:
    swapper = Swapper(root, outside)
    stop = threading.Event()

    def swap_forever() -> None:
        while not stop.is_set():
            swapper.to_link()
            swapper.to_directory()

    thread = threading.Thread(target=swap_forever, name="symlink-swapper")
    thread.start()
    # What each call saw: refused, or the listing/content it returned. The swap is visible
    # in these (notes missing, a symlink, or refused), so two kinds seen means it raced.
    seen: Counter[str] = Counter()
    leaks: list[str] = []
    try:
        for calls in range(1, 5_001):
            try:
                result = await call(tools, name, **arguments)
            except ToolError as err:  # UnsafePathError, or "does not exist" mid-swap
                seen[type(err).__name__] += 1
            else:
                seen[result.content] += 1
                if leaked(result):
                    leaks.append(result.content)
            if calls >= 1_000 and len(seen) >= 2 and sorted(seen.values())[-2] >= 30:
                break
    finally:
        stop.set()
        thread.join()
    assert leaks == []
    assert untouched(outside)
    assert len(seen) >= 2, seen
