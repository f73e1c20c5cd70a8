"""The shell's boundary: no secrets in, none out, and confinement where bubblewrap works.

The canary tests plant a fake API key in the agent's environment and in a file, let an agent
run commands that would print it, and check that it reaches nothing: not the tool result, the
events, the environment, the session store, the export, nor the next prompt.
"""

from __future__ import annotations

import io
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent_flow import AgentConfig, AgentExecutor
from agent_flow.errors import UserError
from agent_flow.events import AgentEvent, event_to_json
from agent_flow.messages import ToolCall
from agent_flow.sessions import InMemorySessionStore
from agent_flow.testing import ScriptedLLM, call, reply
from agent_flow.tools import (
    PolicyEngine,
    SecretRedactor,
    ShellSettings,
    Tool,
    ToolContext,
    ToolExecutor,
    ToolResult,
    Workspace,
    looks_secret,
    shell_boundary,
    workspace_tools,
)
from agent_flow.tools._sandbox import command_environment, resolve_confinement

CANARY = "sk-canary-4c1d2e9f8a7b6c5d"


def bwrap_works() -> bool:
    try:
        return resolve_confinement(ShellSettings(sandbox="bwrap"))[0] == "bwrap"
    except UserError:
        return False


needs_bwrap = pytest.mark.skipif(not bwrap_works(), reason="bubblewrap is not usable here")
MODES = [
    pytest.param("none", id="unconfined"),
    pytest.param("bwrap", id="bwrap", marks=needs_bwrap),
]


