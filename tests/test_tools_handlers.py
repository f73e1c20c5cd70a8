from __future__ import annotations

import asyncio
import json
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from agent_flow._types import JsonValue
from agent_flow.agent import AgentExecutor
from agent_flow.config import AgentConfig, ContextConfig
from agent_flow.environment import Environment, FileInfo
from agent_flow.messages import ToolCall
from agent_flow.testing import ScriptedLLM, call, reply
from agent_flow.tools import (
    TOOL_RESULTS_EXTENSION,
    HandlerRegistry,
    PolicyEngine,
    ToolExecutor,
    ToolResult,
    Workspace,
    directory_tree_handler,
    parse_text_tree,
    record_latest_result,
    search_results_handler,
    tool,
    workspace_tools,
)

CALL = ToolCall(id="c1", name="directory_tree")


def result(data: JsonValue, name: str = "directory_tree", content: str = "") -> ToolResult:
    return ToolResult(content=content or json.dumps(data), data=data, tool_name=name, call_id="c1")


SEED_TREE = [
    "hal/",
    "  ├── src/",
    "  │   ├── agent_flow/",
    "  │   │   └── mod.rs",
    "  │   ├── coder/",
    "  │   │   ├── executor.rs",
    "  │   │   └── session.rs",
    "  │   └── lib.rs",
    "  ├── docs/",
    "  │   └── agent-loop.md",
    "  ├── Cargo.toml",
]


def test_the_seed_text_tree_parses_into_paths_below_its_root() -> None:
    assert parse_text_tree(SEED_TREE) == [
        ("src", True),
        ("src/agent_flow", True),
        ("src/agent_flow/mod.rs", False),
        ("src/coder", True),
        ("src/coder/executor.rs", False),
        ("src/coder/session.rs", False),
        ("src/lib.rs", False),
        ("docs", True),
        ("docs/agent-loop.md", False),
        ("Cargo.toml", False),
    ]


def test_a_plain_indented_tree_without_a_root_line_parses_too() -> None:
    assert parse_text_tree(["a/", "  b.txt", "c.txt", ""]) == [
        ("a", True),
        ("a/b.txt", False),
        ("c.txt", False),
    ]


def test_the_seed_directory_tree_result_fills_the_workspace_files() -> None:
    env = Environment()
    directory_tree_handler(env, CALL, result({"tree": SEED_TREE}))
    files = env.workspace.files
    assert list(files) == [
        "src",
        "src/agent_flow",
        "src/agent_flow/mod.rs",
        "src/coder",
        "src/coder/executor.rs",
        "src/coder/session.rs",
        "src/lib.rs",
        "docs",
        "docs/agent-loop.md",
        "Cargo.toml",
    ]
    assert files["src/coder"] == FileInfo(kind="directory")
    assert files["Cargo.toml"] == FileInfo(kind="file")
    assert [c.pointer for c in env.changes()] == ["/workspace/files"]


