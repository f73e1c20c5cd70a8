"""``GET /sessions/{id}/prompts/{event_id}``: the prompt each step sent, as the inspector shows it.

Over real HTTP (uvicorn on a loopback port, in a thread of its own so that hypothesis can drive
it example by example) against scripted models: every step's prompt is kept under its
``context_built`` event's id, its messages' tokens add up to the step's counted total, the
system message's environment part is the rendered environment, a retried call does not add a
prompt, and the log keeps its bounds. A session reloaded from the store keeps none (404
``prompt_not_kept``), while its stored events still carry every step's counts.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections import deque
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass
from typing import Any, Literal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("fastapi", reason="the server tests need the 'server' extra")

import httpx2
import uvicorn

from agent_flow._defaults import INSPECTOR_PROMPTS_KEPT
from agent_flow.config import AgentConfig, ContextConfig
from agent_flow.errors import ModelConnectionError
from agent_flow.events import ContextBuilt
from agent_flow.llm.base import LLMClient, LLMRequest
from agent_flow.messages import ChatMessage
from agent_flow.prompt import PromptBreakdown
from agent_flow.server import create_app
from agent_flow.server._prompts import KeptPrompt, PromptLog
from agent_flow.sessions import InMemorySessionStore
from agent_flow.testing import ScriptedFailure, ScriptedLLM, ScriptStep, call, fail, reply

_WORDS = st.text(alphabet="abcdefghij klmnop", max_size=60)


@st.composite
def scripts(draw: st.DrawFn) -> list[ScriptStep]:
    """Plan steps (some after a dropped connection that is retried), then an answer."""
    steps: list[ScriptStep] = []
    for index in range(draw(st.integers(0, 5))):
        if draw(st.booleans()):
            steps.append(fail(ModelConnectionError("dropped"), partial_text="par"))
        done = draw(st.integers(0, 2))
        plan = [{"description": f"s{i}", "completed": i < done} for i in range(2)]
        steps.append(
            reply(draw(_WORDS), tool_calls=[call("update_plan", steps=plan, call_id=f"p{index}")])
        )
    steps.append(reply(draw(_WORDS) or "done"))
    return steps


class _Models:
    """An llm_factory giving each new session's agent the next queued script."""

    def __init__(self) -> None:
        self.queue: deque[ScriptedLLM] = deque()

    def __call__(self, config: AgentConfig) -> LLMClient:
        return self.queue.popleft()


