"""The `real_llm` tier: agent_flow against a real model server nobody on the project wrote.

llama-cpp-python's OpenAI-compatible server runs SmolLM2-135M-Instruct (see tests/real_llm.py)
for the whole session. A 135M model answers poorly, so these tests assert on the protocol,
never on the model's wisdom: tools reach the model (the server's own prompt count grows by
them), no request is refused for its shape (every HTTP status is 200), every run ends with a
clear outcome within its bounds, and usage is counted (the server's own where it reports one).

The model is asked at temperature 0 (greedy, so the same answers every run) for few tokens.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import re
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Literal

import httpx2
import pytest
from openai import AsyncOpenAI

from agent_flow.agent import ExecutionOutcome, StopReason
from agent_flow.context import ContextManager
from agent_flow.environment import Environment
from agent_flow.events import AgentEvent, ModelResponded, ModelRetrying, WarningRaised
from agent_flow.history import History, ToolCallEntry, ToolResultEntry, UserMessage
from agent_flow.llm import LLMRequest, OpenAIClient
from agent_flow.messages import ChatMessage, ToolCall, ToolDefinition
from agent_flow.tokens import ApproxCounter
from tests.helpers import make_agent
from tests.real_llm import MODEL, HttpLog, LlamaServer, start_llama_server

# Generous: the slowest case (a native run, two grammar-constrained answers) takes about 20 s
# on a quiet 2-core machine and several times that while other jobs load it.
pytestmark = [pytest.mark.real_llm, pytest.mark.timeout(600)]

# Only an enum: llama-cpp-python constrains tool arguments by the schema and ignores
# max_tokens when it chooses between tools itself, so a free-form string could run on.
PICK_COLOR = ToolDefinition(
    name="pick_color",
    description="Pick the color to paint the wall.",
    parameters={
        "type": "object",
        "properties": {"color": {"type": "string", "enum": ["red", "green", "blue"]}},
        "required": ["color"],
    },
)
ADD = ToolDefinition(
    name="add",
    description="Add two integers.",
    parameters={
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "required": ["a", "b"],
    },
)
# With a system message: llama-cpp-python's chatml-function-calling template lists the tools
# inside it (a prompt without one shows the model no tools at all).
ASK = [
    ChatMessage(role="system", content="You paint walls."),
    ChatMessage(role="user", content="Paint the wall blue."),
]
# Outcomes a run may end with here; ERROR (a refused request, a timeout) is never one.
CLEAR_OUTCOMES = {
    StopReason.COMPLETED,
    StopReason.ANSWERED,
    StopReason.MAX_ITERATIONS,
    StopReason.STUCK,
    StopReason.WAITING_FOR_USER,
    StopReason.CONVERSE,
}


@pytest.fixture(scope="module")
def llama_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaServer]:
    """llama-cpp-python's server with SmolLM2-135M, shared by the tier, stopped after it.

    Module-scoped: stopped when this module's tests end. Session-scoped, it outlived them, and
    a generation a test's client had stopped waiting for went on in it, on one of CI's two
    cores, for the rest of the suite (seen: over ten minutes of CPU).
    """
    with start_llama_server(tmp_path_factory.mktemp("llama")) as server:
        yield server


@asynccontextmanager
async def real_client(
    server: LlamaServer,
    log: HttpLog,
    *,
    tool_mode: Literal["native", "xml"] = "native",
    tool_choice: str | None = "auto",
    max_tokens: int = 32,
) -> AsyncIterator[OpenAIClient]:
    """An `OpenAIClient` on the server, every exchange recorded in `log`."""
    http = httpx2.AsyncClient(event_hooks=log.hooks())
    sdk = AsyncOpenAI(base_url=server.base_url, api_key="none", http_client=http)
    try:
        yield OpenAIClient(
            MODEL,
            sdk_client=sdk,
            tool_mode=tool_mode,
            tool_choice=tool_choice,
            temperature=0,
            max_tokens=max_tokens,
            timeout=240,
        )
    finally:
        await sdk.close()


def assert_every_request_accepted(log: HttpLog, server: LlamaServer) -> None:
    refused = [(e.status, e.body.get("messages")) for e in log.exchanges if e.status != 200]
    assert not refused, f"requests refused: {refused}\n{server.log_tail()}"
    for body in log.chat_requests:
        for message in body["messages"]:
            assert "content" not in message or message["content"] is not None


async def test_tools_reach_the_model_because_tool_choice_is_sent(llama_server: LlamaServer) -> None:
    log = HttpLog()
    async with real_client(llama_server, log) as llm:
        plain = await llm.complete(LLMRequest(messages=ASK, max_tokens=8))
        with_tools = await llm.complete(LLMRequest(messages=ASK, tools=[PICK_COLOR]))
    async with real_client(llama_server, log, tool_choice=None) as llm:
        without_choice = await llm.complete(
            LLMRequest(messages=ASK, tools=[PICK_COLOR], max_tokens=8)
        )
    assert_every_request_accepted(log, llama_server)
    assert [body.get("tool_choice") for body in log.chat_requests] == [None, "auto", None]
    # The server's own count: the schemas are in the prompt the model saw...
    assert with_tools.usage is not None and plain.usage is not None
    assert with_tools.usage.prompt_tokens > plain.usage.prompt_tokens + 20
    # ...and without tool_choice it silently drops them (why agent_flow sends "auto").
    assert without_choice.usage is not None
    assert without_choice.usage.prompt_tokens == plain.usage.prompt_tokens


async def run_agent(
    llm: OpenAIClient, *, stream: bool
) -> tuple[ExecutionOutcome, list[AgentEvent]]:
    # A short prompt (no control tools, one line of system prompt): a 135M model on 2 busy
    # cores reads a few hundred tokens a second at best, and far fewer under load.
    agent = make_agent(
        llm, max_iterations=2, control_tools=False, system_prompt="You are a calculator."
    )
    agent.stream = stream
    events: list[AgentEvent] = []
    subscription = agent.subscribe()

    async def read() -> None:
        events.extend([event async for event in subscription])

    reader = asyncio.create_task(read())
    outcome = await agent.run("Use the add tool to add 2 and 3, then say the sum.")
    await reader
    return outcome, events


@pytest.mark.parametrize("stream", [False, True], ids=["complete", "stream"])
@pytest.mark.parametrize("tool_mode", ["native", "xml"])
async def test_an_agent_run_on_a_real_model_ends_with_a_clear_outcome(
    llama_server: LlamaServer, tool_mode: Literal["native", "xml"], stream: bool
) -> None:
    log = HttpLog()
    async with real_client(llama_server, log, tool_mode=tool_mode) as llm:
        outcome, events = await run_agent(llm, stream=stream)
    assert outcome.stop_reason in CLEAR_OUTCOMES, (outcome.stop_reason, outcome.errors)
    assert not [e for e in outcome.errors if e.type.startswith("Model")], outcome.errors
    assert_every_request_accepted(log, llama_server)
    assert not [e for e in events if isinstance(e, ModelRetrying)]
    responded = [e for e in events if isinstance(e, ModelResponded)]
    assert 1 <= len(responded) <= 2
    # Usage is never zero. Non-streamed answers carry the server's count; llama-cpp-python
    # 0.3.36 streams without usage (it ignores stream_options), so a streamed answer is
    # counted by agent_flow, marked as estimated, and the run says so once.
    assert all(e.prompt_tokens > 0 and e.completion_tokens > 0 for e in responded)
    assert outcome.usage.prompt_tokens == sum(e.prompt_tokens for e in responded)
    no_usage = [e for e in events if isinstance(e, WarningRaised) and "no token usage" in e.message]
    assert len(no_usage) == int(outcome.usage.estimated)
    if not stream:
        assert not outcome.usage.estimated
    for body in log.chat_requests:
        if tool_mode == "native":
            assert [t["function"]["name"] for t in body["tools"]] == ["add"]
            assert body["tool_choice"] == "auto"
        else:
            assert "tools" not in body
            assert "add" in body["messages"][0]["content"]


async def test_a_delegated_researcher_runs_on_the_real_model(llama_server: LlamaServer) -> None:
    """The README's delegation shape on a real server: a read-only child with a small budget.

    The parent is scripted (it delegates once, then answers), so that a delegation happens
    whatever a 135M model would choose; the child is the real model. What must hold: the
    child's requests carry only the projection (never the parent's other state) and only the
    read-only tool, every request is accepted, the child's events reach the parent with its
    path, and its usage is in the parent's totals.
    """
    from agent_flow import AgentConfig, AgentExecutor, ContextConfig, Delegate
    from agent_flow.testing import ScriptedLLM, call, reply
    from agent_flow.tools import ToolPolicy, tool

    @tool(policy=ToolPolicy(read_only=True))
    def read_file(path: str) -> str:
        """Read a file.

        Args:
            path: The file to read.
        """
        return "def total(prices):\n    return sum(prices[1:])\n"

    @tool
    def write_file(path: str, content: str) -> str:
        """Write a file.

        Args:
            path: The file to write.
            content: Its new content.
        """
        return "written"

    log = HttpLog()
    async with real_client(llama_server, log) as llm:
        researcher = Delegate(
            "investigate",
            "Investigate a question about the code (read-only).",
            llm=llm,
            tools=[read_file, write_file],
            read_only=True,
            projection=["/task/objective"],
            budget=ContextConfig(max_tokens=1500, counter="approx"),
            config=AgentConfig(max_iterations=2, control_tools=False),
        )
        coder = AgentExecutor(
            ScriptedLLM(
                [
                    reply(tool_calls=[call("investigate", task="Why does total([1, 2]) give 2?")]),
                    "Fixed.",
                ]
            ),
            config=AgentConfig(context=ContextConfig(max_tokens=8000, counter="approx")),
        )
        coder.environment.set("/knowledge/extra/secret", "PARENT-ONLY-7f3a")
        coder.tools.register(write_file)
        researcher.add_to(coder)
        subscription = coder.subscribe()
        outcome = await coder.run("Fix total().")
        events = [event async for event in subscription]
    assert_every_request_accepted(log, llama_server)
    assert log.chat_requests, "the child made no request to the real server"
    for body in log.chat_requests:
        text = json.dumps(body)
        assert "PARENT-ONLY-7f3a" not in text  # outside the projection
        assert "Fix total()." in text  # the parent's objective, projected
        offered = {t["function"]["name"] for t in body.get("tools", [])}
        assert offered <= {"read_file"}, offered  # read-only: never write_file
    child = [e for e in events if e.path]
    assert child and {e.path for e in child} == {(outcome.run_id,)}
    assert child[0].kind == "run_started" and child[-1].kind == "run_finished"
    assert outcome.final_text == "Fixed."
    # The child's calls roll up (counted from its events: one call may take two requests).
    child_calls = [e for e in child if isinstance(e, ModelResponded)]
    assert child_calls and len(outcome.usage_per_call) == 2 + len(child_calls)  # 2: the parent


def _prefix_hits(log_text: str) -> list[int]:
    """llama-cpp-python's "N prefix-match hit" counts, one per request that reused its cache."""
    return [int(m) for m in re.findall(r"(\d+) prefix-match hit", log_text)]


