"""A small, real MCP server shipped for `agent-flow demo`: code search and a Python linter.

Run it over stdio with ``python -m agent_flow._demo.mcp_server --root DIR``; an agent
connected to it (``agent-flow run --mcp "project=python -m agent_flow._demo.mcp_server --root
DIR"``) gets two read-only tools, namespaced by the server's name (``project_search``,
``project_lint``):

- ``search(query)``: case-insensitive substring search over the text files under the root;
  each hit is a ``{"title": "path:line", "snippet": ...}`` result, the shape agent_flow's
  search handler turns into ``/knowledge/discovered_facts``;
- ``lint(path)``: checks a Python file with the standard library only (syntax, unused imports,
  bare ``except:``, mutable default arguments, long lines, TODO/FIXME notes); the latest
  report of each file is also published as the resource ``project://lint/<path>`` (its first
  report announced by ``notifications/resources/list_changed``).

Paths are relative to the root; the server refuses absolute paths and anything that resolves
outside it (``..``, symlinks).
"""

from __future__ import annotations

import argparse
import ast
import os
from pathlib import Path
from typing import Annotated

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.mcpserver.resources.types import FunctionResource
from mcp_types import ToolAnnotations
from pydantic import BaseModel, Field

__all__ = [
    "LintProblem",
    "LintReport",
    "SearchHit",
    "SearchResults",
    "build_server",
    "lint_source",
    "main",
    "search_project",
]

_SKIPPED_DIRECTORIES = frozenset({".git", "__pycache__", ".venv", "node_modules"})
_MAX_FILE_BYTES = 1_000_000
_LINE_LIMIT = 99
_READ_ONLY = ToolAnnotations(read_only_hint=True, idempotent_hint=True)


class SearchHit(BaseModel):
    """One matching line."""

    title: str
    snippet: str
    path: str
    line: int


class SearchResults(BaseModel):
    """What `search` found."""

    query: str
    results: list[SearchHit]
    files_searched: int
    truncated: bool


class LintProblem(BaseModel):
    """One finding of `lint`."""

    line: int
    code: str
    message: str


class LintReport(BaseModel):
    """What `lint` found in one file."""

    path: str
    problems: list[LintProblem]
    clean: bool


def _inside(root: Path, relative: str) -> Path:
    """Resolve `relative` under `root`, refusing anything that leaves it."""
    if os.path.isabs(relative) or relative.startswith("~"):
        raise ToolError(f"path {relative!r} is absolute; pass a path relative to the project")
    resolved = (root / relative).resolve()
    if resolved != root and root not in resolved.parents:
        raise ToolError(f"path {relative!r} leads outside the project; stay inside it")
    return resolved


def _text_files(root: Path) -> list[Path]:
    found: list[Path] = []
    for directory, subdirectories, files in os.walk(root):
        subdirectories[:] = sorted(d for d in subdirectories if d not in _SKIPPED_DIRECTORIES)
        for name in sorted(files):
            path = Path(directory, name)
            if path.is_file() and not path.is_symlink() and path.stat().st_size <= _MAX_FILE_BYTES:
                found.append(path)
    return found


def search_project(root: Path, query: str, *, max_results: int = 20) -> SearchResults:
    """Find the lines of text files under `root` that contain `query` (case-insensitive)."""
    if not query.strip():
        raise ToolError("the query is empty; pass the text to look for, e.g. 'TODO'")
    needle = query.lower()
    hits: list[SearchHit] = []
    searched = 0
    truncated = False
    for path in _text_files(root):
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        searched += 1
        relative = path.relative_to(root).as_posix()
        for number, line in enumerate(text.splitlines(), start=1):
            if needle in line.lower():
                if len(hits) >= max_results:
                    truncated = True
                    break
                hits.append(
                    SearchHit(
                        title=f"{relative}:{number}",
                        snippet=line.strip()[:200],
                        path=relative,
                        line=number,
                    )
                )
        if truncated:
            break
    return SearchResults(query=query, results=hits, files_searched=searched, truncated=truncated)


