"""An agent's use of MCP beyond tools: filters, shared servers, prompt skills, list changes.

Against the project's own Python SDK server (tests/mcp_servers/resources_server.py) over
stdio; the npm reference server's turn is in test_tools_mcp_everything.py.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from agent_flow._types import JsonValue
from agent_flow.agent import AgentExecutor
from agent_flow.config import AgentConfig, ContextConfig, Skill, load_config
from agent_flow.errors import ConfigError
from agent_flow.events import MCPListChanged, ToolCallFailed
from agent_flow.history import ToolResultEntry
from agent_flow.messages import ToolCall
from agent_flow.testing import ScriptedLLM, call, reply
from agent_flow.tools import (
    ApprovalRequest,
    MCPAgentSettings,
    MCPFilter,
    MCPPromptRef,
    MCPResourceLoad,
    MCPServers,
    ToolExecutor,
)
from tests.helpers import stdio_server, tool_call

CONTEXT = ContextConfig(counter="approx", max_tokens=20_000)
NOTES = stdio_server("notes", "resources_server.py")
BASIC = stdio_server("basic", "basic_server.py")


def _config(**fields: object) -> AgentConfig:
    return AgentConfig.model_validate({"context": CONTEXT, **fields})


async def test_shared_servers_are_filtered_per_agent() -> None:
    async with MCPServers([NOTES, BASIC]) as servers:
        only_notes = AgentExecutor(
            ScriptedLLM([]),
            config=_config(
                mcp=MCPAgentSettings(
                    clients=("notes",),
                    exclude_components=("tool:notes/add_*", "resource:notes://config"),
                )
            ),
            mcp_servers=servers,
        )
        everything = AgentExecutor(ScriptedLLM([]), config=_config(), mcp_servers=servers)
        async with only_notes, everything:
            assert set(only_notes.mcp_tools) == {"notes_ephemeral", "notes_drop_tool"}
            assert "basic_echo" in everything.mcp_tools and "notes_add_note" in everything.mcp_tools
            assert set(only_notes.mcp.connections) == {"notes"}
            # The resource tools list only what the filter lets through.
            listing = await only_notes.tools.execute_one(call_of("mcp_list_resources"))
            assert "notes://readme" in listing.result.content
            assert "notes://config" not in listing.result.content
            read = await only_notes.tools.execute_one(
                call_of("mcp_read_resource", server="notes", uri="notes://config")
            )
            assert read.result.is_error and "not available to this agent" in read.result.content
            other = await only_notes.tools.execute_one(
                call_of("mcp_read_resource", server="basic", uri="x://y")
            )
            assert "no MCP server 'basic' is available; available: notes" in other.result.content
        # Shared servers outlive the agents that used them.
        assert servers["notes"].connected and servers["basic"].connected
        # Without an agent, the same filter applies to registering into an executor.
        executor = ToolExecutor()
        gate = MCPFilter(clients=("notes",), exclude=("add_*",))
        assert servers.register(executor, mcp_filter=gate) == ["notes_ephemeral", "notes_drop_tool"]


def call_of(name: str, **arguments: JsonValue) -> ToolCall:
    return tool_call(name, arguments)


async def test_resources_load_at_start_into_knowledge_or_workspace() -> None:
    loads = (
        MCPResourceLoad(server="notes", uri="notes://readme"),
        MCPResourceLoad(server="notes", uri="notes://by-id/7", into="workspace"),
    )
    agent = AgentExecutor(
        ScriptedLLM([]), config=_config(mcp_servers=(NOTES,), mcp=MCPAgentSettings(resources=loads))
    )
    async with agent:
        env = agent.environment
        readme = env.get("/knowledge/extra/mcp_resources/notes:~1~1readme")
        assert isinstance(readme, dict) and "vault path ops/deploy" in str(readme["text"])
        assert env.knowledge.sources == {"notes: readme": "notes://readme"}
        note = env.get("/workspace/extra/mcp_resources/notes:~1~1by-id~17")
        assert isinstance(note, dict) and note["text"] == "note 7: remember to rotate keys"
        # The loaded resources are part of what the model sees.
        assert "ops/deploy" in agent.environment.render(4000, agent.history.counter)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (
            MCPAgentSettings(resources=(MCPResourceLoad(server="nope", uri="notes://readme"),)),
            "names MCP server 'nope', which this agent cannot use",
        ),
        (
            MCPAgentSettings(
                exclude_components=("resource:notes://readme",),
                resources=(MCPResourceLoad(server="notes", uri="notes://readme"),),
            ),
            "resource 'notes://readme' of MCP server 'notes' is excluded",
        ),
        (
            MCPAgentSettings(
                resources=(MCPResourceLoad(server="notes", uri="notes://readme", subscribe=True),)
            ),
            "'notes' does not support resource subscriptions",
        ),
    ],
)
async def test_a_bad_resource_load_fails_the_start_and_stops_the_servers(
    settings: MCPAgentSettings, message: str
) -> None:
    agent = AgentExecutor(ScriptedLLM([]), config=_config(mcp_servers=(NOTES,), mcp=settings))
    with pytest.raises(Exception, match=message):
        await agent.start()
    assert agent.mcp.owned is None and not agent.mcp_tools


async def test_a_prompt_seeds_a_skill_from_config_or_at_run_time() -> None:
    reviewer = Skill(
        name="review",
        mcp_prompt=MCPPromptRef(server="notes", name="reviewer", arguments={"language": "Go"}),
        allowed_tools=("notes_ephemeral",),
    )
    agent = AgentExecutor(
        ScriptedLLM([]),
        config=_config(
            mcp_servers=(NOTES,),
            skills=(reviewer,),
            mcp=MCPAgentSettings(exclude_components=("prompt:greeting",)),
        ),
    )
    async with agent:
        agent.activate_skill("review")
        template = agent.context.system_prompt_template
        assert template.startswith("You review Go code with normal strictness.")
        assert "{environment}" in template
        assert {d.name for d in agent.offered_tools()} >= {"notes_ephemeral"}
        assert "notes_drop_tool" not in {d.name for d in agent.offered_tools()}
        made = await agent.skill_from_mcp_prompt(
            MCPPromptRef(server="notes", name="reviewer", arguments={"language": "C"}),
            name="c-review",
        )
        agent.activate_skill("c-review")
        assert agent.skill == made
        assert agent.context.system_prompt_template.startswith("You review C code")
        with pytest.raises(
            ConfigError, match="prompt 'greeting' of MCP server 'notes' is excluded"
        ):
            await agent.skill_from_mcp_prompt(MCPPromptRef(server="notes", name="greeting"))


def test_a_skill_needs_exactly_one_prompt() -> None:
    with pytest.raises(ValueError, match="needs a system_prompt or an mcp_prompt"):
        Skill(name="x")
    with pytest.raises(ValueError, match="not both"):
        Skill(name="x", system_prompt="y", mcp_prompt=MCPPromptRef(server="s", name="p"))


def test_the_mcp_table_and_prompt_skills_load_from_toml(tmp_path: Path) -> None:
    path = tmp_path / "agent.toml"
    path.write_text(
        """
