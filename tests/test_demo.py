"""`agent-flow demo` (offline, scripted model, real tools and MCP server) and its MCP server."""

from __future__ import annotations

import io
import re
import textwrap
import typing
from pathlib import Path

import pytest

from agent_flow._demo.mcp_server import lint_source, search_project
from agent_flow._demo.scenario import DEMO_TASK, EVENT_KINDS, PROJECT_FILES, create_project
from agent_flow.cli import main
from agent_flow.events import AgentEvent
from agent_flow.sessions import SQLiteSessionStore

# What the rendering shows for each kind of event, in the demo's run.
MARKERS = {
    "run_started": "▶ run ",
    "iteration_started": "── iteration 10 ──",
    "context_built": "  context [",
    "thinking_delta": "  thinking: Totals too small: rows are probably lost somewhere.",
    "text_delta": "\nI'll plan the work, then map the project.\n",
    "tool_call_arguments_delta": '  ▸ directory_tree {"path": "."}',
    "model_responded": "  · model answered in ",
    "model_retrying": "  ⚠ model call failed (attempt 1 of 2), retrying in 0.0 s: the connection",
    "model_output_discarded": "  ⚠ the 11 characters above from the failed attempt are discarded",
    "tool_call_started": "  ⚙ running project_search",
    "tool_call_completed": "  ✓ project_search (",
    "tool_call_failed": "  ✗ read_file failed: the arguments are not valid JSON",
    "environment_updated": "      set /workspace/files = {",
    "history_pruned": "  ✂ history pruned by chain(elide_tool_results, drop_oldest): ",
    "plan_updated": "      [x] Check that the tests pass",
    "approval_required": "  ? approval needed for write_file",
    "approval_resolved": "  ✓ approved: write_file (granted by the demo",
    "warning_raised": "  ⚠ warning (loop): You have made the same call(s) (project_lint)",
    "execution_error": "  ✗ error ModelConnectionError: the connection was reset mid-answer "
    "(scripted drop) [the run goes on]",
    "run_finished": "■ run finished: completed after 10 iteration(s)",
    "events_dropped": "event(s) dropped for this subscriber",
    "mcp_list_changed": "  ⚙ MCP server project changed its resources: "
    "+project://lint/csvstats/parser.py",
}


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, str, Path]:
    workdir = tmp_path_factory.mktemp("demo")
    out, err = io.StringIO(), io.StringIO()
    code = main(["demo", "--workdir", str(workdir)], stdout=out, stderr=err)
    assert err.getvalue() == ""
    return code, out.getvalue(), workdir


def test_the_demo_finishes_the_task(demo_run: tuple[int, str, Path]) -> None:
    code, out, workdir = demo_run
    assert code == 0
    assert "outcome: completed after 10 iterations, 13 tool calls" in out
    parser = (workdir / "csvstats" / "csvstats" / "parser.py").read_text()
    assert "for line in lines[1:]:" in parser and "[1:-1]" not in parser
    # The scripted model read the file it was shown to find the line of the bug.
    assert "Found it: line 11 of csvstats/parser.py reads `for line in lines[1:-1]:`" in out
    # The tests really ran: failing before the fix, passing after.
    assert "✓ run_command (" in out
    assert "exit code 1 … FAILED (failures=2)" in out and "exit code 0 … OK" in out


def test_the_demo_renders_every_kind_of_event(demo_run: tuple[int, str, Path]) -> None:
    _, out, _ = demo_run
    assert set(MARKERS) == set(EVENT_KINDS)
    # The demo shows every kind of event the library defines.
    union = typing.get_args(typing.get_args(AgentEvent)[0])
    assert {member.model_fields["kind"].default for member in union} == set(EVENT_KINDS)
    missing = [kind for kind, marker in MARKERS.items() if marker not in out]
    assert missing == []
    assert f"event kinds shown: {len(EVENT_KINDS)} of {len(EVENT_KINDS)}\n" in out