@pytest.fixture
def root(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    return ws


async def run(tool: Tool, **arguments: object) -> ToolResult:
    output = await tool.run(arguments, ToolContext(tool_name=tool.name))  # type: ignore[arg-type]
    assert isinstance(output, ToolResult)
    return output


def shell(root: Path, settings: ShellSettings) -> Tool:
    (command,) = [
        t for t in workspace_tools(Workspace(root), shell=settings) if t.name == "run_command"
    ]
    return command


# --- the command's environment -------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
async def test_a_command_never_sees_the_agents_secrets(
    root: Path, monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", CANARY)
    monkeypatch.setenv("SOME_SETTING", "plain-value")
    result = await run(shell(root, ShellSettings(sandbox=mode)), command="printenv")  # type: ignore[arg-type]
    assert result.data is not None
    assert result.data["exit_code"] == 0
    assert CANARY not in result.content
    assert "SOME_SETTING" not in result.content  # not on the allow-list
    assert "PATH=" in result.content


def test_the_allow_list_takes_globs_but_passes_secret_names_only_when_listed_exactly() -> None:
    environ = {
        "PATH": "/bin",
        "LC_ALL": "C",
        "MY_TOKEN": "t" * 20,
        "APP_MODE": "dev",
        "APP_API_KEY": "k" * 20,
    }
    wide = ShellSettings(inherit_env=("PATH", "LC_*", "APP_*", "*TOKEN"))
    assert command_environment(wide, environ) == {"PATH": "/bin", "LC_ALL": "C", "APP_MODE": "dev"}
    exact = ShellSettings(inherit_env=("MY_TOKEN",), env={"EXTRA": "1", "PATH": "/opt/bin"})
    assert command_environment(exact, environ) == {
        "MY_TOKEN": "t" * 20,
        "EXTRA": "1",
        "PATH": "/opt/bin",
    }


# --- redaction at the tool-result boundary -------------------------------------------------


def test_secret_looking_names_are_recognised() -> None:
    for name in ("OPENAI_API_KEY", "GITHUB_TOKEN", "AWS_SECRET_ACCESS_KEY", "DB_PASSWORD", "KEY"):
        assert looks_secret(name), name
    for name in ("PATH", "HOME", "KEYBOARD", "LANG", "TOKENIZERS_PARALLELISM"):
        assert not looks_secret(name), name


@given(
    secrets=st.lists(
        st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-", min_size=8, max_size=24),
        min_size=1,
        max_size=4,
    ),
    pieces=st.lists(st.text(max_size=20), max_size=8),
)
def test_redaction_leaves_no_known_secret_in_any_text(
    secrets: list[str], pieces: list[str]
) -> None:
    redactor = SecretRedactor({f"S{i}": s for i, s in enumerate(secrets)})
    text = "".join(p + secrets[i % len(secrets)] for i, p in enumerate(pieces)) + "".join(secrets)
    redacted = redactor.redact(text)
    for secret in secrets:
        assert secret not in redacted
    assert "[REDACTED:S" in redacted


def test_short_values_are_not_secrets_and_the_repr_shows_no_value() -> None:
    redactor = SecretRedactor.from_environment(
        {"API_KEY": "abc", "MY_TOKEN": "x" * 12, "PATH": "y" * 12}
    )
    assert redactor.names == ["MY_TOKEN"]
    assert "x" * 12 not in repr(redactor)
    assert (
        redactor.redact("abc " + "y" * 12 + " " + "x" * 12)
        == "abc " + "y" * 12 + " [REDACTED:MY_TOKEN]"
    )


async def test_the_executor_redacts_secrets_from_every_result(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CUSTOM_NAME", "value-marked-secret-123")
    secrets = SecretRedactor.from_environment(names=["CUSTOM_NAME"])
    secrets.add("inline", CANARY)

    def leak(where: str) -> ToolResult:
        """Return secrets everywhere a result can hold them."""
        if where == "raise":
            raise RuntimeError(f"failed with {CANARY}")
        return ToolResult(
            content=f"key {CANARY} and value-marked-secret-123",
            data={"nested": [CANARY, {CANARY: 1}]},
        )

    executor = ToolExecutor([leak], secrets=secrets)

    ok, failed = await executor.execute(
        [
            ToolCall(id="1", name="leak", arguments='{"where": "result"}'),
            ToolCall(id="2", name="leak", arguments='{"where": "raise"}'),
        ]
    )
    assert ok.result.content == "key [REDACTED:inline] and [REDACTED:CUSTOM_NAME]"
    assert ok.full_result.data == {"nested": ["[REDACTED:inline]", {"[REDACTED:inline]": 1}]}
    assert (
        failed.result.content
        == "tool 'leak' failed with RuntimeError: failed with [REDACTED:inline]"
    )


async def test_a_secret_canary_reaches_no_event_store_export_or_prompt(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The key the agent itself uses, plus a copy left in a workspace file.
    monkeypatch.setenv("OPENAI_API_KEY", CANARY)
    (root / ".env").write_text(f"OPENAI_API_KEY={CANARY}\n")
    tools = ToolExecutor(
        workspace_tools(Workspace(root), shell=ShellSettings(sandbox="none")),
        policy=PolicyEngine(auto_approve=True),
    )
    llm = ScriptedLLM(
        [
            reply(
                tool_calls=[call("run_command", command="printenv; cat .env; echo $OPENAI_API_KEY")]
            ),
            reply(tool_calls=[call("read_file", path=".env")]),
            reply(tool_calls=[call("search_text", pattern="sk-")]),
            "done",
        ]
    )
    store = InMemorySessionStore()
    agent = AgentExecutor(llm, config=AgentConfig(), tools=tools, store=store)
    events: list[str] = []

    def record(event: AgentEvent) -> None:
        events.append(event_to_json(event))

    agent.events.on(None, record)
    outcome = await agent.run("look around")
    assert outcome.final_text == "done"
    assert agent.session_id is not None
    exported = io.StringIO()
    await store.export(agent.session_id, exported)
    prompts = [m.content or "" for request in llm.requests for m in request.messages]
    assert any("[REDACTED:OPENAI_API_KEY]" in text for text in prompts)  # the file's copy
    places = {
        "events": "\n".join(events),
        "history": agent.history.to_json(),
        "environment": agent.environment.to_json(),
        "export": exported.getvalue(),
        "prompts": "\n".join(prompts),
    }
    for where, text in places.items():
        assert CANARY not in text, where


# --- confinement ---------------------------------------------------------------------------


def test_without_bubblewrap_auto_runs_unconfined_and_says_so(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(shutil, "which", lambda name: None)
    assert shell_boundary(ShellSettings()).startswith("Commands are NOT confined")
    with pytest.raises(
        UserError, match=r"run_command cannot be confined: bubblewrap \(bwrap\) is not installed"
    ):
        workspace_tools(Workspace(root), shell=ShellSettings(sandbox="bwrap"))


@pytest.fixture
def var_tmp() -> Iterator[Path]:
    # A confined command gets a private /tmp, so what it must see (or fail to change) outside
    # the workspace lives elsewhere.
    base = Path(tempfile.mkdtemp(prefix="agent-flow-test-", dir="/var/tmp"))
    yield base
    shutil.rmtree(base, ignore_errors=True)


@needs_bwrap
async def test_a_confined_command_can_write_only_the_workspace_and_a_private_tmp(
    var_tmp: Path,
) -> None:
    root, outside = var_tmp / "ws", var_tmp / "outside"
    root.mkdir()
    outside.mkdir()
    (outside / "keep.txt").write_text("keep")
    tool = shell(root, ShellSettings(sandbox="bwrap"))
    marker = f"scratch-{os.getpid()}-{id(tool)}"
    result = await run(
        tool,
        command=(
            f"echo in > inside.txt; echo tmp > /tmp/{marker}; cat /tmp/{marker}; "
            f"rm -rf ../outside 2>&1 | head -1; find .. -name keep.txt -delete 2>&1 | head -1"
        ),
    )
    assert result.data is not None
    assert result.data["confinement"] == "bwrap"
    assert (root / "inside.txt").read_text() == "in\n"
    assert (outside / "keep.txt").read_text() == "keep"
    assert result.content.count("Read-only file system") == 2
    assert "tmp\n" in result.content  # its /tmp works, and is its own
    assert not (Path("/tmp") / marker).exists()


@needs_bwrap
async def test_a_confined_command_sees_no_credentials_and_no_agent_process(
    var_tmp: Path,
) -> None:
    root, home = var_tmp / "ws", var_tmp / "home"
    root.mkdir()
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_rsa").write_text(CANARY)
    (home / ".netrc").write_text(CANARY)
    (home / "notes.txt").write_text("ordinary\n")
    tool = shell(root, ShellSettings(sandbox="bwrap", env={"HOME": str(home)}))
    result = await run(
        tool,
        command=f"cat ~/.ssh/id_rsa ~/.netrc ~/notes.txt; kill -0 {os.getpid()} || echo no-agent",
    )
    assert CANARY not in result.content
    assert "ordinary" in result.content
    assert "no-agent" in result.content


def _processes_with(marker: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            if marker.encode() in cmdline:
                found.append(int(entry))
    return found


@needs_bwrap
async def test_a_confined_command_and_its_children_die_with_it(root: Path) -> None:
    from tests.test_tools_workspace import _dies

    tool = shell(root, ShellSettings(sandbox="bwrap"))
    result = await run(tool, command="sleep 61.5 & echo started; wait", timeout_seconds=0.5)
    assert result.error_kind == "timeout"
    assert all(_dies(pid) for pid in _processes_with("61.5"))
    done = await run(tool, command="sleep 62.5 & echo done")
    assert done.content == "exit code 0\ndone\n"
    assert all(_dies(pid) for pid in _processes_with("62.5"))


async def test_the_config_names_the_shell_settings_and_the_secrets(
    tmp_path: Path, root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from agent_flow.agent import tool_executor_from_config
    from agent_flow.config import load_config

    monkeypatch.setenv("MY_LLM_CRED", "llm-key-value-123")
    monkeypatch.setenv("PLAIN_NAME", "marked-secret-456")
    file = tmp_path / "agent.toml"
    file.write_text(
        f"""
[agent]
workspace = "{root}"
secret_env = ["PLAIN_NAME"]
[agent.llm]
model = "m"
api_key_env = "MY_LLM_CRED"
[agent.shell]
sandbox = "none"
inherit_env = ["PATH"]
env = {{ GREETING = "hi" }}
"""
    )
    config = load_config(file)
    assert config.shell == ShellSettings(
        sandbox="none", inherit_env=("PATH",), env={"GREETING": "hi"}
    )
    executor = tool_executor_from_config(config)
    assert {"MY_LLM_CRED", "PLAIN_NAME"} <= set(executor.secrets.names)
    shown = await run(executor.tools["run_command"].tool, command="printenv")
    assert shown.data is not None
    names = {line.split("=", 1)[0] for line in str(shown.data["output"]).splitlines()}
    assert "GREETING=hi" in str(shown.data["output"])
    assert {"GREETING", "PATH"} <= names
    assert not names & {"HOME", "MY_LLM_CRED", "PLAIN_NAME"}


@needs_bwrap
async def test_a_confined_command_reads_what_the_hosts_tmp_holds_but_cannot_change_it(
    var_tmp: Path,
) -> None:
    # A project (or the virtualenv running it) often lives under /tmp: a private /tmp must
    # not hide it.
    root = var_tmp / "ws"
    root.mkdir()
    host = Path(tempfile.mkdtemp(prefix="agent-flow-host-", dir="/tmp"))
    try:
        (host / "tool.sh").write_text("echo from the host tmp\n")
        tool = shell(root, ShellSettings(sandbox="bwrap"))
        result = await run(
            tool, command=f"sh {host}/tool.sh; echo x > {host}/tool.sh 2>&1 | head -1"
        )
        assert "from the host tmp" in result.content
        assert "Read-only file system" in result.content
        assert (host / "tool.sh").read_text() == "echo from the host tmp\n"
    finally:
        shutil.rmtree(host, ignore_errors=True)
