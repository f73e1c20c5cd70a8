"""How `run` shows a run (reading mode, ``--trace``, ``-q``), what it reads (stdin), and whose
agent it runs (``--agent MODULE:ATTR``)."""

from __future__ import annotations

import io
import json
import re
import textwrap
from pathlib import Path

import pytest

from agent_flow.cli._reading import ReadingRenderer
from agent_flow.cli.render import EventRenderer, make_console
from agent_flow.events import RunFinished, RunStarted, TextDelta, ToolCallStarted
from agent_flow.sessions import SQLiteSessionStore
from tests.openai_server import (
    OpenAIServer,
    sse_reply,
    text_chunks,
    tool_call_chunks,
)

# The autouse fixture that clears OPENAI_* / AGENT_FLOW_* and points AGENT_FLOW_HOME at tmp.
from tests.test_cli import clean_environment as clean_environment
from tests.test_cli import invoke_async, model_flags

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def script_a_file_read(server: OpenAIServer, answer: str = "The launch code is **1234**.") -> None:
    server.script(
        sse_reply(tool_call_chunks([("c1", "read_file", '{"path": "notes.txt"}')], text="Look.")),
        sse_reply(text_chunks(answer)),
    )


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    root.mkdir()
    (root / "notes.txt").write_text("the launch code is 1234\n")
    return root


async def test_the_reading_mode_shows_the_answer_and_one_status_line(
    openai_server: OpenAIServer, workspace: Path, tmp_path: Path
) -> None:
    script_a_file_read(openai_server)
    result = await invoke_async(
        [
            "run",
            "what is the code?",
            *model_flags(openai_server),
            "--workspace",
            str(workspace),
            "--db",
            str(tmp_path / "d"),
        ]
    )
    assert result.code == 0, result.err
    answer, status, saved = result.out.splitlines()
    assert answer == "The launch code is **1234**."  # not a terminal: the Markdown as written
    assert re.fullmatch(r"answered · 2 steps · 1 tool call · \d[\d,]* tokens · \d+\.\d s", status)
    assert saved.startswith("session ") and " saved in " in saved
    assert result.err == ""


async def test_quiet_prints_the_answer_alone(
    openai_server: OpenAIServer, workspace: Path, tmp_path: Path
) -> None:
    script_a_file_read(openai_server)
    result = await invoke_async(
        [
            "run",
            "what is the code?",
            "-q",
            *model_flags(openai_server),
            "--workspace",
            str(workspace),
            "--db",
            str(tmp_path / "d"),
        ]
    )
    assert result.code == 0, result.err
    assert result.out == "The launch code is **1234**.\n"
    assert result.err == ""


def test_trace_quiet_and_json_exclude_each_other(capsys: pytest.CaptureFixture[str]) -> None:
    from agent_flow.cli import main

    assert main(["run", "t", "--trace", "-q"]) == 2
    assert "argument -q/--quiet: not allowed with argument --trace" in capsys.readouterr().err


async def test_piped_stdin_follows_the_task_or_is_the_task(
    openai_server: OpenAIServer, tmp_path: Path
) -> None:
    openai_server.script(sse_reply(text_chunks("Two lines.")), sse_reply(text_chunks("Alone.")))
    notes = "line one\nline two\n"
    db = str(tmp_path / "d")
    first = await invoke_async(
        ["run", "summarize", "-q", *model_flags(openai_server), "--db", db],
        stdin=io.StringIO(notes),
    )
    second = await invoke_async(
        ["run", "-q", *model_flags(openai_server), "--db", db], stdin=io.StringIO(notes)
    )
    assert (first.code, first.out, second.code, second.out) == (0, "Two lines.\n", 0, "Alone.\n")
    users = [
        [m["content"] for m in body["messages"] if m["role"] == "user"]
        for body in openai_server.bodies
    ]
    assert users == [["summarize\n\nline one\nline two"], ["line one\nline two"]]