async def test_the_directory_tree_tool_feeds_the_workspace_handler(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.py").write_text("print(1)\n")
    (tmp_path / "README.md").write_text("hi\n")
    executor = ToolExecutor(workspace_tools(Workspace(tmp_path)))
    env = Environment()
    outcome = await executor.execute_one(
        ToolCall(id="1", name="directory_tree", arguments="{}"), environment=env
    )
    assert outcome.handler_errors == ()
    assert env.workspace.files == {
        "src": FileInfo(kind="directory"),
        "README.md": FileInfo(kind="file", size=3),
        "src/a.py": FileInfo(kind="file", size=9),
    }
    assert [c.pointer for c in outcome.environment_changes] == ["/workspace/files"]


def test_a_complete_listing_removes_files_that_are_gone_but_keeps_summaries() -> None:
    env = Environment()
    env.set("/workspace/files/src~1old.py", FileInfo(kind="file", size=1))
    env.set("/workspace/files/src~1keep.py", FileInfo(kind="file", summary="the entry point"))
    env.set("/workspace/files/docs~1guide.md", FileInfo(kind="file"))
    listing = {
        "root": "src",
        "entries": [{"path": "src/keep.py", "kind": "file", "size": 10}],
        "complete": True,
    }
    directory_tree_handler(env, CALL, result(listing))
    assert env.workspace.files == {
        "src/keep.py": FileInfo(kind="file", size=10, summary="the entry point"),
        "docs/guide.md": FileInfo(kind="file"),
    }


def test_an_incomplete_listing_only_adds_and_updates() -> None:
    env = Environment()
    env.set("/workspace/files/src~1old.py", FileInfo(kind="file"))
    listing = {
        "root": ".",
        "entries": [{"path": "src/new.py", "kind": "file", "size": 2}],
        "complete": False,
    }
    directory_tree_handler(env, CALL, result(listing))
    assert set(env.workspace.files) == {"src/old.py", "src/new.py"}


def test_results_that_are_not_trees_are_left_alone() -> None:
    env = Environment()
    for data in (None, "text", [1, 2], {"other": 1}):
        directory_tree_handler(env, CALL, result(data))
    assert env.version == 0


def test_search_results_become_facts_and_sources() -> None:
    env = Environment()
    env.update_section("knowledge", discovered_facts=["Python is a language"])
    data: JsonValue = {
        "results": [
            {
                "title": "asyncio docs",
                "url": "https://docs.python.org/3/library/asyncio.html",
                "snippet": "asyncio is a library to write concurrent code.",
            },
            {
                "title": "TaskGroup",
                "link": "https://docs.python.org/tg",
                "content": "TaskGroup: structured",
            },
            {"name": "no url", "description": "Python is a language"},
            "a plain string result",
            {"nothing": "useful"},
        ]
    }
    search_results_handler(env, ToolCall(id="s", name="search"), result(data, "search"))
    knowledge = env.knowledge
    assert knowledge.discovered_facts == [
        "Python is a language",
        "asyncio docs: asyncio is a library to write concurrent code.",
        "TaskGroup: structured",
        "no url: Python is a language",
        "a plain string result",
    ]
    assert knowledge.sources == {
        "asyncio docs": "https://docs.python.org/3/library/asyncio.html",
        "TaskGroup": "https://docs.python.org/tg",
    }


def test_the_search_handler_keeps_only_the_newest_facts_within_its_cap() -> None:
    env = Environment()
    call = ToolCall(id="s", name="search")
    for batch in range(3):
        items: JsonValue = [f"fact {batch}-{i}" for i in range(4)]
        search_results_handler(env, call, result(items, "search"), max_facts=5)
    assert env.knowledge.discovered_facts == [
        "fact 1-3",
        "fact 2-0",
        "fact 2-1",
        "fact 2-2",
        "fact 2-3",
    ]


def test_repeating_the_same_search_changes_nothing() -> None:
    env = Environment()
    call = ToolCall(id="s", name="search")
    data: JsonValue = [{"title": "t", "url": "https://x", "snippet": "s"}]
    search_results_handler(env, call, result(data, "search"))
    version = env.version
    search_results_handler(env, call, result(data, "search"))
    assert env.version == version


def test_the_default_handler_records_the_latest_result_with_its_size_bounded() -> None:
    env = Environment()
    call = ToolCall(id="c9", name="fetch")
    big = {"rows": list(range(2000))}
    record_latest_result(env, call, result(big, "fetch", content="x" * 50), max_chars=100)
    assert env.get(f"/extensions/{TOOL_RESULTS_EXTENSION}/fetch") == {
        "call_id": "c9",
        "content": "x" * 50,
        "truncated": False,
        "data": None,
        "data_omitted": True,
    }
    record_latest_result(env, call, result({"ok": True}, "fetch", content="y" * 500), max_chars=100)
    latest = env.get("/extensions/tool_results/fetch")
    assert latest == {
        "call_id": "c9",
        "content": "y" * 100,
        "truncated": True,
        "data": {"ok": True},
        "data_omitted": False,
    }


def test_handlers_match_by_exact_name_or_glob_in_registration_order() -> None:
    calls: list[str] = []
    registry = HandlerRegistry(default=lambda env, call, res: calls.append("default"))
    registry.register("github_*", lambda env, call, res: calls.append("glob"))
    registry.register("github_search", lambda env, call, res: calls.append("exact"))
    env = Environment()
    for name in ("github_search", "github_issues", "local"):
        registry.apply(env, ToolCall(id="1", name=name), result(None, name))
    assert calls == ["glob", "exact", "glob", "default"]


def test_the_built_in_registry_routes_tools_to_the_built_in_handlers() -> None:
    registry = HandlerRegistry.with_defaults()

    def names(tool: str) -> list[str]:
        return [pattern for pattern, _ in registry.handlers_for(tool)]

    assert names("directory_tree") == ["directory_tree"]
    assert names("fs_directory_tree") == ["*_directory_tree"]
    assert names("web_search") == ["*_search"]
    assert names("search") == ["search"]
    assert names("github_search") == ["*_search"]
    assert names("read_file") == ["*"]


async def test_a_search_tool_updates_knowledge_through_the_executor() -> None:
    async def web_search(query: str) -> list[dict[str, str]]:
        """Search the web."""
        return [
            {"title": f"About {query}", "url": f"https://example.com/{query}", "snippet": "Found."}
        ]

    env = Environment()
    executor = ToolExecutor([web_search], policy=PolicyEngine())
    outcome = await executor.execute_one(
        ToolCall(id="1", name="web_search", arguments='{"query": "mcp"}'), environment=env
    )
    assert outcome.handler_errors == ()
    assert env.knowledge.discovered_facts == ["About mcp: Found."]
    assert env.knowledge.sources == {"About mcp": "https://example.com/mcp"}
    assert {c.pointer for c in outcome.environment_changes} == {
        "/knowledge/discovered_facts",
        "/knowledge/sources",
    }


def test_a_raising_handler_is_reported_and_later_handlers_still_run() -> None:
    def broken(env: Environment, call: ToolCall, res: ToolResult) -> None:
        raise KeyError("missing")

    def works(env: Environment, call: ToolCall, res: ToolResult) -> None:
        env.set("/extensions/ok", True)

    registry = HandlerRegistry()
    registry.register("t", broken)
    registry.register("t", works)
    report = registry.apply(Environment(), ToolCall(id="1", name="t"), result(1, "t"))
    assert [(e.error_type, e.message, e.handler) for e in report.errors] == [
        (
            "KeyError",
            "'missing'",
            "test_a_raising_handler_is_reported_and_later_handlers_still_run.<locals>.broken",
        )
    ]
    assert [c.pointer for c in report.changes] == ["/extensions/ok"]


# -- the agent's entry point: agent.handlers and @agent.handler -------------------------------


def test_the_handler_decorator_registers_the_function_and_returns_it_unchanged() -> None:
    registry = HandlerRegistry()

    @registry.handler("get_*")
    def weather(env: Environment, call: ToolCall, result: ToolResult) -> None:
        env.set("/extensions/weather", result.content)

    assert registry.handlers_for("get_weather") == [("get_*", weather)]
    assert registry.handlers_for("other") == []


@tool(blocking=False)
def get_weather(city: str) -> dict[str, JsonValue]:
    """The weather in a city.

    Args:
        city: The city.
    """
    return {"city": city, "celsius": len(city)}


@tool(blocking=False)
def search(query: str) -> list[dict[str, str]]:
    """Search the web.

    Args:
        query: What to look for.
    """
    return [{"title": query, "snippet": f"all about {query}"}]


@tool(blocking=False)
def count_words(text: str) -> int:
    """Count the words of a text.

    Args:
        text: The text.
    """
    return len(text.split())


_ARGUMENTS: dict[str, dict[str, JsonValue]] = {
    "get_weather": {"city": "Paris"},
    "search": {"query": "parsers"},
    "count_words": {"text": "a b c"},
}


class Weather(BaseModel):
    city: str
    celsius: int


def weather_agent(tools_called: list[str]) -> AgentExecutor:
    llm = ScriptedLLM(
        [reply(tool_calls=[call(name, **_ARGUMENTS[name])]) for name in tools_called] + ["done"]
    )
    agent = AgentExecutor(
        llm,
        config=AgentConfig(control_tools=False, context=ContextConfig(max_tokens=8000)),
    )
    agent.tools.register_all([get_weather, search, count_words])
    agent.environment.register_extension("weather", Weather)
    return agent


@settings(max_examples=25)
@given(tools_called=st.lists(st.sampled_from(sorted(_ARGUMENTS)), max_size=4))
def test_an_agents_own_handler_runs_beside_the_built_in_ones(tools_called: list[str]) -> None:
    """One line on the agent adds a handler; the built-in handlers keep their tools."""
    agent = weather_agent(tools_called)

    @agent.handler("get_weather")
    def weather(env: Environment, call: ToolCall, result: ToolResult) -> None:
        env.set_extension("weather", Weather.model_validate(result.data))

    assert agent.handlers is agent.tools.handlers
    outcome = asyncio.run(agent.run("Weather, then notes."))
    assert outcome.errors == ()
    env = agent.environment
    assert env.has("/extensions/weather") == ("get_weather" in tools_called)
    if "get_weather" in tools_called:
        assert env.get_extension("weather") == Weather(city="Paris", celsius=5)
    # The built-in search handler and the default record still run for the other tools.
    assert ("all about parsers" in "".join(env.knowledge.discovered_facts)) == (
        "search" in tools_called
    )
    records = f"/extensions/{TOOL_RESULTS_EXTENSION}"
    recorded = env.get(records) if env.has(records) else {}
    assert isinstance(recorded, dict)
    assert set(recorded) == set(tools_called) - {"get_weather", "search"}


async def test_a_handler_writing_the_wrong_type_into_a_typed_extension_is_reported() -> None:
    agent = weather_agent(["get_weather"])

    @agent.handler("get_weather")
    def weather(env: Environment, call: ToolCall, result: ToolResult) -> None:
        env.set("/extensions/weather", {"city": "Paris", "celsius": "5"})  # the wrong type

    warnings = agent.subscribe(kinds=["warning_raised"])
    outcome = await agent.run("Weather.")
    assert [e.type for e in outcome.errors] == ["EnvironmentValidationError"]
    assert "Weather" in outcome.errors[0].message
    assert "celsius" in outcome.errors[0].message
    assert not agent.environment.has("/extensions/weather")
    messages = [event.message async for event in warnings]  # type: ignore[attr-defined]
    assert any("result handler" in m and "get_weather" in m for m in messages)


def _noop(env: Environment, call: ToolCall, result: ToolResult) -> None:
    return None


@settings(max_examples=100)
@given(
    steps=st.lists(
        st.one_of(
            st.tuples(st.just("register"), st.sampled_from(["a*", "*_x", "ab", "*", "b?"])),
            st.tuples(st.just("ask"), st.sampled_from(["a", "ab", "abc", "b_x", "bc", "z"])),
            st.tuples(st.just("default"), st.booleans()),
        ),
        max_size=30,
    )
)
def test_the_remembered_matches_follow_registrations_and_the_default(
    steps: list[tuple[str, object]],
) -> None:
    import fnmatch

    registry = HandlerRegistry()
    registered: list[str] = []
    for action, value in steps:
        if action == "register":
            assert isinstance(value, str)
            registry.register(value, _noop)
            registered.append(value)
        elif action == "default":
            registry.default = _noop if value else None
        else:
            assert isinstance(value, str)
            expected = [p for p in registered if fnmatch.fnmatchcase(value, p)]
            if not expected and registry.default is not None:
                expected = ["*"]
            got = registry.handlers_for(value)
            assert [pattern for pattern, _ in got] == expected
            got.clear()  # the caller's list: the registry's own is untouched
            assert [pattern for pattern, _ in registry.handlers_for(value)] == expected


def test_the_remembered_matches_stay_bounded() -> None:
    from agent_flow.tools import handlers

    registry = HandlerRegistry.with_defaults()
    for n in range(handlers._MAX_MATCHED * 2 + 5):
        assert [p for p, _ in registry.handlers_for(f"tool_{n}_search")] == ["*_search"]
    assert 0 < len(registry._matched) <= handlers._MAX_MATCHED
