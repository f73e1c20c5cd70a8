from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from agent_flow.agent import AgentExecutor
from agent_flow.config import AgentConfig, ContextConfig, Skill
from agent_flow.messages import ToolDefinition
from agent_flow.testing import ScriptedLLM
from agent_flow.tools import control_tools, tool
from agent_flow.tools.filters import LOOP_TOOL_NAMES, MCPFilter, ToolFilter
from agent_flow.tools.mcp_config import ComponentKind
from tests.helpers import add

LOOP = LOOP_TOOL_NAMES


def allowed(gate: ToolFilter, *names: str) -> set[str]:
    return {name for name in names if gate.allows(name)}


def test_without_lists_or_a_skill_every_tool_is_allowed() -> None:
    assert allowed(ToolFilter(), "read_file", "run_command", "task_completion") == {
        "read_file",
        "run_command",
        "task_completion",
    }


def test_an_allow_list_admits_only_the_tools_it_matches() -> None:
    gate = ToolFilter(allow=("read_file", "search"))
    assert allowed(gate, "read_file", "search", "run_command") == {"read_file", "search"}


def test_an_empty_allow_list_admits_no_tool_but_none_admits_all() -> None:
    assert allowed(ToolFilter(allow=()), "read_file", "search") == set()
    assert allowed(ToolFilter(allow=None), "read_file", "search") == {"read_file", "search"}


def test_the_deny_list_wins_over_the_allow_list() -> None:
    gate = ToolFilter(allow=("fs_*",), deny=("fs_delete",))
    assert allowed(gate, "fs_read", "fs_write", "fs_delete") == {"fs_read", "fs_write"}


def test_another_agents_tools_are_withheld_whatever_the_lists_say() -> None:
    # On a shared tool executor: the MCP tools other agents registered, which this one did not.
    gate = ToolFilter(
        allow=("docs_*",), always=frozenset({"docs_read"}), foreign=frozenset({"docs_read"})
    )
    assert allowed(gate, "docs_read", "docs_list") == {"docs_list"}


def test_control_tools_stay_callable_outside_the_allow_list_and_the_skill() -> None:
    gate = ToolFilter(allow=("read_file",), always=LOOP, skill=("search",))
    assert allowed(gate, *LOOP, "read_file", "search") == set(LOOP)


def test_the_deny_list_can_withhold_a_control_tool() -> None:
    gate = ToolFilter(deny=("converse",), always=LOOP)
    assert allowed(gate, *LOOP) == set(LOOP) - {"converse"}


def test_control_tools_follow_the_lists_when_the_agent_does_not_offer_them() -> None:
    gate = ToolFilter(allow=("read_file",))
    assert allowed(gate, *LOOP) == set()


def test_an_active_skill_restricts_the_tools_to_its_own() -> None:
    gate = ToolFilter(skill=("add", "note_*"))
    assert allowed(gate, "add", "note_fact", "note_file", "search") == {
        "add",
        "note_fact",
        "note_file",
    }


def test_a_skill_with_no_tools_leaves_only_the_control_tools() -> None:
    gate = ToolFilter(always=LOOP, skill=())
    assert allowed(gate, *LOOP, "add", "search") == set(LOOP)


def test_the_allow_list_and_the_skill_both_apply() -> None:
    gate = ToolFilter(allow=("add", "search"), skill=("add", "note_fact"))
    assert allowed(gate, "add", "search", "note_fact") == {"add"}


def test_patterns_are_case_sensitive_globs_over_the_whole_name() -> None:
    gate = ToolFilter(allow=("github_*", "fs_rea?", "db_[rw]*"))
    names = (
        "github_search",
        "GITHUB_search",
        "fs_read",
        "fs_reads",
        "db_read",
        "db_drop",
        "xfs_read",
    )
    assert allowed(gate, *names) == {"github_search", "fs_read", "db_read"}


def test_select_keeps_the_allowed_definitions_in_their_order() -> None:
    definitions = [ToolDefinition(name=name) for name in ("c", "a", "b", "d")]
    kept = ToolFilter(deny=("a",), allow=("b", "c", "a")).select(definitions)
    assert [d.name for d in kept] == ["c", "b"]


def test_the_loop_tools_are_what_control_tools_registers() -> None:
    assert {t.name for t in control_tools()} == LOOP


_names = st.from_regex(r"[a-z_]{1,8}", fullmatch=True)
_patterns = st.lists(st.one_of(_names, _names.map(lambda n: n[:2] + "*")), max_size=4)