def test_an_answer_is_rendered_as_markdown_on_a_terminal() -> None:
    out = io.StringIO()
    renderer = ReadingRenderer(make_console(out, force_terminal=True, width=60))
    renderer(RunStarted(run_id="r", seq=0, task="t", agent="a", model="m"))
    renderer(
        RunFinished(
            run_id="r",
            seq=1,
            stop_reason="answered",
            final_text="# Findings\n\n- **first** point\n- `code` here",
            iterations=1,
            prompt_tokens=10,
            completion_tokens=5,
            duration_ms=1200,
        )
    )
    text = ANSI.sub("", out.getvalue())
    assert "Findings" in text and "• first point" in text and "code here" in text
    assert "**" not in text and "# Findings" not in text and "`" not in text
    assert "answered · 1 step · 0 tool calls · 15 tokens · 1.2 s" in text


def test_streamed_text_wraps_at_word_boundaries_and_previews_fit_the_width() -> None:
    out = io.StringIO()
    renderer = EventRenderer(
        make_console(out, force_terminal=True, width=40), spinner=False, show_thinking=False
    )
    text = "The quick brown fox jumps over the lazy dog and keeps running far away.\n\nDone."
    for seq, start in enumerate(range(0, len(text), 3)):
        renderer(TextDelta(run_id="r", seq=seq, text=text[start : start + 3]))
    arguments = json.dumps({"path": "x" * 300})
    renderer(
        ToolCallStarted(run_id="r", seq=99, call_id="c", name="read_file", arguments=arguments)
    )
    lines = ANSI.sub("", out.getvalue()).splitlines()
    assert lines[:4] == [
        "The quick brown fox jumps over the lazy",
        "dog and keeps running far away.",
        "",
        "Done.",
    ]
    assert lines[4].startswith("  ⚙ running read_file {") and lines[4].endswith("…")
    assert len(lines[4]) <= 40


# -- --agent MODULE:ATTR -------------------------------------------------------------------

AGENTS = textwrap.dedent(
    '''
    """The user's own agents: a Python tool with a handler that writes the environment."""

    import os

    from agent_flow import AgentConfig, AgentExecutor, ContextConfig, OpenAIClient
    from agent_flow.tools import HandlerRegistry, ToolExecutor, ToolResult, tool


    @tool
    def stock_level(item: str) -> ToolResult:
        """How many of an item are in stock.

        Args:
            item: The item.
        """
        return ToolResult(content=f"{item}: 7 left", data={"item": item, "left": 7})


    def remember(env, call, result):
        env.set(f"/extensions/stock/{result.data['item']}", result.data["left"])


    def build():
        handlers = HandlerRegistry.with_defaults()
        handlers.register("stock_level", remember)
        llm = OpenAIClient("test-model", base_url=os.environ["SHOP_URL"], api_key="k")
        return AgentExecutor(
            llm,
            config=AgentConfig(name="shopkeeper", context=ContextConfig(max_tokens=8000)),
            tools=ToolExecutor([stock_level], handlers=handlers),
        )


    async def build_later():
        return build()


    def build_for(llm=None):
        """The shopkeeper on the model the flags give, else on its own."""
        own = build()
        return AgentExecutor(llm or own.llm, config=own.config, tools=own.tools)


    def build_needs(llm):
        return AgentExecutor(llm)


    CONFIG = AgentConfig(name="terse", system_prompt="Answer in one word.\\n{environment}")
    NOT_AN_AGENT = 42
    '''
)


@pytest.fixture
def agents(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, openai_server: OpenAIServer) -> Path:
    path = tmp_path / "shop_agents.py"
    path.write_text(AGENTS)
    monkeypatch.setenv("SHOP_URL", openai_server.base_url)
    return path


@pytest.mark.parametrize("attribute", ["build", "build_later"])
async def test_an_agent_from_python_runs_its_own_tools_and_handlers(
    openai_server: OpenAIServer, agents: Path, tmp_path: Path, attribute: str
) -> None:
    openai_server.script(
        sse_reply(tool_call_chunks([("s1", "stock_level", '{"item": "lamp"}')])),
        sse_reply(text_chunks("Seven lamps.")),
    )
    db = tmp_path / "d"
    result = await invoke_async(
        ["run", "how many lamps?", "--agent", f"{agents}:{attribute}", "--db", str(db)]
    )
    assert result.code == 0, result.err
    assert result.out.startswith("Seven lamps.\n")
    assert openai_server.bodies[1]["messages"][-1]["content"] == "lamp: 7 left"
    async with SQLiteSessionStore(db) as store:
        (info,) = await store.list()
        state = await store.load(info.id)
    assert info.agent == "shopkeeper"
    assert state.environment is not None and state.environment.get("/extensions/stock/lamp") == 7