@dataclass
class Served:
    """A server in a thread of its own: a client for it, its models, and its event loop."""

    client: httpx2.Client
    models: _Models
    app: Any
    loop: asyncio.AbstractEventLoop

    def on_loop(self, coroutine: Coroutine[Any, Any, Any]) -> Any:
        """Run `coroutine` on the server's loop (its manager belongs to that loop)."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout=30)


@pytest.fixture(scope="module")
def server() -> Iterator[Served]:
    yield from _serve("system")


@pytest.fixture(scope="module")
def server_environment_last() -> Iterator[Served]:
    yield from _serve("last")


def _serve(placement: Literal["system", "last"]) -> Iterator[Served]:
    models = _Models()
    config = AgentConfig(
        context=ContextConfig(counter="approx", max_tokens=4000, environment_placement=placement),
        max_iterations=40,
    )
    app = create_app(config, store=InMemorySessionStore(), llm_factory=models)
    # The port listens before uvicorn starts: the kernel queues the first connections.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    loop = asyncio.new_event_loop()
    thread = threading.Thread(
        target=loop.run_until_complete, args=(server.serve(sockets=[sock]),), daemon=True
    )
    thread.start()
    try:
        port = sock.getsockname()[1]
        with httpx2.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
            yield Served(client, models, app, loop)
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        loop.close()
        sock.close()


def _run(
    client: httpx2.Client, models: _Models, script: list[ScriptStep], session: str | None = None
) -> tuple[str, list[tuple[int, dict[str, Any]]]]:
    """Run `script` in a new session (or `session`); its context_built events with their ids."""
    if session is None:
        models.queue.append(ScriptedLLM(script))
        session = client.post("/sessions", json={}).json()["id"]
    sent = client.post(f"/sessions/{session}/messages", json={"message": "do the task"})
    assert sent.status_code == 202, sent.text
    built: list[tuple[int, dict[str, Any]]] = []
    after = sent.json()["first_event_id"] - 1
    path = f"/sessions/{session}/events"
    with client.stream("GET", path, params={"after": after}) as response:
        frame: dict[str, str] = {}
        for line in response.iter_lines():
            if line:
                name, _, value = line.partition(":")
                frame[name] = value.strip()
                continue
            if frame.get("event") == "context_built":
                built.append((int(frame["id"]), json.loads(frame["data"])))
            if frame.get("event") == "run_finished":
                break
            frame = {}
    return session, built


@settings(max_examples=10)
@given(script=scripts())
def test_with_the_environment_last_the_inspector_marks_the_last_message(
    server_environment_last: Served, script: list[ScriptStep]
) -> None:
    client, models = server_environment_last.client, server_environment_last.models
    session, built = _run(client, models, script)
    assert built
    for event_id, _ in built:
        prompt = client.get(f"/sessions/{session}/prompts/{event_id}").json()
        messages, breakdown = prompt["messages"], prompt["breakdown"]
        assert (
            sum(m["tokens"] for m in messages) + breakdown["tools"] + breakdown["priming"]
            == breakdown["total"]
        )
        last = messages[-1]
        assert last["role"] == "system"
        assert last["environment"] == last["content"]
        assert '"objective":"do the task"' in last["environment"]
        assert last["tokens"] == breakdown["environment"]
        assert all(m["environment"] is None for m in messages[:-1])
        assert "## task" not in messages[0]["content"]


@settings(max_examples=25)
@given(script=scripts())
def test_every_step_keeps_the_prompt_it_sent(server: Served, script: list[ScriptStep]) -> None:
    client, models = server.client, server.models
    session, built = _run(client, models, script)
    # One prompt per step: a retried call after a dropped connection is the same step.
    assert len(built) == sum(1 for step in script if not isinstance(step, ScriptedFailure))
    for event_id, event in built:
        response = client.get(f"/sessions/{session}/prompts/{event_id}")
        assert response.status_code == 200, response.text
        prompt = response.json()
        breakdown = prompt["breakdown"]
        assert (prompt["event_id"], prompt["iteration"]) == (event_id, event["iteration"])
        assert breakdown == event["breakdown"]
        assert prompt["format"] == "native"
        # The messages' own counts, the tool schemas and the reply priming: the whole prompt.
        messages = prompt["messages"]
        assert (
            sum(m["tokens"] for m in messages) + breakdown["tools"] + breakdown["priming"]
            == breakdown["total"]
        )
        system = messages[0]
        assert system["role"] == "system"
        assert system["content"].endswith(system["environment"])
        assert system["environment"].startswith("## task\n")
        assert '"objective":"do the task"' in system["environment"]
        assert all(m["environment"] is None for m in messages[1:])
        assert messages[1] == {
            "role": "user",
            "content": "do the task",
            "environment": None,
            "name": None,
            "tool_call_id": None,
            "tool_calls": [],
            "tokens": messages[1]["tokens"],
        }
        assert set(prompt["tools"]) >= {"update_plan", "task_completion"}
        # What the step saw of the history: every earlier assistant turn and tool result.
        calls = [c["id"] for m in messages if m["role"] == "assistant" for c in m["tool_calls"]]
        results = [m["tool_call_id"] for m in messages if m["role"] == "tool"]
        assert calls == results


def test_a_session_keeps_the_prompts_of_its_latest_steps_only(
    server: Served,
) -> None:
    client, models = server.client, server.models
    steps = INSPECTOR_PROMPTS_KEPT + 4
    # Each step a different plan: the same call again and again would look stuck.
    script: list[ScriptStep] = [
        reply(tool_calls=[call("update_plan", steps=[{"description": f"s{n}"}])])
        for n in range(steps)
    ]
    session, built = _run(client, models, [*script, reply("done")])
    assert len(built) == steps + 1
    statuses = [client.get(f"/sessions/{session}/prompts/{i}").status_code for i, _ in built]
    forgotten = len(built) - INSPECTOR_PROMPTS_KEPT
    assert statuses == [404] * forgotten + [200] * INSPECTOR_PROMPTS_KEPT


def test_a_reloaded_session_keeps_no_prompt_and_says_why(
    server: Served,
) -> None:
    client, models = server.client, server.models
    session, built = _run(
        client, models, [reply("x", tool_calls=[call("update_plan", steps=[])]), reply("done")]
    )
    assert client.get(f"/sessions/{session}/prompts/{built[0][0]}").status_code == 200
    # Evicted as an idle session would be; the next request loads it from the store.
    assert session in server.on_loop(server.app.state.manager.evict(now=float("inf")))
    response = client.get(f"/sessions/{session}/prompts/{built[0][0]}")
    assert response.status_code == 404
    body = response.json()
    assert body["code"] == "prompt_not_kept"
    assert f"latest {INSPECTOR_PROMPTS_KEPT} steps" in body["message"]
    assert "context_built event still has the step's tokens per section" in body["message"]
    # The stored events still carry every step's counts.
    events = client.get(f"/sessions/{session}/events", params={"follow": "false"})
    assert events.text.count("event: context_built") == len(built)
    # A new run of the reloaded session keeps its own steps again.
    models.queue.append(ScriptedLLM([reply("again")]))
    _, again = _run(client, models, [], session=session)
    assert client.get(f"/sessions/{session}/prompts/{again[0][0]}").status_code == 200


def _kept(event_id: int, chars: int) -> KeptPrompt:
    breakdown = PromptBreakdown(
        budget=1,
        reserve=0,
        system_template=0,
        environment=0,
        tools=0,
        history=0,
        priming=0,
        total=0,
        environment_degraded=False,
        history_units_sent=0,
        history_units_omitted=0,
    )
    event = ContextBuilt(run_id="r", seq=event_id, iteration=1, breakdown=breakdown)
    request = LLMRequest(messages=(ChatMessage(role="user", content="x" * chars),))
    return KeptPrompt(
        event_id=event_id, event=event, request=request, environment=None, chars=chars
    )


@given(
    sizes=st.lists(st.integers(0, 500), max_size=40),
    keep=st.integers(1, 8),
    max_chars=st.integers(1, 1500),
)
def test_the_prompt_log_keeps_the_latest_prompts_within_its_bounds(
    sizes: list[int], keep: int, max_chars: int
) -> None:
    log = PromptLog(keep=keep, max_chars=max_chars)
    for event_id, size in enumerate(sizes):
        log.add(_kept(event_id, size))
        ids = log.ids()
        # The latest always, then the newest that fit: a suffix of what was added, in order.
        assert ids == list(range(event_id - len(ids) + 1, event_id + 1))
        assert len(ids) <= keep
        kept_chars = sum(sizes[i] for i in ids)
        assert log.chars == kept_chars
        assert kept_chars <= max_chars or len(ids) == 1
        # Nothing was dropped that would have fitted.
        if len(ids) < min(keep, event_id + 1):
            assert kept_chars + sizes[ids[0] - 1] > max_chars
        assert log.latest == event_id
        assert log.get(event_id) is not None