@given(
    name=_names,
    allow=st.none() | _patterns.map(tuple),
    deny=_patterns.map(tuple),
    always=st.frozensets(_names, max_size=3),
    skill=st.none() | _patterns.map(tuple),
)
def test_deny_always_wins_and_always_wins_over_everything_else(
    name: str,
    allow: tuple[str, ...] | None,
    deny: tuple[str, ...],
    always: frozenset[str],
    skill: tuple[str, ...] | None,
) -> None:
    gate = ToolFilter(allow=allow, deny=deny, always=always, skill=skill)
    denied = not ToolFilter(deny=deny).allows(name)
    if denied:
        assert not gate.allows(name)
    elif name in always:
        assert gate.allows(name)
    else:
        # Otherwise each list narrows independently: allowed iff every list present admits it.
        assert gate.allows(name) == (
            ToolFilter(allow=allow).allows(name) and ToolFilter(skill=skill).allows(name)
        )


@tool
def search(query: str) -> str:
    """Search for `query`."""
    return query


def test_the_executor_offers_what_its_filter_allows() -> None:
    skill = Skill(name="math", system_prompt="Math only.", allowed_tools=("add",))
    config = AgentConfig(
        context=ContextConfig(counter="approx"), deny_tools=("converse",), skills=(skill,)
    )
    agent = AgentExecutor(ScriptedLLM([]), config=config)
    agent.tools.register(add)
    agent.tools.register(search)
    assert {d.name for d in agent.offered_tools()} == (LOOP - {"converse"}) | {"add", "search"}
    agent.activate_skill("math")
    assert {d.name for d in agent.offered_tools()} == (LOOP - {"converse"}) | {"add"}


# --- MCP components ---------------------------------------------------------------------

KINDS: tuple[ComponentKind, ...] = ("tools", "resources", "prompts")
PREFIX = {"tools": "tool:", "resources": "resource:", "prompts": "prompt:"}
_names = st.text(alphabet="abcxyz-_", min_size=1, max_size=6)
_servers = st.sampled_from(["docs", "fs", "web"])
_kinds = st.sampled_from(KINDS)


def test_mcp_components_are_excluded_by_name_server_and_kind() -> None:
    gate = MCPFilter(
        clients=("docs", "fs"),
        exclude=("tool:docs/delete_*", "prompt:*/internal", "resource:notes://secret/*", "ping"),
    )
    assert gate.allows("docs", "tools", "read")
    assert not gate.allows("docs", "tools", "delete_all")
    assert gate.allows("fs", "tools", "delete_all")  # only docs' delete_* is excluded
    assert gate.allows("docs", "prompts", "delete_all")  # the tool: prefix limits the kind
    assert not gate.allows("fs", "prompts", "internal")
    assert gate.allows("fs", "tools", "internal")
    assert not gate.allows("docs", "resources", "notes://secret/keys")
    assert gate.allows("docs", "resources", "notes://public/readme")
    # Without a prefix a pattern applies to every kind, on any allowed server.
    assert not any(gate.allows("fs", kind, "ping") for kind in KINDS)
    # A server the agent may not use offers it nothing.
    assert not gate.allows_server("web") and not gate.allows("web", "tools", "read")


@given(server=_servers, kind=_kinds, name=_names)
def test_an_empty_mcp_filter_allows_every_component(
    server: str, kind: ComponentKind, name: str
) -> None:
    assert MCPFilter().allows(server, kind, name)


@given(
    clients=st.lists(_servers, max_size=3).map(tuple) | st.none(),
    exclude=st.lists(_names, max_size=3).map(tuple),
    server=_servers,
    kind=_kinds,
    name=_names,
)
def test_an_excluded_component_or_a_server_not_among_the_clients_is_never_allowed(
    clients: tuple[str, ...] | None,
    exclude: tuple[str, ...],
    server: str,
    kind: ComponentKind,
    name: str,
) -> None:
    # Whatever else the filter says, excluding the name itself (bare, qualified, or with its
    # kind's prefix) hides it, and an unlisted server offers nothing.
    for pattern in (name, f"{server}/{name}", f"{PREFIX[kind]}{name}"):
        assert not MCPFilter(clients=clients, exclude=(*exclude, pattern)).allows(
            server, kind, name
        )
    gate = MCPFilter(clients=clients, exclude=exclude)
    if clients is not None and server not in clients:
        assert not gate.allows(server, kind, name)
    # A pattern prefixed with another kind never affects this one.
    others = tuple(f"{PREFIX[k]}{name}" for k in KINDS if k != kind)
    assert gate.allows(server, kind, name) == MCPFilter(
        clients=clients, exclude=(*exclude, *others)
    ).allows(server, kind, name)
