"""The `agent-flow` command, driven in-process through `main` and once as the installed script.

Runs talk to the scripted OpenAI-compatible server of `tests.openai_server` over 127.0.0.1;
`main` runs its own event loop, so it is called in a worker thread while the server serves
on the test's loop.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from agent_flow.agent import AgentExecutor
from agent_flow.cli import main
from agent_flow.cli._build import _agent_config
from agent_flow.config import AgentConfig, ContextConfig
from agent_flow.events import event_from_json
from agent_flow.sessions import SQLiteSessionStore
from agent_flow.testing import ScriptedLLM, call, reply
from tests.openai_server import (
    OpenAIServer,
    Reply,
    sse_reply,
    text_chunks,
    tool_call_chunks,
)

REPO = Path(__file__).resolve().parent.parent
SECRET = "sk-test-secret-never-printed"


class Captured:
    def __init__(self, code: int, out: str, err: str) -> None:
        self.code, self.out, self.err = code, out, err


class TerminalInput(io.StringIO):
    """Stdin that says it is a terminal, with the user's answers in it."""

    def isatty(self) -> bool:
        return True


def invoke(argv: list[str], *, stdin: io.StringIO | None = None) -> Captured:
    out, err = io.StringIO(), io.StringIO()
    code = main(argv, stdin=stdin or io.StringIO(""), stdout=out, stderr=err)
    return Captured(code, out.getvalue(), err.getvalue())


async def invoke_async(argv: list[str], *, stdin: io.StringIO | None = None) -> Captured:
    return await asyncio.to_thread(invoke, argv, stdin=stdin)


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # conftest.py has removed OPENAI_* and AGENT_FLOW_* variables for the whole session.
    monkeypatch.setenv("AGENT_FLOW_HOME", str(tmp_path / "home"))
    # Fail fast against endpoints that do not answer: no SDK or agent retries.
    monkeypatch.setenv("AGENT_FLOW_MODEL_RETRIES", "0")
    monkeypatch.setenv("AGENT_FLOW_LLM_OVERRIDES__MAX_RETRIES", "0")


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    root.mkdir()
    (root / "notes.txt").write_text("the launch code is 1234\n")
    return root.resolve()


def model_flags(server: OpenAIServer) -> list[str]:
    return ["--model", "test-model", "--base-url", server.base_url]


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# -- help and usage ------------------------------------------------------------------------


def test_help_lists_the_commands_and_documents_the_exit_codes(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["--help"]) == 0
    text = capsys.readouterr().out
    for command in ("run", "chat", "demo", "sessions", "tools"):
        assert f"    {command}" in text
    for code in ("0 ", "1 ", "2 ", "3 ", "130"):
        assert f"\n  {code}" in text
    assert "OPENAI_API_KEY" in text


def test_a_usage_error_exits_with_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "task", "--max-iterations", "0"]) == 2
    assert "--max-iterations: 0 must be at least 1" in capsys.readouterr().err


# -- run -----------------------------------------------------------------------------------