def test_the_demo_says_the_model_is_scripted_and_how_to_use_a_real_one(
    demo_run: tuple[int, str, Path],
) -> None:
    _, out, workdir = demo_run
    assert "The model is SCRIPTED" in out
    assert f"agent-flow demo --setup-only --workdir {workdir / 'fresh'}" in out
    assert "agent-flow run 'Users report that csvstats totals are too small." in out
    assert f"--workspace {workdir / 'fresh' / 'csvstats'} --mcp 'project=" in out
    # OpenAI's own endpoint is asked for by name: without a base URL a model is local.
    assert "' --provider openai --model gpt-4o-mini\n" in out
    assert "--base-url http://localhost:11434/v1" in out


async def test_the_demo_session_is_stored_where_it_says(demo_run: tuple[int, str, Path]) -> None:
    _, out, workdir = demo_run
    db = workdir / "sessions.db"
    found = re.search(r"session ([0-9a-f]+) saved in (\S+): (\d+) steps", out)
    assert found is not None
    assert found.group(2) == str(db)
    assert f"agent-flow sessions show {found.group(1)} --db {db}" in out
    async with SQLiteSessionStore(db) as store:
        state = await store.load(found.group(1))
        events = await store.events(found.group(1))
    assert state.info.status == "completed" and state.info.steps == int(found.group(3))
    assert state.info.title == textwrap.shorten(DEMO_TASK, width=80, placeholder=" …")
    environment = state.environment
    assert environment is not None
    # The environment filled as the agent went: files from the tree, a fact from the MCP
    # server's search, the plan from update_plan.
    assert "csvstats/parser.py" in environment.workspace.files
    assert environment.knowledge.discovered_facts == [
        "csvstats/stats.py:13: # TODO: report the median too"
    ]
    assert [step.completed for step in environment.task.plan] == [True] * 5
    # Every event but the subscriber-local gap notice is stored with the session.
    assert {event.kind for event in events} == set(EVENT_KINDS) - {"events_dropped"}


def test_setup_only_creates_the_buggy_project_and_prints_the_real_command(tmp_path: Path) -> None:
    out = io.StringIO()
    assert main(["demo", "--setup-only", "--workdir", str(tmp_path)], stdout=out) == 0
    project = tmp_path / "csvstats"
    assert "lines[1:-1]" in (project / "csvstats" / "parser.py").read_text()
    assert f"created the demo project in {project}" in out.getvalue()
    assert f"--workspace {project}" in out.getvalue()
    assert not (tmp_path / "sessions.db").exists()


def test_setup_only_needs_a_workdir(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--setup-only"]) == 2
    assert "--setup-only needs --workdir" in capsys.readouterr().err


# -- the demo MCP server's tools ----------------------------------------------------------


def test_search_finds_lines_as_search_results(tmp_path: Path) -> None:
    project = create_project(tmp_path)
    found = search_project(project, "todo")
    assert [hit.title for hit in found.results] == ["csvstats/stats.py:13"]
    assert found.results[0].snippet == "# TODO: report the median too"
    assert found.files_searched == len(PROJECT_FILES)
    capped = search_project(project, "e", max_results=2)
    assert len(capped.results) == 2 and capped.truncated


def test_lint_reports_what_it_checks() -> None:
    source = (
        "import os\nimport json\n\n\ndef f(x=[]):\n    # TODO: more\n    try:\n"
        "        return json.dumps(x)\n    except:\n        return '" + "x" * 100 + "'\n"
    )
    report = lint_source(source, "m.py")
    assert [(p.line, p.code) for p in report.problems] == [
        (1, "unused-import"),
        (5, "mutable-default"),
        (6, "todo"),
        (9, "bare-except"),
        (10, "line-too-long"),
    ]
    assert not report.clean
    broken = lint_source("def f(:\n", "b.py")
    assert broken.problems[0].code == "syntax-error"
    assert lint_source("import os\n\nprint(os.sep)\n", "ok.py").clean


def test_the_demo_project_parser_module_lints_clean_and_stats_does_not(tmp_path: Path) -> None:
    project = create_project(tmp_path)
    stats = lint_source((project / "csvstats" / "stats.py").read_text(), "csvstats/stats.py")
    assert {p.code for p in stats.problems} == {"unused-import", "todo"}
    parser = lint_source((project / "csvstats" / "parser.py").read_text(), "csvstats/parser.py")
    assert parser.clean