class _Checker(ast.NodeVisitor):
    def __init__(self) -> None:
        self.problems: list[LintProblem] = []
        self.imported: dict[str, int] = {}
        self.used: set[str] = set()

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self.imported[(alias.asname or alias.name).split(".")[0]] = node.lineno

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.module != "__future__":
            for alias in node.names:
                self.imported[alias.asname or alias.name] = node.lineno

    def visit_Name(self, node: ast.Name) -> None:
        self.used.add(node.id)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        root: ast.expr = node
        while isinstance(root, ast.Attribute):
            root = root.value
        if isinstance(root, ast.Name):
            self.used.add(root.id)
        self.generic_visit(node)

    def visit_ExceptHandler(self, node: ast.ExceptHandler) -> None:
        if node.type is None:
            self.problems.append(
                LintProblem(
                    line=node.lineno,
                    code="bare-except",
                    message="bare 'except:' also catches KeyboardInterrupt; name the exception",
                )
            )
        self.generic_visit(node)

    def _defaults(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        for default in [*node.args.defaults, *node.args.kw_defaults]:
            if isinstance(default, ast.List | ast.Dict | ast.Set):
                self.problems.append(
                    LintProblem(
                        line=default.lineno,
                        code="mutable-default",
                        message=f"{node.name}() has a mutable default argument; use None",
                    )
                )
        self.generic_visit(node)

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        self._defaults(node)

    def visit_AsyncFunctionDef(self, node: ast.AsyncFunctionDef) -> None:
        self._defaults(node)


def lint_source(source: str, path: str) -> LintReport:
    """Lint Python `source` (named `path` in the report)."""
    problems: list[LintProblem] = []
    try:
        tree = ast.parse(source, filename=path)
    except SyntaxError as err:
        problem = LintProblem(line=err.lineno or 0, code="syntax-error", message=err.msg)
        return LintReport(path=path, problems=[problem], clean=False)
    checker = _Checker()
    checker.visit(tree)
    problems.extend(checker.problems)
    exported: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            exported.update(
                e.value
                for e in getattr(node.value, "elts", [])
                if isinstance(e, ast.Constant) and isinstance(e.value, str)
            )
    for name, line in checker.imported.items():
        if name not in checker.used and name not in exported and not path.endswith("__init__.py"):
            problems.append(
                LintProblem(line=line, code="unused-import", message=f"{name!r} is never used")
            )
    for number, text in enumerate(source.splitlines(), start=1):
        if len(text) > _LINE_LIMIT:
            problems.append(
                LintProblem(
                    line=number,
                    code="line-too-long",
                    message=f"line is {len(text)} characters (limit {_LINE_LIMIT})",
                )
            )
        for marker in ("TODO", "FIXME"):
            if f"# {marker}" in text:
                note = text.split(f"# {marker}", 1)[1].strip(" :")
                problems.append(LintProblem(line=number, code=marker.lower(), message=note))
    problems.sort(key=lambda p: (p.line, p.code))
    return LintReport(path=path, problems=problems, clean=not problems)


def build_server(root: Path) -> MCPServer:
    """Build the server over the project at `root`."""
    project = root.resolve()
    server: MCPServer = MCPServer(
        "project", instructions=f"Code search and a Python linter over the project {project}."
    )

    @server.tool(annotations=_READ_ONLY)
    def search(
        query: Annotated[str, Field(description="The text to look for, e.g. 'TODO'.")],
        max_results: Annotated[int, Field(ge=1, le=200, description="The most hits.")] = 20,
    ) -> SearchResults:
        """Search the project's text files for lines containing a text (case-insensitive)."""
        return search_project(project, query, max_results=max_results)

    reports: dict[str, str] = {}  # resource URI -> the latest report of that file, as JSON

    @server.tool(annotations=_READ_ONLY)
    async def lint(
        path: Annotated[str, Field(description="The file, relative to the project root.")],
        ctx: Context,
    ) -> LintReport:
        """Lint a Python file: syntax, unused imports, bare excepts, mutable defaults, notes."""
        file = _inside(project, path)
        if not file.is_file():
            raise ToolError(f"{path!r} is not a file in the project; check the path")
        report = lint_source(file.read_text(encoding="utf-8"), path)
        # The latest report of each file is also a resource, announced when it is new.
        uri = f"project://lint/{path}"
        new = uri not in reports
        reports[uri] = report.model_dump_json()
        if new:
            server.add_resource(
                FunctionResource.from_function(
                    lambda: reports[uri], uri, name=f"lint {path}", mime_type="application/json"
                )
            )
            await ctx.session.send_resource_list_changed()
        return report

    return server


def main(argv: list[str] | None = None) -> None:
    """Serve the project at ``--root`` over stdio."""
    parser = argparse.ArgumentParser(
        prog="python -m agent_flow._demo.mcp_server",
        description="An MCP server (stdio) with code search and a Python linter over a project.",
    )
    parser.add_argument("--root", default=".", help="the project directory (default: .)")
    args = parser.parse_args(argv)
    root = Path(args.root)
    if not root.is_dir():
        parser.error(f"--root {args.root!r} is not a directory")
    build_server(root).run()


if __name__ == "__main__":
    main()
