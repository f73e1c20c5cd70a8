"""Mistakes at the command line: said once, naming the cause, with the right exit code.

Usage mistakes exit 2 before anything runs; a run that never reached the model leaves no
session with a resume hint that could not help.
"""

from __future__ import annotations

import asyncio
import io
import socket
import sqlite3
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from agent_flow.cli import main
from tests.openai_server import (
    OpenAIServer,
    sse_reply,
    text_chunks,
    tool_call_chunks,
)

# The autouse fixture that clears OPENAI_* / AGENT_FLOW_* and points AGENT_FLOW_HOME at tmp.
from tests.test_cli import clean_environment as clean_environment
from tests.test_cli import closed_port, invoke, invoke_async, model_flags


def sessions_in(db: Path) -> int:
    with sqlite3.connect(db) as conn:
        (count,) = conn.execute("SELECT count(*) FROM sessions").fetchone()
    return int(count)


async def test_an_api_key_variable_that_is_not_set_is_refused_by_name(
    openai_server: OpenAIServer, tmp_path: Path
) -> None:
    # With a base URL no key is needed, but a variable named on purpose must not be skipped.
    result = await invoke_async(
        ["run", "t", *model_flags(openai_server), "--api-key-env", "MY_PROVIDER_KEY"]
    )
    assert result.code == 2
    assert result.err == (
        "agent-flow: error: --api-key-env: the environment variable MY_PROVIDER_KEY is not "
        "set; export it, or leave out --api-key-env for a server that needs no key\n"
    )
    assert openai_server.requests == []


