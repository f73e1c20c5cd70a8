"""The shell's boundary: no secrets in, none out, and confinement where bubblewrap works.

The canary tests plant a fake API key in the agent's environment and in a file, let an agent
run commands that would print it, and check that it reaches nothing: not the tool result, the
events, the environment, the session store, the export, nor the next prompt.
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
import sysconfig
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
from agent_flow.tools._sandbox import (
    bwrap_argv,
    command_environment,
    resolve_confinement,
    runtime_paths,
    tmp_binds,
)

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


# --- the private /tmp -----------------------------------------------------------------------


@pytest.fixture
def host_tmp() -> Iterator[Path]:
    # Explicitly in the host's /tmp (pytest's tmp_path need not be): what a confined command
    # must not see, or a workspace or virtualenv that must still work from there.
    base = Path(tempfile.mkdtemp(prefix="agent-flow-host-", dir="/tmp"))
    yield base
    shutil.rmtree(base, ignore_errors=True)


def _tops(paths: list[str]) -> set[str]:
    """The entries of /tmp that binding `paths` (all under /tmp) creates."""
    return {Path(path).relative_to("/tmp").parts[0] for path in paths}


@needs_bwrap
async def test_a_confined_command_cannot_see_what_the_hosts_tmp_holds(
    var_tmp: Path, host_tmp: Path
) -> None:
    root = var_tmp / "ws"
    root.mkdir()
    (host_tmp / "private.txt").write_text(CANARY)
    result = await run(
        shell(root, ShellSettings(sandbox="bwrap")),
        command=f"cat {host_tmp}/private.txt; ls -A /tmp",
    )
    assert result.data is not None
    assert CANARY not in result.content
    assert "No such file or directory" in result.content
    # /tmp holds nothing but the way to the agent's interpreter, should it live there.
    listed = set(result.content.splitlines()[2:])
    assert listed == _tops(tmp_binds(runtime_paths()))
    assert host_tmp.name not in listed


@needs_bwrap
async def test_what_a_confined_command_writes_in_tmp_is_gone_when_it_ends(var_tmp: Path) -> None:
    root = var_tmp / "ws"
    root.mkdir()
    tool = shell(root, ShellSettings(sandbox="bwrap"))
    marker = f"scratch-{os.getpid()}-{id(tool)}"
    wrote = await run(tool, command=f"echo mine > /tmp/{marker} && cat /tmp/{marker}")
    assert wrote.content == "exit code 0\nmine\n"
    assert not (Path("/tmp") / marker).exists()
    again = await run(tool, command=f"cat /tmp/{marker}")
    assert again.data is not None
    assert again.data["exit_code"] != 0
    assert "mine" not in again.content


@needs_bwrap
async def test_a_workspace_under_tmp_stays_writable_and_its_neighbours_stay_hidden(
    host_tmp: Path,
) -> None:
    root = host_tmp / "ws"
    (root / "src").mkdir(parents=True)
    (root / "src" / "given.txt").write_text("given\n")
    (host_tmp / "neighbour.txt").write_text(CANARY)
    tool = shell(root, ShellSettings(sandbox="bwrap"))
    result = await run(
        tool,
        command=(
            "cat given.txt && echo made > made.txt && mkdir out && rm given.txt "
            "&& ls -A ../.. && cat ../../neighbour.txt"
        ),
        cwd="src",
    )
    assert result.data is not None
    assert result.data["confinement"] == "bwrap"
    assert (root / "src" / "made.txt").read_text() == "made\n"
    assert (root / "src" / "out").is_dir()
    assert not (root / "src" / "given.txt").exists()
    # The workspace's parent holds only the way to it.
    assert result.content.startswith("exit code 1\ngiven\nws\n")
    assert CANARY not in result.content


@needs_bwrap
async def test_the_agents_interpreter_runs_inside_the_sandbox(var_tmp: Path) -> None:
    root = var_tmp / "ws"
    root.mkdir()
    result = await run(
        shell(root, ShellSettings(sandbox="bwrap")),
        command=f"{sys.executable} -c 'import sys; print(sys.prefix, sys.base_prefix)'",
    )
    assert result.content == f"exit code 0\n{sys.prefix} {sys.base_prefix}\n"


_IN_THE_VENV = """
import asyncio, site, sys
site.addsitedir(sys.argv[1])  # agent_flow and its dependencies, from the test's environment
from agent_flow.tools import ShellSettings, ToolContext, Workspace, workspace_tools

(tool,) = [t for t in workspace_tools(Workspace(sys.argv[2]), shell=ShellSettings(sandbox="bwrap"))
           if t.name == "run_command"]