@pytest.mark.parametrize("tool_mode", ["native", "xml"])
async def test_with_the_environment_last_the_real_server_reuses_the_previous_prompt(
    llama_server: LlamaServer, tool_mode: Literal["native", "xml"]
) -> None:
    """Four steps of one run, per placement, on the real server: what its prompt cache reuses.

    llama.cpp keeps the previous prompt's computed state and reports, per request, how many
    tokens of the new prompt it matched ("N prefix-match hit"). With the environment in the
    system message, a step matches the previous prompt only up to the environment's first
    change; with the environment last, up to the environment's message, so what is matched
    grows with the history.
    """
    log = HttpLog()
    hits: dict[str, list[int]] = {}
    async with real_client(llama_server, log, tool_mode=tool_mode, max_tokens=1) as llm:
        for placement in ("system", "last"):
            context = ContextManager(
                Environment(),
                History(counter=ApproxCounter()),
                6000,
                system_prompt_template="You are a calculator.\n{environment}",
                environment_placement=placement,
            )
            context.environment.set("/task/objective", "Add the numbers one by one.")
            context.history.add(UserMessage(content="Add the numbers one by one."))
            hits[placement] = []
            for step in range(4):
                before = llama_server.log.read_text(errors="replace")
                prompt = context.build_prompt(tools=[ADD])
                await llm.complete(LLMRequest(messages=prompt.messages, tools=[ADD]))
                new = llama_server.log.read_text(errors="replace")[len(before) :]
                # The request's first generation: with tools, llama-cpp-python may generate
                # again on top of it (for the call's arguments), matching its own prompt.
                found = _prefix_hits(new)
                assert found, new[-2000:]
                hits[placement].append(found[0])
                call = ToolCall(id=f"call_{step}", name="add", arguments=f'{{"a": {step}, "b": 1}}')
                context.history.add(ToolCallEntry(call=call))
                context.history.add(
                    ToolResultEntry(call_id=call.id, tool_name="add", content=str(step + 1))
                )
                context.environment.set("/knowledge/discovered_facts/-", f"{step} + 1 = {step + 1}")
    assert_every_request_accepted(log, llama_server)
    system, last = hits["system"][1:], hits["last"][1:]  # the first request follows another run
    # In the system message, a step reuses the template and the environment's text up to its
    # first change (here the new fact, at the end of its block); last, the whole history too.
    assert all(b > a for a, b in itertools.pairwise(last)), hits
    assert all(ours > theirs for ours, theirs in zip(last, system, strict=True)), hits
    assert last[-1] - last[0] > system[-1] - system[0], hits