[agent]
name = "reviewer"

[[agent.mcp_servers]]
kind = "stdio"
name = "notes"
command = "python"
args = ["resources_server.py"]

[agent.mcp]
clients = ["notes"]
exclude_components = ["tool:notes/drop_tool", "prompt:*/greeting"]

[[agent.mcp.resources]]
server = "notes"
uri = "notes://readme"
into = "workspace"

[[agent.skills]]
name = "review"
allowed_tools = ["notes_*"]
[agent.skills.mcp_prompt]
server = "notes"
name = "reviewer"
arguments = { language = "Python" }
""",
        encoding="utf-8",
    )
    config = load_config(path, environ={})
    assert config.mcp.clients == ("notes",)
    assert config.mcp.resources == (
        MCPResourceLoad(server="notes", uri="notes://readme", into="workspace"),
    )
    assert config.skills[0].mcp_prompt == MCPPromptRef(
        server="notes", name="reviewer", arguments={"language": "Python"}
    )


async def test_list_changes_between_steps_update_the_offered_tools_with_an_event() -> None:
    llm = ScriptedLLM(
        [
            reply(tool_calls=[call("notes_add_tool", name="fresh")]),
            reply(tool_calls=[call("notes_fresh"), call("notes_add_prompt", name="p", text="t")]),
            reply(tool_calls=[call("notes_drop_tool")]),
            reply(tool_calls=[call("notes_ephemeral")]),
            "Done.",
        ]
    )
    approvals: list[str] = []

    async def approve(request: ApprovalRequest) -> bool:
        approvals.append(request.tool_name)
        return True

    # policy=None: the server's annotations decide, with the spec's defaults.
    server = stdio_server("notes", "resources_server.py", policy=None)
    agent = AgentExecutor(
        llm,
        config=_config(
            mcp_servers=(server,), mcp=MCPAgentSettings(exclude_components=("prompt:p",))
        ),
        approval=approve,
    )
    async with agent:
        subscription = agent.subscribe()
        outcome = await agent.run("Change the server")
        events = [event async for event in subscription]

    assert outcome.final_text == "Done."
    changed = [e for e in events if isinstance(e, MCPListChanged)]
    assert [(e.component, e.added, e.removed) for e in changed] == [
        ("tools", ("notes_fresh",), ()),
        ("tools", (), ("notes_ephemeral",)),
    ]  # the prompt "p" is excluded for this agent: no event for it
    offered = [{t.name for t in request.tools} for request in llm.requests]
    assert "notes_fresh" not in offered[0] and "notes_fresh" in offered[1]
    assert "notes_ephemeral" in offered[2] and "notes_ephemeral" not in offered[3]
    results = {e.tool_name: e for e in agent.history.entries if isinstance(e, ToolResultEntry)}
    assert results["notes_fresh"].content == "fresh"
    # A call the model made from an outdated list fails as an unknown tool.
    failed = [e for e in events if isinstance(e, ToolCallFailed)]
    assert [(e.name, e.error_kind) for e in failed] == [("notes_ephemeral", "unknown_tool")]
    # fresh and drop_tool carry no annotations: destructive by the spec, so they needed
    # approval; add_tool and add_prompt say destructiveHint false, so they did not.
    assert approvals == ["notes_fresh", "notes_drop_tool"]


def test_the_readme_mcp_example_loads(tmp_path: Path) -> None:
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    section = readme.split("### MCP beyond tools", 1)[1].split("\n## ", 1)[0]
    match = re.search(r"```toml\n(.*?)```", section, re.S)
    assert match is not None
    path = tmp_path / "agent.toml"
    path.write_text(match.group(1), encoding="utf-8")
    config = load_config(path, environ={})
    assert config.mcp.clients == ("everything",)
    assert config.mcp.resources[0].subscribe is True
    assert config.skills[0].mcp_prompt == MCPPromptRef(
        server="everything", name="args-prompt", arguments={"city": "Oslo"}
    )


async def test_agents_sharing_a_server_each_take_up_its_list_changes() -> None:
    async with MCPServers([NOTES]) as servers:
        changer_llm = ScriptedLLM([reply(tool_calls=[call("notes_add_tool", name="extra")]), "ok"])
        changer = AgentExecutor(changer_llm, config=_config(), mcp_servers=servers)
        later_llm = ScriptedLLM(["ok"])
        later = AgentExecutor(later_llm, config=_config(), mcp_servers=servers)
        hidden = AgentExecutor(
            ScriptedLLM(["ok"]),
            config=_config(mcp=MCPAgentSettings(exclude_components=("tool:extra",))),
            mcp_servers=servers,
        )
        async with changer, later, hidden:
            runs = []
            for agent in (changer, later, hidden):
                subscription = agent.subscribe()
                await agent.run("go")
                runs.append([e async for e in subscription if isinstance(e, MCPListChanged)])

    # The changer refreshed the connection; the agent that ran later still took it up.
    assert [[(e.component, e.added) for e in events] for events in runs] == [
        [("tools", ("notes_extra",))],
        [("tools", ("notes_extra",))],
        [],  # excluded for this one
    ]
    assert "notes_extra" in {t.name for t in later_llm.requests[0].tools}
    assert "notes_extra" not in hidden.tools