command = (
    f"{sys.executable} -c 'import sys; print(sys.prefix, sys.base_prefix)'; "
    f"test -e {sys.argv[3]} || echo neighbour-hidden"
)
result = asyncio.run(tool.run({"command": command}, ToolContext(tool_name=tool.name)))
print(sys.prefix)
print(result.content)
"""


@needs_bwrap
def test_an_agent_running_from_a_virtualenv_under_tmp_runs_it_confined(
    var_tmp: Path, host_tmp: Path
) -> None:
    # The virtualenv is reached through a symlink, as a moved or shared one often is: the
    # sandbox needs both the path the interpreter names and the one it resolves to.
    real, link = host_tmp / "real-venv", host_tmp / "venv"
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(real)], check=True, timeout=60
    )
    link.symlink_to(real, target_is_directory=True)
    (host_tmp / "neighbour.txt").write_text(CANARY)
    root = var_tmp / "ws"
    root.mkdir()
    done = subprocess.run(
        [
            str(link / "bin" / "python"),
            "-c",
            _IN_THE_VENV,
            sysconfig.get_paths()["purelib"],
            str(root),
            str(host_tmp / "neighbour.txt"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(var_tmp)},
    )
    assert done.returncode == 0, done.stderr
    prefix, content = done.stdout.split("\n", 1)
    assert Path(prefix).parent == host_tmp  # the agent did run from the virtualenv
    assert content == f"exit code 0\n{prefix} {sys.base_prefix}\nneighbour-hidden\n\n"


# --- which paths come back into the private /tmp (no bubblewrap needed) -----------------------


def test_the_command_line_does_not_grow_with_what_the_hosts_tmp_holds(
    root: Path, host_tmp: Path
) -> None:
    def argv() -> list[str]:
        return bwrap_argv(
            "bwrap", "true", root=root, cwd=root, settings=ShellSettings(), home=None, runtime=[]
        )

    before = argv()
    for i in range(50):
        (host_tmp / f"entry-{i}").mkdir()
    assert argv() == before
    assert not any(str(host_tmp) in arg for arg in before)


def test_credentials_under_tmp_are_hidden_only_where_the_sandbox_shows_them(
    var_tmp: Path, host_tmp: Path
) -> None:
    home = host_tmp / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".netrc").write_text(CANARY)
    settings = ShellSettings(sandbox="bwrap")
    elsewhere = bwrap_argv(
        "bwrap", "true", root=var_tmp, cwd=var_tmp, settings=settings, home=str(home), runtime=[]
    )
    # The private /tmp does not hold the home directory: nothing to hide, no mount to add.
    assert not any(str(home) in arg for arg in elsewhere)
    inside = bwrap_argv(
        "bwrap", "true", root=home, cwd=home, settings=settings, home=str(home), runtime=[]
    )
    assert _has(inside, "--tmpfs", str(home / ".ssh"))
    assert _has(inside, "--ro-bind", "/dev/null", str(home / ".netrc"))


def _has(argv: list[str], *options: str) -> bool:
    return any(argv[i : i + len(options)] == list(options) for i in range(len(argv)))


def test_the_interpreter_is_kept_under_tmp_by_its_own_path_and_the_one_it_resolves_to(
    host_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (host_tmp / "real" / "bin").mkdir(parents=True)
    (host_tmp / "base").mkdir()
    (host_tmp / "venv").symlink_to(host_tmp / "real")
    monkeypatch.setattr(sys, "executable", str(host_tmp / "venv" / "bin" / "python"))
    monkeypatch.setattr(sys, "prefix", str(host_tmp / "venv"))
    monkeypatch.setattr(sys, "exec_prefix", str(host_tmp / "venv"))
    monkeypatch.setattr(sys, "base_prefix", str(host_tmp / "base"))
    monkeypatch.setattr(sys, "base_exec_prefix", "/usr")
    assert tmp_binds(runtime_paths()) == [str(host_tmp / name) for name in ("base", "real", "venv")]


def test_tmp_binds_keep_paths_strictly_inside_tmp_and_drop_nested_ones() -> None:
    assert tmp_binds(
        ["/tmp", "/tmp/", "/tmpx/a", "relative/tmp/a", "/usr/lib", "/tmp/a/../b/c", "/tmp/b"]
    ) == ["/tmp/b"]


_PARTS = st.sampled_from(["a", "b", "tmp", "..", ".", "x y"])


@given(
    st.lists(
        st.builds(
            lambda absolute, parts: ("/" if absolute else "") + "/".join(parts),
            st.booleans(),
            st.lists(_PARTS, min_size=0, max_size=4),
        ),
        max_size=8,
    )
)
def test_tmp_binds_cover_every_path_inside_tmp_once(paths: list[str]) -> None:
    binds = tmp_binds(paths)
    assert binds == sorted(set(binds))
    assert all(bind.startswith("/tmp/") for bind in binds)
    for bind in binds:
        assert not any(bind.startswith(other + "/") for other in binds)
    for path in paths:
        normal = os.path.normpath(path)
        if os.path.isabs(path) and normal.startswith("/tmp/"):
            assert any(normal == bind or normal.startswith(bind + "/") for bind in binds)