async def test_an_agent_module_on_the_path_and_a_config_take_the_flags(
    openai_server: OpenAIServer,
    agents: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)  # `shop_agents` is importable from here, as with python -m
    openai_server.script(sse_reply(text_chunks("Yes.")))
    result = await invoke_async(
        ["run", "ok?", "--agent", "shop_agents:CONFIG", *model_flags(openai_server), "-q"]
    )
    assert result.code == 0, result.err
    assert result.out == "Yes.\n"
    system = openai_server.bodies[0]["messages"][0]["content"]
    assert system.startswith("Answer in one word.")


async def test_tools_lists_the_python_tools_of_an_agent(agents: Path) -> None:
    result = await invoke_async(["tools", "--agent", f"{agents}:build"])
    assert result.code == 0, result.err
    row = next(line for line in result.out.splitlines() if line.startswith("stock_level"))
    assert row.split()[1:3] == ["python", "low"]


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("shop_agents", "must be MODULE:ATTRIBUTE"),
        ("no_such_module_xyz:agent", "there is no module 'no_such_module_xyz' here"),
        ("{agents}:missing", "has no attribute 'missing'"),
        ("{agents}:NOT_AN_AGENT", "gave int; expected an AgentExecutor, an AgentConfig"),
        ("{tmp}/nope.py:agent", "nope.py is not a file"),
    ],
)
async def test_a_bad_agent_spec_is_a_usage_error_naming_it(
    agents: Path, tmp_path: Path, spec: str, message: str
) -> None:
    spec = spec.format(agents=agents, tmp=tmp_path)
    result = await invoke_async(["run", "t", "--agent", spec, "--db", str(tmp_path / "d")])
    assert result.code == 2
    assert result.err.count("\n") == 1
    assert f"--agent {spec!r}" in result.err and message in result.err


async def test_an_agent_executor_refuses_flags_it_cannot_take(agents: Path, tmp_path: Path) -> None:
    result = await invoke_async(
        ["run", "t", "--agent", f"{agents}:build", "--model", "other", "--db", str(tmp_path / "d")]
    )
    assert result.code == 2 and result.err.count("\n") == 1
    assert "is an AgentExecutor with its own model, which --model cannot change" in result.err
    assert "a function with an llm parameter (def build_agent(llm=None)" in result.err
    budget = await invoke_async(
        [
            "run",
            "t",
            "--agent",
            f"{agents}:build_for",
            "--budget",
            "9000",
            "--db",
            str(tmp_path / "e"),
        ]
    )
    assert budget.code == 2
    assert "is an AgentExecutor with its own config, which --budget cannot change" in budget.err


async def test_an_agent_function_taking_llm_runs_on_the_model_of_the_flags(
    agents: Path, tmp_path: Path
) -> None:
    from tests.openai_server import OpenAIServer

    # Its own model (SHOP_URL) is another server: the flags' server must get every request.
    async with OpenAIServer() as flags_server:
        flags_server.script(
            sse_reply(tool_call_chunks([("s1", "stock_level", '{"item": "lamp"}')])),
            sse_reply(text_chunks("Seven lamps.")),
        )
        db = tmp_path / "d"
        result = await invoke_async(
            ["run", "how many lamps?", "--agent", f"{agents}:build_for", "--model", "flag-model",
             "--base-url", flags_server.base_url, "--db", str(db), "-q"]
        )  # fmt: skip
    assert (result.code, result.out, result.err) == (0, "Seven lamps.\n", "")
    assert [body["model"] for body in flags_server.bodies] == ["flag-model", "flag-model"]
    assert flags_server.bodies[1]["messages"][-1]["content"] == "lamp: 7 left"
    async with SQLiteSessionStore(db) as store:
        (info,) = await store.list()
        state = await store.load(info.id)
    # Its own tools and handlers ran: the handler wrote the environment.
    assert state.environment is not None and state.environment.get("/extensions/stock/lamp") == 7