async def test_a_named_api_key_variable_that_is_set_is_sent(
    openai_server: OpenAIServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MY_PROVIDER_KEY", "sk-mine")
    openai_server.script(sse_reply(text_chunks("ok")))
    result = await invoke_async(
        [
            "run",
            "t",
            *model_flags(openai_server),
            "--api-key-env",
            "MY_PROVIDER_KEY",
            "--db",
            str(tmp_path / "d"),
        ]
    )
    assert result.code == 0, result.err
    assert openai_server.requests[0].headers["authorization"] == "Bearer sk-mine"


def test_a_bad_agent_flow_variable_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENT_FLOW_MAX_ITERATIONS", "lots")
    result = invoke(["run", "t", "--model", "m", "--base-url", "http://127.0.0.1:9/v1"])
    assert result.code == 2
    assert result.err.count("\n") == 1
    assert "AGENT_FLOW_MAX_ITERATIONS (sets max_iterations): Input should be a valid" in result.err
    assert "fix or unset the variable" in result.err


async def test_a_misspelt_agent_flow_variable_is_warned_about_and_the_run_goes_on(
    openai_server: OpenAIServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AGENT_FLOW_MAX_ITERATINS", "3")
    openai_server.script(sse_reply(text_chunks("ok")))
    result = await invoke_async(
        ["run", "t", *model_flags(openai_server), "--db", str(tmp_path / "d")]
    )
    assert result.code == 0
    assert result.err == (
        "agent-flow: warning: AGENT_FLOW_MAX_ITERATINS is ignored: it names no agent config "
        "field; did you mean AGENT_FLOW_MAX_ITERATIONS?\n"
    )
    tools = await invoke_async(["tools"])
    assert "AGENT_FLOW_MAX_ITERATINS is ignored" in tools.err and tools.code == 0


def test_a_db_that_is_a_directory_is_a_usage_error(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{closed_port()}/v1"
    for argv in (
        ["run", "t", "--model", "m", "--base-url", url, "--db", str(tmp_path)],
        ["chat", "--model", "m", "--base-url", url, "--db", str(tmp_path)],
        ["sessions", "list", "--db", str(tmp_path)],
        ["sessions", "show", "x", "--db", str(tmp_path)],
    ):
        result = invoke(argv)
        assert result.code == 2, argv
        assert result.err == (
            f"agent-flow: error: --db {tmp_path} is a directory; give the store's file, e.g. "
            f"--db {tmp_path / 'sessions.db'}\n"
        )


def test_importing_a_missing_export_is_a_usage_error(tmp_path: Path) -> None:
    db = str(tmp_path / "s.db")
    missing = invoke(["sessions", "import", str(tmp_path / "missing.jsonl"), "--db", db])
    assert missing.code == 2
    assert missing.err == (
        f"agent-flow: error: {tmp_path / 'missing.jsonl'} does not exist; give a file written "
        "by `agent-flow sessions export ID -o FILE`\n"
    )
    directory = invoke(["sessions", "import", str(tmp_path), "--db", db])
    assert directory.code == 2 and "is a directory" in directory.err


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (b"{not json\n", "line 1 of"),
        (b"", "is empty"),
        (b"\xff\xfe not UTF-8", "cannot read the export"),
    ],
)
def test_importing_a_file_that_is_no_export_is_a_usage_error_and_stores_nothing(
    tmp_path: Path, content: bytes, says: str
) -> None:
    db = str(tmp_path / "s.db")
    broken = tmp_path / "broken.jsonl"
    broken.write_bytes(content)
    result = invoke(["sessions", "import", str(broken), "--db", db])
    assert result.code == 2, result.err
    assert result.err.startswith("agent-flow: error: ") and says in result.err, result.err
    listed = invoke(["sessions", "list", "--db", db])
    assert listed.code == 0 and "broken" not in listed.out


async def test_exporting_to_a_missing_folder_and_importing_an_id_twice_are_usage_errors(
    tmp_path: Path,
) -> None:
    from agent_flow.sessions import SQLiteSessionStore

    db = tmp_path / "s.db"
    async with SQLiteSessionStore(db) as store:
        info = await store.create(agent="agent", title="kept")
    nowhere = tmp_path / "no" / "x.jsonl"
    missing = await invoke_async(
        ["sessions", "export", info.id, "-o", str(nowhere), "--db", str(db)]
    )
    assert missing.code == 2
    assert missing.err == (
        f"agent-flow: error: -o {nowhere}: the folder {nowhere.parent} does not exist; create "
        "it first\n"
    )  # before: exit 1, naming the temporary file the export is written to first
    export = tmp_path / "x.jsonl"
    written = await invoke_async(
        ["sessions", "export", info.id, "-o", str(export), "--db", str(db)]
    )
    assert written.code == 0, written.err
    twice = await invoke_async(["sessions", "import", str(export), "--db", str(db)])
    assert twice.code == 2, twice.err
    assert twice.err.endswith("; or import it under another id with --id NEW_ID\n"), twice.err
    renamed = await invoke_async(
        ["sessions", "import", str(export), "--id", "copy", "--db", str(db)]
    )
    assert renamed.code == 0, renamed.err


def test_a_run_without_a_task_is_a_usage_error() -> None:
    result = invoke(["run", "--model", "m", "--base-url", "http://127.0.0.1:9/v1"])
    assert result.code == 2
    assert result.err.startswith('agent-flow: error: run needs a task: agent-flow run "what')


def test_a_config_budget_too_small_names_the_setting(tmp_path: Path) -> None:
    config = tmp_path / "agent.toml"
    config.write_text("[agent.context]\nmax_tokens = 300\nreserve_output_tokens = 50\n")
    url = f"http://127.0.0.1:{closed_port()}/v1"
    db = tmp_path / "d"
    result = invoke(
        ["run", "t", "--config", str(config), "--model", "m", "--base-url", url, "--db", str(db)]
    )
    assert result.code == 2
    assert "the context budget max_tokens = 300 is too small for this agent" in result.err
    assert sessions_in(db) == 0


async def test_a_chat_whose_endpoint_is_unreachable_says_so_once_per_message_in_one_session(
    tmp_path: Path,
) -> None:
    url = f"http://127.0.0.1:{closed_port()}/v1"
    db = tmp_path / "d"
    result = await invoke_async(
        ["chat", "--model", "m", "--base-url", url, "--db", str(db)],
        stdin=io.StringIO("hello\nhello again\n"),
    )
    assert result.code == 3
    lines = result.err.splitlines()
    assert len(lines) == 2 and all("could not reach the model server" in line for line in lines)
    assert "could not reach" not in result.out and "--session" not in result.out
    # Both failed messages are kept, in the session the chat started (the CLI never deletes
    # what it stored).
    assert sessions_in(db) == 1
    with sqlite3.connect(db) as conn:
        errors = conn.execute("SELECT count(*) FROM events WHERE kind = 'execution_error'")
        assert errors.fetchone() == (2,)


# -- tools says what run will do -----------------------------------------------------------

NOTES_SERVER = textwrap.dedent(
    """
    from mcp.server.mcpserver import MCPServer
    from mcp_types import ToolAnnotations

    server = MCPServer("notes")


    @server.tool(annotations=ToolAnnotations(destructive_hint=True))
    def erase(name: str) -> str:
        return f"erased {name}"


    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    def look(name: str) -> str:
        return f"{name}: a note"


    server.run()
    """
)


async def test_tools_marks_an_mcp_write_tool_as_asking_approval_and_run_asks(
    openai_server: OpenAIServer, tmp_path: Path
) -> None:
    script = tmp_path / "notes_server.py"
    script.write_text(NOTES_SERVER)
    mcp = ["--mcp", f"notes={sys.executable} {script}"]

    listing = await invoke_async(["tools", *mcp])
    assert listing.code == 0, listing.err
    rows = {line.split("  ")[0]: line for line in listing.out.splitlines()[1:-1]}
    assert "high risk, asks approval" in rows["notes_erase"]
    assert "read-only" in rows["notes_look"] and "asks" not in rows["notes_look"]

    openai_server.script(
        sse_reply(tool_call_chunks([("e1", "notes_erase", '{"name": "todo"}')])),
        sse_reply(text_chunks("I could not erase it.")),
    )
    run = await invoke_async(
        ["run", "erase todo", *model_flags(openai_server), *mcp, "--db", str(tmp_path / "d")]
    )
    assert run.code == 0, run.err
    assert "notes_erase" in run.out and "has high risk" in run.out
    assert "refused: notes_erase (nobody could be asked" in run.out


@pytest.mark.parametrize(
    "url", ["localhost:8080/v1", "127.0.0.1:11434", "ftp://host/v1", "http://"]
)
@pytest.mark.parametrize("where", ["--base-url", "OPENAI_BASE_URL", "config"])
def test_a_base_url_that_is_no_http_url_is_a_usage_error_before_anything_runs(
    url: str, where: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = tmp_path / "d"
    argv = ["run", "t", "--model", "m", "--db", str(db)]
    if where == "--base-url":
        argv += ["--base-url", url]
    elif where == "OPENAI_BASE_URL":
        monkeypatch.setenv("OPENAI_BASE_URL", url)
    else:
        config = tmp_path / "agent.toml"
        config.write_text(f'[agent.llm]\nmodel = "m"\nbase_url = "{url}"\n')
        argv += ["--config", str(config)]
    result = invoke(argv)
    # Not an unreachable model after three attempts (exit 3): a usage error, at once.
    assert (result.code, result.out, result.err.count("\n")) == (2, "", 1)
    named = {"--base-url": "--base-url", "OPENAI_BASE_URL": "OPENAI_BASE_URL"}
    assert f"{named.get(where, 'base_url (in the config)')} {url!r} is not an http://" in result.err
    example = (
        "http://" + url.split("://", 1)[-1] if url != "http://" else "http://localhost:8080/v1"
    )
    assert result.err.rstrip().endswith(f"e.g. {example}")
    assert not db.exists() or sessions_in(db) == 0


async def test_the_labs_ask_refuses_a_base_url_without_a_scheme(tmp_path: Path) -> None:
    export = tmp_path / "run.jsonl"
    export.write_text("{}\n")
    result = await invoke_async(
        ["lab", str(export), "--budget", "2000", "--ask", "--model", "m",
         "--base-url", "localhost:8080/v1"]
    )  # fmt: skip
    assert result.code == 2 and "--base-url 'localhost:8080/v1' is not an http://" in result.err


@pytest.mark.parametrize(
    ("make", "said"),
    [
        (lambda path: path.mkdir(), "is a directory; name the TOML file in it"),
        (lambda path: path.write_bytes(b"\xff\xfe[agent]\n"), "is not UTF-8 text (byte 0xff"),
        (lambda path: path.write_text("[agent\n"), "is not valid TOML"),
    ],
)
def test_a_config_that_cannot_be_read_is_one_line_and_a_usage_error(
    tmp_path: Path, make: Any, said: str
) -> None:
    config = tmp_path / "agent.toml"
    make(config)
    url = f"http://127.0.0.1:{closed_port()}/v1"
    for argv in (
        ["run", "t", "--model", "m", "--base-url", url, "--config", str(config)],
        ["tools", "--config", str(config)],
    ):
        result = invoke(argv)
        assert result.code == 2, (argv, result.err)
        assert result.err.count("\n") == 1 and said in result.err, result.err
        assert result.err.startswith(f"agent-flow: error: config file {str(config)!r} ")


def test_a_config_with_a_byte_order_mark_is_read(tmp_path: Path) -> None:
    config = tmp_path / "agent.toml"
    config.write_bytes(b"\xef\xbb\xbf[agent]\nname = 'marked'\n")
    result = invoke(["tools", "--config", str(config)])
    assert result.code == 0, result.err


@pytest.mark.parametrize(
    "flag", ["--model", "--base-url", "--session", "--workspace", "--db", "--config", "--agent"]
)
def test_an_empty_flag_value_is_a_usage_error_naming_the_flag(
    flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # Taken as the flag left out, `--session "$ID"` with ID unset would start a new session.
    argv = ["run", "t", "--model", "m", "--base-url", "http://127.0.0.1:9/v1", flag, ""]
    assert invoke(argv).code == 2
    assert f"error: argument {flag}: an empty value" in capsys.readouterr().err  # argparse's
    assert invoke(["sessions", "list", "--db", " "]).code == 2


def test_serve_on_a_taken_port_is_a_usage_error_and_shows_no_token(tmp_path: Path) -> None:
    db = str(tmp_path / "s.db")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = invoke(["serve", "--port", str(port), "--db", db])
    assert result.code == 2
    assert result.err == (
        # Served without a config: said at once, not at the first session it refuses.
        "agent-flow: warning: no model is configured, so every new session will be refused: "
        "give --config agent.toml naming one ([agent.llm] or [llms.NAME])\n"
        f"agent-flow: error: cannot listen on 127.0.0.1:{port} (Address already in use); "
        "choose another --port, or stop what listens there\n"
    )  # and no "serving" line with a token, for a server that never ran
    wrong = invoke(["serve", "--port", "99999", "--db", db])
    assert wrong.code == 2
    assert wrong.err.startswith("agent-flow: error: --port: Input should be less than or equal")
    no_root = invoke(["serve", "--workspace-root", str(tmp_path / "nope"), "--db", db])
    assert no_root.code == 2
    assert no_root.err.endswith(f"--workspace-root {tmp_path / 'nope'} is not a directory\n")
    nowhere = invoke(["serve", "--host", "nosuchhost.invalid", "--token", "t" * 32, "--db", db])
    assert nowhere.code == 2 and "--host nosuchhost.invalid: no such address" in nowhere.err


class _ClosedPipe(io.StringIO):
    """Stdout whose reader leaves after `lines` lines (``| head``): later writes raise."""

    def __init__(self, lines: int) -> None:
        super().__init__()
        self.left = lines
        self.failed_writes = 0

    def write(self, text: str) -> int:
        if self.left <= 0:
            self.failed_writes += 1
            raise BrokenPipeError(32, "Broken pipe")
        self.left -= text.count("\n")
        return super().write(text)


@pytest.mark.parametrize("view", ["--json", "--trace"])
async def test_a_reader_that_leaves_stops_the_run_quietly(view: str, tmp_path: Path) -> None:
    """Before, every later event's hook failed on the closed pipe, each failure an error line."""
    answer = sse_reply(text_chunks("word " * 400, chunk_size=5))
    async with OpenAIServer(handler=lambda request: answer) as server:
        out, err = _ClosedPipe(lines=1), io.StringIO()
        argv = ["run", "hi", *model_flags(server), view, "--db", str(tmp_path / "s.db")]
        code = await asyncio.to_thread(main, argv, stdin=io.StringIO(""), stdout=out, stderr=err)
    assert (code, err.getvalue()) == (1, "")
    assert out.failed_writes == 1  # then nothing more was tried: the run was stopped


def test_commands_that_read_sessions_never_create_a_store(tmp_path: Path) -> None:
    db = tmp_path / "no" / "such" / "sessions.db"
    listed = invoke(["sessions", "list", "--db", str(db)])
    assert listed.code == 0 and listed.out == f"no sessions in {db}\n"
    assert invoke(["sessions", "list", "--json", "--db", str(db)]).out == ""
    for command in (
        ["sessions", "show", "abc"],
        ["sessions", "export", "abc"],
        ["sessions", "delete", "abc"],
        ["lab", "abc", "--budget", "2000"],
    ):
        result = invoke([*command, "--db", str(db)])
        assert result.code == 2, (command, result.err)
        assert f"no session 'abc': the store {db} does not exist" in result.err, result.err
    assert not (tmp_path / "no").exists()