async def test_run_renders_the_stream_runs_tools_and_stores_the_session(
    openai_server: OpenAIServer, workspace: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    openai_server.script(
        sse_reply(
            tool_call_chunks([("c1", "read_file", '{"path": "notes.txt"}')], text="Reading.")
        ),
        sse_reply(text_chunks("The launch code is 1234.")),
    )
    db = tmp_path / "s.db"
    args = ["run", "what is the code?", *model_flags(openai_server), "--trace"]
    result = await invoke_async([*args, "--workspace", str(workspace), "--db", str(db)])

    assert result.code == 0, result.err
    out = result.out
    assert "run " in out and "started" in out and "model test-model" in out
    assert "context [" in out and "tokens: system" in out and "history" in out
    assert "▸ read_file {" in out
    assert "✓ read_file" in out and "the launch code is 1234" in out
    assert "The launch code is 1234." in out
    assert "run finished: answered" in out
    assert SECRET not in out + result.err
    # The key went to the server, the tools were offered.
    assert openai_server.requests[0].headers["authorization"] == f"Bearer {SECRET}"
    offered = {tool["function"]["name"] for tool in openai_server.bodies[0]["tools"]}
    assert {"read_file", "write_file", "task_completion"} <= offered
    async with SQLiteSessionStore(db) as store:
        (info,) = await store.list()
        state = await store.load(info.id)
    assert info.status == "completed"
    assert f"session {info.id} saved in {db}" in out
    assert [e.kind for e in state.entries] == [
        "user_message",
        "agent_message",
        "tool_call",
        "tool_result",
        "agent_message",
    ]
    assert state.environment is not None
    assert state.environment.system.working_directory == str(workspace)


async def test_json_output_is_one_event_per_line_and_parses_back(
    openai_server: OpenAIServer, tmp_path: Path
) -> None:
    openai_server.script(sse_reply(text_chunks("Hello there, human.")))
    args = ["run", "say hello", *model_flags(openai_server), "--json", "--db", str(tmp_path / "d")]
    result = await invoke_async(args)

    assert result.code == 0, result.err
    events = [event_from_json(line) for line in result.out.splitlines()]
    kinds = [event.kind for event in events]
    assert kinds[0] == "run_started" and kinds[-1] == "run_finished"
    assert {"iteration_started", "context_built", "text_delta", "model_responded"} <= set(kinds)
    assert [event.seq for event in events] == list(range(len(events)))
    assert "".join(e.text for e in events if e.kind == "text_delta") == "Hello there, human."
    assert "session" in result.err  # human notes go to stderr in JSON mode


async def test_a_session_is_continued_with_session_id(
    openai_server: OpenAIServer, tmp_path: Path
) -> None:
    db = str(tmp_path / "s.db")
    openai_server.script(
        sse_reply(text_chunks("Noted: your name is Ada.")),
        sse_reply(text_chunks("You are Ada.")),
    )
    first = await invoke_async(["run", "My name is Ada.", *model_flags(openai_server), "--db", db])
    assert first.code == 0, first.err
    async with SQLiteSessionStore(db) as store:
        (info,) = await store.list()

    second = await invoke_async(
        ["run", "What is my name?", *model_flags(openai_server), "--db", db, "--session", info.id]
    )

    assert second.code == 0, second.err
    sent = [m["content"] for m in openai_server.bodies[1]["messages"] if m["role"] != "system"]
    assert sent == ["My name is Ada.", "Noted: your name is Ada.", "What is my name?"]
    async with SQLiteSessionStore(db) as store:
        sessions = await store.list()
        state = await store.load(info.id)
    assert len(sessions) == 1
    assert state.entries[-1].content == "You are Ada."  # type: ignore[union-attr]


async def test_a_write_needing_approval_is_refused_without_a_terminal_and_approved_with_yes(
    openai_server: OpenAIServer, workspace: Path, tmp_path: Path
) -> None:
    write = '{"path": "out.txt", "content": "written"}'
    for flag in ([], ["--yes"]):
        openai_server.script(
            sse_reply(tool_call_chunks([("w1", "write_file", write)])),
            sse_reply(text_chunks("Done.")),
        )
        result = await invoke_async(
            [
                "run",
                "write it",
                *model_flags(openai_server),
                "--workspace",
                str(workspace),
                "--db",
                str(tmp_path / "s.db"),
                "--trace",
                *flag,
            ]
        )
        assert result.code == 0, result.err
        assert "? approval needed for write_file" in result.out
        if flag:
            assert "✓ approved: write_file (approved by --yes)" in result.out
            assert (workspace / "out.txt").read_text() == "written"
        else:
            assert "✗ refused: write_file (nobody could be asked" in result.out
            assert "rerun with --yes" in result.out
            assert not (workspace / "out.txt").exists()


async def test_an_approval_is_asked_on_a_terminal(
    openai_server: OpenAIServer, workspace: Path, tmp_path: Path
) -> None:
    openai_server.script(
        sse_reply(tool_call_chunks([("w1", "write_file", '{"path": "a.txt", "content": "x"}')])),
        sse_reply(text_chunks("Done.")),
    )
    result = await invoke_async(
        [
            "run",
            "write it",
            *model_flags(openai_server),
            "--workspace",
            str(workspace),
            "--db",
            str(tmp_path / "s.db"),
        ],
        stdin=TerminalInput("y\n"),
    )
    assert result.code == 0, result.err
    assert "allow write_file (medium risk)? [y/N]" in result.out
    assert "approved: write_file (approved at the terminal)" in result.out
    assert (workspace / "a.txt").read_text() == "x"


async def test_chat_sends_each_line_to_one_session(
    openai_server: OpenAIServer, tmp_path: Path
) -> None:
    db = str(tmp_path / "s.db")
    openai_server.script(sse_reply(text_chunks("Hi Ada.")), sse_reply(text_chunks("Bye Ada.")))
    result = await invoke_async(
        ["chat", *model_flags(openai_server), "--db", db],
        stdin=io.StringIO("hello, I am Ada\n\n/help\ngoodbye\n/exit\nnever sent\n"),
    )
    assert result.code == 0, result.err
    assert "you> " in result.out and "Hi Ada." in result.out and "Bye Ada." in result.out
    assert "/env shows the environment" in result.out
    assert len(openai_server.requests) == 2
    async with SQLiteSessionStore(db) as store:
        (info,) = await store.list()
        state = await store.load(info.id)
    users = [e.content for e in state.entries if e.kind == "user_message"]  # type: ignore[union-attr]
    assert users == ["hello, I am Ada", "goodbye"]
    assert f"session {info.id} saved" in result.out


# -- errors --------------------------------------------------------------------------------


def test_no_credentials_is_one_line_saying_what_to_do(tmp_path: Path) -> None:
    db = str(tmp_path / "d")
    result = invoke(["run", "task", "--model", "gpt-4o-mini", "--provider", "openai", "--db", db])
    assert result.code == 2
    assert result.err.count("\n") == 1
    assert "no API key: the environment variable OPENAI_API_KEY is not set" in result.err
    assert "--base-url" in result.err


def test_no_base_url_is_never_a_silent_call_to_openai(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Even with a key at hand: "openai_compatible" means some other server, so the key must
    # not go to OpenAI's public endpoint because the URL was forgotten.
    monkeypatch.setenv("OPENAI_API_KEY", "sk-not-for-openai")
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    result = invoke(["run", "task", "--model", "m", "--db", str(tmp_path / "d")])
    assert result.code == 2
    assert result.err.count("\n") == 1
    assert "no base_url" in result.err and "--provider openai" in result.err
    named = invoke(["run", "task", "--model", "m", "--api-key-env", "MY_KEY"])
    assert named.code == 2 and "MY_KEY is not set" in named.err


def test_no_model_is_a_usage_error() -> None:
    result = invoke(["run", "task"])
    assert result.code == 2
    assert "no model is configured: pass --model NAME" in result.err


def test_an_unreachable_endpoint_is_said_once_exits_3_and_keeps_the_failed_session(
    tmp_path: Path,
) -> None:
    url = f"http://127.0.0.1:{closed_port()}/v1"
    db = tmp_path / "d"
    for flags in ([], ["--trace"]):
        result = invoke(["run", "task", "--model", "m", "--base-url", url, "--db", str(db), *flags])
        assert result.code == 3
        assert result.err.count("\n") == 1
        assert result.err.startswith("agent-flow: error: could not reach the model server at")
        # Said once: the trace marks the fatal error without repeating it.
        assert "could not reach" not in result.out
        trace = "  ✗ error ModelConnectionError [fatal]\n" in result.out
        assert trace if flags else "✗" not in result.out
        # The CLI never deletes what it stored: the session and the events saying why stay.
        assert "the session is kept; once fixed, continue with  agent-flow run --session" in (
            result.out
        )
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT status FROM sessions").fetchall() == [("failed",)] * 2
        errors = conn.execute("SELECT count(*) FROM events WHERE kind = 'execution_error'")
        assert errors.fetchone() == (2,)


def test_a_bad_config_key_names_the_key_and_the_file(tmp_path: Path) -> None:
    config = tmp_path / "agent.toml"
    config.write_text('[agent]\nmax_iteration = 3\n[agent.context]\nmax_tokens = "big"\n')
    result = invoke(["run", "task", "--config", str(config), "--model", "m"])
    assert result.code == 2
    assert result.err.count("\n") == 1
    assert str(config) in result.err
    assert "max_iteration: Extra inputs are not permitted" in result.err
    assert "context.max_tokens" in result.err


def test_a_budget_too_small_for_the_tools_is_a_usage_error(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{closed_port()}/v1"
    db = tmp_path / "d"
    result = invoke(
        ["run", "t", "--budget", "200", "--model", "m", "--base-url", url, "--db", str(db)]
    )
    assert result.code == 2
    assert result.out == "" and result.err.count("\n") == 1
    assert "--budget 200 is too small for this agent" in result.err
    assert "the system prompt and the tool schemas alone need" in result.err
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT count(*) FROM sessions").fetchone() == (0,)
    missing = invoke(["tools", "--config", str(tmp_path / "missing.toml")])
    assert missing.code == 2 and "does not exist" in missing.err


def test_an_unknown_session_and_a_missing_workspace_are_usage_errors(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{closed_port()}/v1"
    base = ["run", "t", "--model", "m", "--base-url", url, "--db", str(tmp_path / "d")]
    unknown = invoke([*base, "--session", "nosuchsession"])
    assert unknown.code == 2 and "nosuchsession" in unknown.err
    missing = invoke([*base, "--workspace", str(tmp_path / "nope")])
    assert missing.code == 2 and "is not a directory" in missing.err
    broken = invoke([*base, "--mcp", "agent-flow-no-such-command-xyz --flag"])
    assert broken.code == 2
    assert "an MCP server could not be started" in broken.err and broken.err.count("\n") == 1


# -- sessions ------------------------------------------------------------------------------


async def make_session(db: Path, task: str = "count the files") -> str:
    llm = ScriptedLLM(
        [
            reply("Planning.", tool_calls=[call("update_plan", steps=[{"description": "count"}])]),
            reply(tool_calls=[call("task_completion", summary="There are 3 files.")]),
        ]
    )
    async with SQLiteSessionStore(db) as store:
        agent = AgentExecutor(
            llm, config=AgentConfig(context=ContextConfig(max_tokens=8000)), store=store
        )
        await agent.run(task)
        assert agent.session_id is not None
        return agent.session_id


async def test_sessions_list_show_export_import_and_delete(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    session_id = await make_session(db)

    listing = await invoke_async(["sessions", "list", "--db", str(db)])
    assert listing.code == 0
    header, row, footer = listing.out.splitlines()
    assert header.split() == [
        "ID",
        "STATUS",
        "STEPS",
        "UPDATED",
        "TOKENS",
        "COST",
        "AGENT",
        "TITLE",
    ]
    assert row.startswith(session_id) and "completed" in row and "count the files" in row
    assert footer == f"1 session(s) in {db}"
    as_json = await invoke_async(["sessions", "list", "--db", str(db), "--json"])
    assert json.loads(as_json.out)["id"] == session_id

    show = await invoke_async(["sessions", "show", session_id, "--db", str(db)])
    assert show.code == 0
    assert f"session {session_id}  (completed)" in show.out
    assert "user_message count the files" in show.out
    assert "tool_call    task_completion" in show.out
    assert "[ ] count" in show.out and "-> completed, 2 iteration(s)" in show.out

    exported = tmp_path / "export.jsonl"
    export = await invoke_async(
        ["sessions", "export", session_id, "--db", str(db), "-o", str(exported)]
    )
    assert export.code == 0 and f"exported session {session_id}" in export.err
    lines = [json.loads(line) for line in exported.read_text().splitlines()]
    assert lines[0]["kind"] == "session" and lines[-1]["kind"] == "end"
    to_stdout = await invoke_async(["sessions", "export", session_id, "--db", str(db)])
    assert to_stdout.out == exported.read_text()

    other = tmp_path / "other.db"
    imported = await invoke_async(
        ["sessions", "import", str(exported), "--db", str(other), "--id", "copy-1"]
    )
    assert imported.code == 0 and "imported session copy-1" in imported.out
    deleted = await invoke_async(["sessions", "delete", "copy-1", "--db", str(other)])
    assert deleted.code == 0
    empty = await invoke_async(["sessions", "list", "--db", str(other)])
    assert empty.out == f"no sessions in {other}\n"
    gone = await invoke_async(["sessions", "show", "copy-1", "--db", str(other)])
    assert gone.code == 2 and "copy-1" in gone.err


def test_a_file_that_is_not_a_store_fails_with_1(tmp_path: Path) -> None:
    bogus = tmp_path / "bogus.db"
    bogus.write_text("not sqlite " * 100)
    result = invoke(["sessions", "list", "--db", str(bogus)])
    assert result.code == 1 and result.err.startswith("agent-flow: error: the session store")


# -- tools ---------------------------------------------------------------------------------


def test_tools_lists_what_is_offered_with_token_costs(workspace: Path) -> None:
    result = invoke(
        [
            "tools",
            "--workspace",
            str(workspace),
            "--mcp",
            f"demo={sys.executable} -m agent_flow._demo.mcp_server --root {workspace}",
        ]
    )
    assert result.code == 0, result.err
    *table, footer, boundary = result.out.splitlines()
    rows = {line.split()[0]: line.split() for line in table[1:]}
    assert set(rows) == {
        "read_file",
        "write_file",
        "list_directory",
        "directory_tree",
        "search_text",
        "run_command",
        "demo_search",
        "demo_lint",
        "task_completion",
        "ask_question",
        "converse",
        "update_plan",
    }
    assert rows["read_file"][1:3] == ["workspace", "read-only"]
    assert rows["demo_search"][1] == "mcp:demo"
    assert rows["update_plan"][1] == "control"
    assert "asks" in rows["write_file"]
    costs = [int(row[-1].replace(",", "")) for row in rows.values()]
    assert all(cost > 10 for cost in costs)
    total = int(footer.split("cost ")[1].split(" tokens")[0].replace(",", ""))
    assert footer.startswith("12 tools;") and total < sum(costs)
    # What a shell command can reach here, plainly: confined by bubblewrap or not at all.
    assert boundary.startswith(
        ("run_command: Commands run confined by bubblewrap", "run_command: Commands are NOT")
    )


def test_tools_without_anything_lists_the_control_tools() -> None:
    result = invoke(["tools"])
    assert result.code == 0
    assert result.out.splitlines()[-1].startswith("4 tools;")


def test_tools_says_what_every_prompt_spends_before_environment_and_history() -> None:
    result = invoke(["tools"])
    agent = AgentExecutor(ScriptedLLM([]), config=AgentConfig())
    fixed = agent.context.fixed_tokens(tools=agent.offered_tools())
    assert result.out.splitlines()[-1].endswith(
        f"every prompt spends {fixed:,} of its 29,952 tokens before the environment and history"
    )


def test_tools_starts_the_mcp_servers_of_the_config_file(tmp_path: Path) -> None:
    server = REPO / "tests" / "mcp_servers" / "basic_server.py"
    config = tmp_path / "agent.toml"
    config.write_text(
        f"[[agent.mcp_servers]]\nkind = 'stdio'\nname = 'basic'\n"
        f"command = {json.dumps(sys.executable)}\nargs = [{json.dumps(str(server))}]\n"
    )
    result = invoke(["tools", "--config", str(config)])
    assert result.code == 0, result.err
    rows = {line.split()[0]: line.split() for line in result.out.splitlines()[1:-1]}
    assert rows["basic_echo"][1] == "mcp:basic"


def test_the_budget_flag_scales_an_unset_reserve_and_refuses_a_set_one_too_big(
    tmp_path: Path,
) -> None:
    flags = argparse.Namespace(config=None, max_iterations=None, budget=1000)
    assert _agent_config(flags, print).context.reserve_output_tokens == 250
    config = tmp_path / "agent.toml"
    config.write_text("[agent.context]\nreserve_output_tokens = 2048\n")
    url = f"http://127.0.0.1:{closed_port()}/v1"
    result = invoke(
        ["run", "t", "--config", str(config), "--budget", "1000", "--model", "m", "--base-url", url]
    )
    assert result.code == 2
    assert "--budget 1000 gives an invalid context" in result.err
    assert "reserve_output_tokens (2048) must be smaller than max_tokens (1000)" in result.err


# -- the installed script, and Ctrl-C ------------------------------------------------------


def script_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "AGENT_FLOW_"))}
    env["PYTHONPATH"] = str(REPO)
    return env


def agent_flow_script() -> str:
    script = Path(sys.executable).parent / "agent-flow"
    assert script.exists(), f"the agent-flow script is not installed next to {sys.executable}"
    return str(script)


@pytest.mark.parametrize(("stop", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
async def test_ctrl_c_or_sigterm_cancels_the_run_keeps_the_session_and_exits_130_or_143(
    openai_server: OpenAIServer, tmp_path: Path, stop: signal.Signals, code: int
) -> None:
    openai_server.script(Reply(hang=True))
    db = tmp_path / "s.db"
    process = await asyncio.create_subprocess_exec(
        agent_flow_script(),
        "run",
        "wait forever",
        *model_flags(openai_server),
        "--json",
        "--db",
        str(db),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=script_env(),
    )
    assert process.stdout is not None
    kinds = []
    async with asyncio.timeout(60):
        while "context_built" not in kinds:
            line = await process.stdout.readline()
            assert line, "the run ended before asking the model"
            kinds.append(event_from_json(line.decode()).kind)
        process.send_signal(stop)
        out, err = await process.communicate()

    assert process.returncode == code, err.decode()
    events = [event_from_json(line) for line in out.decode().splitlines()]
    assert events[-1].kind == "run_finished" and events[-1].stop_reason == "cancelled"  # type: ignore[union-attr]
    if stop == signal.SIGINT:
        assert "cancelled; the session is kept" in err.decode()
    else:  # before, the process died at once, its session left "active" for the next claim
        assert err.decode() == "agent-flow: error: terminated\n"
    with sqlite3.connect(db) as conn:
        (status,) = conn.execute("SELECT status FROM sessions").fetchone()
    assert status == "cancelled"


def test_tools_reaches_an_mcp_server_over_http() -> None:
    with subprocess.Popen(
        [sys.executable, str(REPO / "tests" / "mcp_servers" / "basic_server.py"), "http"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=script_env(),
    ) as server:
        try:
            assert server.stdout is not None
            port = int(server.stdout.readline())
            result = invoke(["tools", "--mcp-http", f"web=http://127.0.0.1:{port}/mcp"])
        finally:
            server.terminate()
    assert result.code == 0, result.err
    names = [line.split()[0] for line in result.out.splitlines()[1:-1]]
    assert {"web_echo", "web_add", "web_shout"} <= set(names)
    assert "mcp:web" in result.out
    unnamed = invoke(["tools", "--mcp-http", "ftp://nowhere"])
    assert unnamed.code == 2 and "is not an http(s) URL" in unnamed.err
