"""The command under a hostile or new user: approvals, MCP servers' environment, stderr,
time limits and look-alike names, and what reaches stderr (one line per error, no tracebacks).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from agent_flow.cli._build import _mcp_servers, _split_mcp_spec
from agent_flow.cli._exit import _Failure
from agent_flow.config import AgentConfig
from agent_flow.tools import MCPServerStdio
from tests.openai_server import (
    OpenAIServer,
    sse_reply,
    text_chunks,
    tool_call_chunks,
)
from tests.test_cli import (
    REPO,
    TerminalInput,
    clean_environment,  # noqa: F401  (autouse: no OPENAI_* or AGENT_FLOW_* from outside)
    invoke,
    invoke_async,
    model_flags,
    script_env,
)

SERVERS = REPO / "tests" / "mcp_servers"
ENV_SERVER = f"{sys.executable} {SERVERS / 'env_server.py'}"


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    root.mkdir()
    return root.resolve()


# -- approvals -------------------------------------------------------------------------------


async def test_yes_does_not_approve_a_high_risk_tool_but_yes_all_does(
    openai_server: OpenAIServer, workspace: Path, tmp_path: Path
) -> None:
    command = '{"command": "echo hi > made.txt"}'
    for flag in ("--yes", "--yes-all"):
        openai_server.script(
            sse_reply(tool_call_chunks([("c1", "run_command", command)])),
            sse_reply(text_chunks("Done.")),
        )
        argv = ["run", "make it", "--trace", *model_flags(openai_server)]
        argv += ["--workspace", str(workspace)]
        result = await invoke_async([*argv, "--db", str(tmp_path / "s.db"), flag])
        assert result.code == 0, result.err
        if flag == "--yes":
            assert "✗ refused: run_command (run_command is a high-risk tool" in result.out
            assert "rerun with --yes-all to approve it too" in result.out
            assert not (workspace / "made.txt").exists()
        else:
            assert "✓ approved: run_command (approved by --yes-all)" in result.out
            assert (workspace / "made.txt").read_text() == "hi\n"
    # With --yes on a terminal, a high-risk call is asked rather than refused.
    openai_server.script(
        sse_reply(tool_call_chunks([("c1", "run_command", command)])),
        sse_reply(text_chunks("Done.")),
    )
    asked = await invoke_async(
        [*argv, "--db", str(tmp_path / "s.db"), "--yes"], stdin=TerminalInput("n\n")
    )
    assert "allow run_command (high risk)? [y/N]" in asked.out
    assert "refused at the terminal" in asked.out


# -- MCP servers from the command line ---------------------------------------------------------


def test_an_mcp_spec_reads_a_server_name_and_shell_style_variables() -> None:
    assert _split_mcp_spec("fs=npx -y server /tmp") == ("fs", {}, ["npx", "-y", "server", "/tmp"])
    assert _split_mcp_spec("GITHUB_TOKEN=abc DEBUG=1 npx server") == (
        None,
        {"GITHUB_TOKEN": "abc", "DEBUG": "1"},
        ["npx", "server"],
    )
    assert _split_mcp_spec("gh=GITHUB_TOKEN='a b' npx server") == (
        "gh",
        {"GITHUB_TOKEN": "a b"},
        ["npx", "server"],
    )
    assert _split_mcp_spec("my-server=python s.py") == ("my-server", {}, ["python", "s.py"])
    with pytest.raises(_Failure, match="sets FS but names no command"):
        _split_mcp_spec("FS=mcp-fs")


def test_mcp_env_and_mcp_timeout_apply_to_every_stdio_server(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PASSED_ON", "from-the-agent")
    config = AgentConfig(mcp_servers=(MCPServerStdio(name="cfg", command="x", env={"A": "1"}),))
    servers = _mcp_servers(
        config,
        ["B=2 python s.py"],
        [],
        env=["C=3", "PASSED_ON"],
        timeout=7.5,
    )
    assert [(s.name, getattr(s, "env", None)) for s in servers] == [
        ("cfg", {"A": "1", "C": "3", "PASSED_ON": "from-the-agent"}),
        ("s", {"B": "2", "C": "3", "PASSED_ON": "from-the-agent"}),
    ]
    assert all(s.timeout == s.connect_timeout == 7.5 for s in servers)
    with pytest.raises(_Failure, match="--mcp-env NOT_SET_ANYWHERE passes the variable"):
        _mcp_servers(config, [], [], env=["NOT_SET_ANYWHERE"])


async def test_a_server_gets_the_variables_given_on_the_command_line(
    openai_server: OpenAIServer, tmp_path: Path
) -> None:
    openai_server.script(
        sse_reply(
            tool_call_chunks(
                [
                    ("c1", "env_getenv", json.dumps({"name": "GREETING"})),
                    ("c2", "env_getenv", json.dumps({"name": "EXTRA"})),
                ]
            )
        ),
        sse_reply(text_chunks("Done.")),
    )
    result = await invoke_async(
        [
            "run",
            "read the variables",
            *model_flags(openai_server),
            "--db",
            str(tmp_path / "s.db"),
            "--mcp",
            f"env=GREETING='hello there' {ENV_SERVER}",
            "--mcp-env",
            "EXTRA=more",
        ]
    )
    assert result.code == 0, result.err
    answers = [m["content"] for m in openai_server.bodies[1]["messages"] if m["role"] == "tool"]
    assert answers == ["hello there", "more"]


def test_look_alike_tool_names_do_not_stop_the_command() -> None:
    result = invoke(["tools", "--mcp", f"env={ENV_SERVER}"])
    assert result.code == 0, result.err
    names = [line.split()[0] for line in result.out.splitlines()[1:-1]]
    assert "env_get_sum" in names
    assert any(n.startswith("env_get_sum_") for n in names)


def test_a_server_that_fails_to_start_is_one_line_with_its_stderr() -> None:
    script = "import sys; print('error: GITHUB_TOKEN is not set', file=sys.stderr); sys.exit(1)"
    result = invoke(["tools", "--mcp", f'gh={sys.executable} -c "{script}"'])
    assert result.code == 2
    assert result.err.count("\n") == 1
    assert result.err.startswith("agent-flow: error: an MCP server could not be started: ")
    assert "its stderr ended with: error: GITHUB_TOKEN is not set" in result.err


def test_a_server_that_never_answers_names_the_limit_and_the_flag() -> None:
    script = "import sys; sys.stdin.read()"
    result = invoke(
        ["tools", "--mcp-timeout", "0.5", "--mcp", f'mute={sys.executable} -c "{script}"']
    )
    assert result.code == 2
    assert result.err == (
        "agent-flow: error: MCP server 'mute' did not answer its initialization and "
        "listing within 0.5s (its connect_timeout); a server that is slow to start needs a "
        "longer connect_timeout: allow it longer with --mcp-timeout SECONDS\n"
    )


# -- what reaches stderr -------------------------------------------------------------------------


def run_script(*argv: str) -> subprocess.CompletedProcess[str]:
    """The command as a process: its stderr is the real one, with no test logging in the way."""
    return subprocess.run(
        [sys.executable, "-m", "agent_flow.cli", *argv],
        capture_output=True,
        text=True,
        env=script_env(),
        timeout=120,
        check=False,
    )


def test_a_server_banner_on_stdout_puts_no_traceback_on_stderr(tmp_path: Path) -> None:
    noisy = f"env={ENV_SERVER} noisy"
    quiet = run_script("tools", "--mcp", noisy)
    assert quiet.returncode == 0, quiet.stderr
    assert quiet.stderr == ""
    # -v tells, in one line per message; --log-file keeps the whole story.
    verbose = run_script("tools", "-v", "--mcp", noisy)
    assert "Traceback" not in verbose.stderr
    assert "agent-flow: error: mcp.client.stdio: Failed to parse JSONRPC message" in verbose.stderr
    log = tmp_path / "agent-flow.log"
    logged = run_script("tools", "--log-file", str(log), "--mcp", noisy)
    assert logged.stderr == ""
    text = log.read_text()
    assert "Failed to parse JSONRPC message from server" in text
    assert "Traceback" in text