async def test_an_agent_function_that_needs_llm_asks_for_the_model_flags(
    agents: Path, tmp_path: Path
) -> None:
    db = str(tmp_path / "d")
    result = await invoke_async(["run", "t", "--agent", f"{agents}:build_needs", "--db", db])
    assert result.code == 2 and result.err.count("\n") == 1
    assert "build_needs() needs its llm; pass --model (and --base-url)" in result.err


async def test_the_readme_custom_tool_agent_takes_model_and_base_url(
    openai_server: OpenAIServer, tmp_path: Path
) -> None:
    from tests.test_cli import REPO

    openai_server.script(
        sse_reply(tool_call_chunks([("w1", "get_weather", '{"location": "Tokyo"}')])),
        sse_reply(text_chunks("Rain in Tokyo.")),
    )
    spec = f"{REPO / 'examples' / 'custom_tool.py'}:build_agent"
    result = await invoke_async(
        ["run", "weather in Tokyo?", "-q", "--agent", spec, *model_flags(openai_server),
         "--db", str(tmp_path / "d")]
    )  # fmt: skip
    assert (result.code, result.out, result.err) == (0, "Rain in Tokyo.\n", "")
    assert [body["model"] for body in openai_server.bodies] == ["test-model"] * 2
    assert openai_server.bodies[1]["messages"][-1]["content"] == "Tokyo: 64°F, light rain"


DELEGATING_AGENT = """
from agent_flow import AgentExecutor, Delegate
from agent_flow.testing import ScriptedLLM


def build_agent(llm=None):
    agent = AgentExecutor(llm)
    Delegate("investigate", "Investigate a question.", llm=ScriptedLLM(["CHILD-ANSWER"])).add_to(
        agent
    )
    return agent
"""


@pytest.mark.parametrize("mode", ["-q", "--json", "read"])
async def test_a_delegated_childs_events_are_not_the_users_answer(
    openai_server: OpenAIServer, tmp_path: Path, mode: str
) -> None:
    module = tmp_path / "delegating.py"
    module.write_text(DELEGATING_AGENT)
    openai_server.script(
        sse_reply(tool_call_chunks([("call_1", "investigate", json.dumps({"task": "look"}))])),
        sse_reply(text_chunks("PARENT-ANSWER")),
    )
    flags = [] if mode == "read" else [mode]
    result = await invoke_async(
        ["run", "go", "--agent", f"{module}:build_agent", *model_flags(openai_server), *flags]
    )
    assert result.code == 0, result.err
    if mode == "--json":
        events = [json.loads(line) for line in result.out.splitlines()]
        child = [e for e in events if e.get("path")]
        assert child and {e["kind"] for e in child} >= {"run_started", "run_finished"}
        top = [e for e in events if not e.get("path") and e["kind"] == "run_finished"]
        assert len(top) == 1
    else:
        assert "PARENT-ANSWER" in result.out
        assert "CHILD-ANSWER" not in result.out
        if mode == "-q":
            assert result.out == "PARENT-ANSWER\n"


# -- the trace view draws a delegated child as a tree under the parent's tool call ----------

PARALLEL_AGENT = """
from agent_flow import AgentExecutor, Delegate
from agent_flow.testing import ScriptedLLM


def answer(request):
    task = request.messages[-1].content
    return f"{task.upper()} one.\\n{task.upper()} two."


def build_agent(llm=None):
    agent = AgentExecutor(llm)
    # A pause before each streamed word lets the two children take turns.
    llm = ScriptedLLM([answer] * 2, delay=0.001)
    Delegate("investigate", "Investigate a question.", llm=llm).add_to(agent)
    return agent
"""

CHILD_START = re.compile(r"^    ↳ delegated run ([0-9a-f-]{8}) started · task: (\S+)$")
CHILD_END = re.compile(
    r"^    ■ delegated run ([0-9a-f-]{8}) finished: answered after 1 iteration\(s\) · "
    r"[\d,]+ prompt \+ [\d,]+ completion tokens · (\$[\d.]+|cost unknown) · [\d.]+ s$"
)


def child_lines(trace: str, run: str) -> list[str]:
    """What the child `run` said on its own lines (its lead taken off)."""
    lead = f"    {run} │ "
    return [line.removeprefix(lead) for line in trace.splitlines() if line.startswith(lead)]


