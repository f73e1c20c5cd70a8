"""A config built in Python survives every copy made of it: a server's, a durable run's, pickle.

The server copies its `AgentConfig` for each session and the durable client for each run it
enqueues, both as JSON with ``exclude_unset`` (so a default the session or run does not give
stays computed from what it does give, e.g. the output reserve from the budget). A tagged
union's tag (an MCP server's ``kind``) left to its default used to be dropped from such copies,
which then no longer validated: every POST /sessions of a server built with
``AgentConfig(mcp_servers=[MCPServerStdio(...)])`` answered 422.

Floats are finite here: JSON has no infinity, so a limit of ``float("inf")`` does not survive a
JSON copy (it becomes null); ``None`` is how a config says "no limit".
"""

from __future__ import annotations

import pickle
import typing
from pathlib import Path

import pytest
from hypothesis import given

from agent_flow.config import AgentConfig
from agent_flow.testing import ScriptedLLM
from agent_flow.tools.mcp_config import MCPServerHTTP, MCPServerStdio
from tests.config_strategies import agent_configs, config_models

#: An MCP server of each kind, every field but the required ones left to its default.
SERVERS = (MCPServerStdio(name="files", command="mcp-files"), MCPServerHTTP(name="web", url="u"))


def server_copy(config: AgentConfig) -> AgentConfig:
    """The copy `agent_flow.server` makes of its config for a session (no options given)."""
    return AgentConfig.model_validate(config.model_dump(mode="json", exclude_unset=True))


def durable_copy(config: AgentConfig) -> AgentConfig:
    """The copy a durable worker runs: enqueued as `RunRequest` JSON, read back by the worker."""
    from agent_flow.durable._workflow import RunRequest

    request = RunRequest(
        session_id="s",
        message="m",
        run_id="r",
        config=config.model_dump(mode="json", exclude_unset=True),
    )
    # DBOS keeps the workflow's argument (the JSON text) in its own serialization.
    received = pickle.loads(pickle.dumps(request.model_dump_json()))
    config_data = RunRequest.model_validate_json(received).config
    assert config_data is not None
    return AgentConfig.model_validate(config_data)


def given_fields(config: AgentConfig) -> object:
    return config.model_dump(mode="json", exclude_unset=True)


@given(config=agent_configs())
def test_every_config_survives_the_copies_the_server_and_the_durable_client_make(
    config: AgentConfig,
) -> None:
    pickled = pickle.loads(pickle.dumps(config))
    for copy in (server_copy(config), durable_copy(config), pickled):
        assert copy == config
        # The copy says what the original said it was given, so a copy of a copy (a server
        # enqueueing its session's config for a worker) is the same config again.
        assert given_fields(copy) == given_fields(config)
    assert durable_copy(server_copy(config)) == config


def test_every_tagged_config_counts_its_tag_as_given() -> None:
    tagged = [model for model in config_models() if "kind" in model.model_fields]
    assert {MCPServerStdio, MCPServerHTTP} <= set(tagged)
    for model in tagged:
        assert typing.get_origin(model.model_fields["kind"].annotation) is typing.Literal
        assert "kind" in model.model_construct().model_fields_set, model


def test_mcp_servers_left_to_their_defaults_keep_their_kind_in_every_copy() -> None:
    config = AgentConfig(mcp_servers=SERVERS)
    assert [s["kind"] for s in given_fields(config)["mcp_servers"]] == ["stdio", "http"]  # type: ignore[index]
    assert server_copy(config) == durable_copy(config) == config
    # Also when loaded (as from a file), or copied with changes.
    loaded = AgentConfig.model_validate(
        {"mcp_servers": [{"kind": "stdio", "name": "a", "command": "c"}]}
    )
    changed = loaded.mcp_servers[0].model_copy(update={"name": "b"})
    assert "kind" in loaded.mcp_servers[0].model_fields_set
    assert "kind" in changed.model_fields_set


async def test_a_server_built_with_mcp_servers_in_python_creates_sessions() -> None:
    pytest.importorskip("fastapi", reason="the server tests need the 'server' extra")
    from agent_flow.server import create_app
    from agent_flow.sessions import InMemorySessionStore
    from tests.server_harness import serving

    app = create_app(
        AgentConfig(mcp_servers=SERVERS),
        store=InMemorySessionStore(),
        llm_factory=lambda _config: ScriptedLLM([]),
    )
    async with serving(app) as http:
        for body in ({}, {"max_tokens": 16000}):
            response = await http.post("/sessions", json=body)
            assert response.status_code == 201, response.text


async def test_a_run_enqueued_with_mcp_servers_reaches_the_worker_valid(tmp_path: Path) -> None:
    from agent_flow.durable import DurableClient, DurableConfig
    from agent_flow.durable._workflow import RunRequest

    config = AgentConfig(mcp_servers=SERVERS)
    durable = DurableConfig(enabled=True, system_database_url=f"sqlite:///{tmp_path}/dbos.db")
    async with DurableClient(durable) as client:
        handle = await client.enqueue("s", "task", config=config)
        # What DBOS hands the worker's workflow: its one argument, as it was stored.
        (queued,) = await client._client.list_workflows_async(
            workflow_ids=[handle.run_id], load_input=True
        )
    assert queued.input is not None
    (request_json,) = queued.input["args"]
    request = RunRequest.model_validate_json(request_json)
    assert request.config is not None
    assert AgentConfig.model_validate(request.config) == config
