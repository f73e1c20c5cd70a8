"""The AG-UI endpoint against the official npm client, ``@ag-ui/client`` (HttpAgent, verifyEvents).

tests/agui_client/run.mjs plays a front end on three threads (see its header) against a real
uvicorn on a loopback port; this test plays the model and checks what the client ended with:
every run passed ``verifyEvents``, the state the client rebuilt equals the environment after
every run, and a front-end tool and an approval each complete a round trip.

Installed by ``npm ci`` in tests/agui_client (``.ci/run`` does it); without node or the
installed packages this test skips, except under ``CI=true`` where it fails.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi", reason="the server tests need the 'server' extra")

from agent_flow.config import AgentConfig
from agent_flow.llm.base import LLMRequest
from agent_flow.server import create_app
from agent_flow.sessions import InMemorySessionStore
from agent_flow.testing import FunctionLLM, Reply, call, reply
from agent_flow.tools import ToolContext, ToolExecutor, ToolPolicy, tool
from tests.server_harness import serving
from tests.test_server_agui import CONFIG

CLIENT = Path(__file__).parent / "agui_client"
DEPLOYED: list[str] = []


def _node() -> str:
    node = shutil.which("node")
    installed = (CLIENT / "node_modules" / "@ag-ui" / "client" / "package.json").is_file()
    if node is None or not installed:
        reason = "the AG-UI client is not installed: run `npm ci` in tests/agui_client (needs node)"
        if os.environ.get("CI") == "true":
            pytest.fail(reason)
        pytest.skip(reason)
    return node


@tool
def note(text: str, context: ToolContext) -> str:
    """Keep a note in the environment.

    Args:
        text: The note.
        context: Supplied by the executor.
    """
    assert context.environment is not None
    context.environment.set("/knowledge/discovered_facts/-", text)
    context.environment.set("/extensions/notes", {"last": text, "tags": ["a", "b"]})
    return "noted"


@tool(policy=ToolPolicy(requires_approval=True))
def deploy(target: str) -> str:
    """Deploy somewhere.

    Args:
        target: Where.
    """
    DEPLOYED.append(target)
    return f"deployed to {target}"


def _tools(config: AgentConfig) -> ToolExecutor:
    return ToolExecutor([note, deploy])


def _model(request: LLMRequest) -> Reply:
    """The model of the three threads, by what it was last sent."""
    last = request.messages[-1]
    if last.role == "tool":
        return {
            "noted": reply("noted it", thinking="that went well"),
            "red": "red it is",
            "deployed to prod": reply(tool_calls=[call("task_completion", summary="shipped")]),
        }[last.content]
    return {
        "take notes": reply("on it", tool_calls=[call("note", text="first", call_id="n1")]),
        "remember blue": "blue, remembered",
        "paint it": reply(tool_calls=[call("pick_color", hint="warm", call_id="c1")]),
        "ship it": reply(tool_calls=[call("deploy", target="prod", call_id="d1")]),
    }[last.content]


async def test_the_official_client_verifies_every_run_rebuilds_the_state_and_round_trips() -> None:
    node = _node()
    DEPLOYED.clear()
    model = FunctionLLM(_model)
    store = InMemorySessionStore()
    app = create_app(CONFIG, store=store, llm_factory=lambda config: model, tools_factory=_tools)
    async with serving(app) as client:
        process = await asyncio.create_subprocess_exec(
            node,
            "run.mjs",
            str(client.base_url).rstrip("/"),
            cwd=CLIENT,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(process.communicate(), timeout=120)
        assert process.returncode == 0, err.decode()
        chat_session = (await client.get("/sessions/node-chat")).json()
    report: dict[str, Any] = json.loads(out)
    runs = [run for name in ("chat", "frontend", "approval") for run in report[name]]
    for run in runs:
        assert run["verified"]
        assert run["types"][0] == "RUN_STARTED" and run["types"][-1] == "RUN_FINISHED"
        assert run["state"] == run["server"], "the state the client rebuilt is the environment"
    first, second = report["chat"]
    assert "STATE_DELTA" in first["types"] and "REASONING_MESSAGE_CONTENT" in first["types"]
    assert first["state"]["extensions"]["notes"] == {"last": "first", "tags": ["a", "b"]}
    assert second["state"]["extensions"]["prefs"] == "blue", "a current state edit is written"
    assert chat_session["environment"]["extensions"]["prefs"] == "blue"
    assert second["result"]["final_text"] == "blue, remembered"

    asked, answered = report["frontend"]
    assert asked["finished"]["pending"] == ["c1"]
    offered = next(r for r in model.requests if r.messages[-1].content == "paint it")
    assert "pick_color" in [t.name for t in offered.tools]
    assert answered["result"]["final_text"] == "red it is"
    resumed = next(r for r in model.requests if r.messages[-1].content == "red")
    assert [m.content for m in resumed.messages if m.role == "user"] == ["paint it"]

    waiting, approved = report["approval"]
    assert waiting["finished"]["pending"] == ["approval:d1"]
    approval_call = next(
        call
        for message in report["approvalMessages"]
        for call in message.get("toolCalls") or []
        if call["id"] == "approval:d1"
    )
    assert approval_call["function"]["name"] == "approve_tool_call"
    assert json.loads(approval_call["function"]["arguments"])["tool_name"] == "deploy"
    assert DEPLOYED == ["prod"]
    assert approved["result"] == {
        "stop_reason": "completed",
        "final_text": "shipped",
        "output": None,
    }
    texts = [m.get("content") for m in report["approvalMessages"] if m["role"] == "assistant"]
    assert "shipped" in texts