async def test_the_trace_draws_a_delegated_child_under_the_parents_tool_call(
    openai_server: OpenAIServer, tmp_path: Path
) -> None:
    module = tmp_path / "delegating.py"
    module.write_text(DELEGATING_AGENT)
    openai_server.script(
        sse_reply(tool_call_chunks([("call_1", "investigate", json.dumps({"task": "look"}))])),
        sse_reply(text_chunks("PARENT-ANSWER")),
    )
    result = await invoke_async(
        ["run", "go", "--trace", "--agent", f"{module}:build_agent", *model_flags(openai_server)]
    )
    assert result.code == 0, result.err
    lines = result.out.splitlines()
    starts = [n for n, line in enumerate(lines) if CHILD_START.match(line)]
    ends = [n for n, line in enumerate(lines) if CHILD_END.match(line)]
    assert len(starts) == len(ends) == 1, result.out
    start, end = starts[0], ends[0]
    run, task = CHILD_START.match(lines[start]).groups()  # type: ignore[union-attr]
    assert task == "look" and CHILD_END.match(lines[end]).group(1) == run  # type: ignore[union-attr]
    # The parent runs the tool, the child runs inside it, then the parent gets its result.
    running = lines.index("  ⚙ running investigate")  # its arguments streamed above
    done = next(n for n, line in enumerate(lines) if line.startswith("  ✓ investigate ("))
    assert running < start < end < done
    assert lines[done].endswith("): CHILD-ANSWER")
    # Between its start and end, every line is the child's, led by its id; its answer
    # streamed on a line of its own.
    inside = lines[start + 1 : end]
    assert inside and all(line.startswith(f"    {run} │ ") for line in inside)
    assert "CHILD-ANSWER" in child_lines(result.out, run)
    assert any(line.strip() == "── iteration 1 ──" for line in child_lines(result.out, run))
    # Nothing of the child anywhere else: the parent's lines are the parent's.
    outside = lines[:start] + lines[end + 1 :]
    assert not [line for line in outside if run in line or "│" in line or "delegated" in line]
    assert [line for line in outside if "CHILD-ANSWER" in line] == [lines[done]]
    assert "PARENT-ANSWER" in outside and outside.count("PARENT-ANSWER") == 1
    finished = [line for line in lines if line.startswith("■ run finished: ")]
    assert len(finished) == 1 and finished[0].startswith("■ run finished: answered after 2 ")
    assert sum(line.startswith("▶ run ") for line in lines) == 1


async def test_parallel_children_each_lead_their_lines_with_their_run_id(
    openai_server: OpenAIServer, tmp_path: Path
) -> None:
    module = tmp_path / "parallel.py"
    module.write_text(PARALLEL_AGENT)
    calls = [
        ("call_1", "investigate", json.dumps({"task": "alpha"})),
        ("call_2", "investigate", json.dumps({"task": "beta"})),
    ]
    openai_server.script(sse_reply(tool_call_chunks(calls)), sse_reply(text_chunks("Both done.")))
    result = await invoke_async(
        ["run", "go", "--trace", "--agent", f"{module}:build_agent", *model_flags(openai_server)]
    )
    assert result.code == 0, result.err
    lines = result.out.splitlines()
    started = {
        match.group(2): (n, match.group(1))
        for n, line in enumerate(lines)
        if (match := CHILD_START.match(line))
    }
    assert set(started) == {"alpha", "beta"}, result.out
    runs = {task: run for task, (_, run) in started.items()}
    assert len(set(runs.values())) == 2
    ended = {m.group(1): n for n, line in enumerate(lines) if (m := CHILD_END.match(line))}
    for task, (start, run) in started.items():
        assert start < ended[run]
        said = child_lines(result.out, run)
        # Each child's answer, whole, on its own lines; none of the other child's in them.
        text = [line for line in said if line.startswith(task.upper())]
        assert text == [f"{task.upper()} one.", f"{task.upper()} two."]
        other = "BETA" if task == "alpha" else "ALPHA"
        assert not [line for line in said if other in line]
    # Every line of a child is indented; the parent's answer is its own line.
    for line in lines:
        if any(run in line for run in runs.values()):
            assert line.startswith("    "), line
    assert "Both done." in lines
