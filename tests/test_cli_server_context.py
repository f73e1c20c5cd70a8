"""`run` and `chat` against a local server with a small context: the budget follows the server.

The scripted OpenAI server answers ``/props`` as llama.cpp does, ``/api/ps`` and ``/api/show``
as Ollama does and ``/v1/models`` as vLLM does (`OpenAIServer.routes`); the command asks over
real HTTP through the run's own OpenAI client, cuts the budget to the reported context, and
says so once.
"""

from __future__ import annotations

import ipaddress
import json
import textwrap
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent_flow.cli._server_context import server_context, worth_asking
from agent_flow.llm import OpenAIClient
from tests.openai_server import OpenAIServer, Reply, json_reply, sse_reply, text_chunks
from tests.test_cli import invoke_async, model_flags
from tests.test_cli_chat import Terminal
from tests.test_cli_chat import clean_environment as clean_environment

DEFAULT_BUDGET = 32_000


def llama_cpp(server: OpenAIServer, n_ctx: int) -> None:
    """Make `server` report its context as llama.cpp's server does."""
    server.routes[("GET", "/props")] = json_reply(
        {"default_generation_settings": {"n_ctx": n_ctx, "temperature": 0.8}, "total_slots": 1}
    )


def warnings(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("agent-flow: warning:")]


def budgets(stdout: str) -> list[int]:
    """The budget of every prompt the run built, from its JSON events."""
    events = [json.loads(line) for line in stdout.splitlines()]
    return [e["breakdown"]["budget"] for e in events if e["kind"] == "context_built"]


async def test_a_smaller_llama_cpp_context_becomes_the_budget_and_is_said_once(
    openai_server: OpenAIServer, tmp_path: Path
) -> None:
    llama_cpp(openai_server, 8192)
    openai_server.script(sse_reply(text_chunks("Hi.")))
    result = await invoke_async(
        ["run", "hello", *model_flags(openai_server), "--json", "--db", str(tmp_path / "d")]
    )
    assert result.code == 0, result.err
    assert budgets(result.out) == [8192]
    assert warnings(result.err) == [
        "agent-flow: warning: the model server holds 8,192 tokens per request (llama.cpp "
        f"/props), fewer than the budget of {DEFAULT_BUDGET:,} tokens: prompts are budgeted "
        "to 8,192 tokens"
    ]
    assert ("GET", "/props") in {(r.method, r.path) for r in openai_server.side_requests}
    # The questions never took a scripted answer, and carried the run's own key.
    assert openai_server.remaining == 0 and len(openai_server.requests) == 1
    assert all("authorization" in r.headers for r in openai_server.side_requests)


async def test_a_budget_within_the_servers_context_is_left_alone(
    openai_server: OpenAIServer, tmp_path: Path
) -> None:
    llama_cpp(openai_server, 8192)
    openai_server.script(sse_reply(text_chunks("Hi.")), sse_reply(text_chunks("Hi.")))
    db = str(tmp_path / "d")
    small = await invoke_async(
        ["run", "hi", *model_flags(openai_server), "--budget", "6000", "--json", "--db", db]
    )
    assert (small.code, warnings(small.err), budgets(small.out)) == (0, [], [6000])
    big = await invoke_async(
        ["run", "hi", *model_flags(openai_server), "--budget", "50000", "--json", "--db", db]
    )
    assert big.code == 0 and budgets(big.out) == [8192]
    [warning] = warnings(big.err)
    assert warning.endswith("fewer than --budget 50,000: prompts are budgeted to 8,192 tokens")


async def test_a_reserve_larger_than_the_servers_context_is_a_usage_error(
    openai_server: OpenAIServer, tmp_path: Path
) -> None:
    llama_cpp(openai_server, 2048)
    config = tmp_path / "agent.toml"
    config.write_text("[agent.context]\nreserve_output_tokens = 4000\n")
    result = await invoke_async(
        ["run", "hi", *model_flags(openai_server), "--config", str(config),
         "--db", str(tmp_path / "d")]
    )  # fmt: skip
    assert result.code == 2 and result.err.count("\n") == 1
    assert "the model server holds only 2,048 tokens (llama.cpp /props)" in result.err
    assert "lower reserve_output_tokens" in result.err
    assert openai_server.requests == []  # nothing ran


AGENT = textwrap.dedent(
    """
    from agent_flow import AgentConfig, AgentExecutor, ContextConfig

    def build(llm=None):
        return AgentExecutor(llm, config=AgentConfig(context=ContextConfig(max_tokens=8000)))
    """
)


async def test_an_agents_own_budget_is_not_changed_but_the_warning_says_what_to_build(
    openai_server: OpenAIServer, tmp_path: Path
) -> None:
    (tmp_path / "small_agent.py").write_text(AGENT)
    llama_cpp(openai_server, 4096)
    openai_server.script(sse_reply(text_chunks("Hi.")))
    result = await invoke_async(
        ["run", "hi", "--agent", f"{tmp_path / 'small_agent.py'}:build",
         *model_flags(openai_server), "--json", "--db", str(tmp_path / "d")]
    )  # fmt: skip
    assert result.code == 0, result.err
    assert budgets(result.out) == [8000]
    [warning] = warnings(result.err)
    assert "fewer than the budget of --agent" in warning
    assert warning.endswith("build the agent with ContextConfig(max_tokens=4096)")


async def test_chat_says_it_once_and_shows_the_servers_budget(
    openai_server: OpenAIServer, tmp_path: Path
) -> None:
    llama_cpp(openai_server, 8192)
    openai_server.script(sse_reply(text_chunks("One.")), sse_reply(text_chunks("Two.")))
    terminal = Terminal(openai_server, tmp_path / "home", tmp_path / "s.db")
    await terminal.prompt()
    for message, answer in (("first", "One."), ("second", "Two.")):
        terminal.child.send(f"{message}\r")
        await terminal.expect(answer)
        await terminal.prompt()
    assert await terminal.leave() == 0
    screen = " ".join(terminal.screen.split())
    assert screen.count("the model server holds 8,192 tokens per request") == 1
    # The status line showed each prompt against the server's budget, not 32,000.
    assert "/8,192" in screen and f"/{DEFAULT_BUDGET:,}" not in screen


# -- the questions themselves ------------------------------------------------------------

SIZES = st.one_of(st.none(), st.integers(1, 1_000_000))


@settings(max_examples=25)
@given(props=SIZES, vllm=SIZES, ollama_ps=SIZES, ollama_show=SIZES)
async def test_the_smallest_reported_context_wins_and_none_means_none(
    props: int | None, vllm: int | None, ollama_ps: int | None, ollama_show: int | None
) -> None:
    async with OpenAIServer() as server:
        if props is not None:
            llama_cpp(server, props)
        if vllm is not None:
            server.routes[("GET", "/v1/models")] = json_reply(
                {"object": "list", "data": [{"id": "m", "max_model_len": vllm}]}
            )
        if ollama_ps is not None:
            server.routes[("GET", "/api/ps")] = json_reply(
                {"models": [{"name": "other:7b", "context_length": 1}, {"name": "m:latest",
                 "model": "m:latest", "context_length": ollama_ps}]}
            )  # fmt: skip
        if ollama_show is not None:
            server.routes[("POST", "/api/show")] = json_reply(
                {"parameters": f"stop <|im_end|>\nnum_ctx {ollama_show}\ntemperature 0.7"}
            )
        async with OpenAIClient("m", base_url=server.base_url, api_key="k") as client:
            found = await server_context(client)
    reported = {
        "llama.cpp /props": props,
        "vLLM /v1/models": vllm,
        "Ollama /api/ps": ollama_ps,
        "Ollama /api/show": ollama_show,
    }
    sizes = [size for size in reported.values() if size is not None]
    if not sizes:
        assert found is None
    else:
        assert found is not None and found.tokens == min(sizes)
        assert reported[found.source] == found.tokens


async def test_a_server_that_does_not_answer_leaves_the_budget_alone() -> None:
    async with OpenAIServer() as server:
        server.routes[("GET", "/props")] = Reply(hang=True)
        server.routes[("GET", "/api/ps")] = json_reply({"models": "not a list"})
        server.routes[("GET", "/v1/models")] = Reply(status=200, body=b"<html>not json</html>")
        async with OpenAIClient("m", base_url=server.base_url, api_key="k") as client:
            assert await server_context(client, within=0.2) is None


@given(address=st.ip_addresses(), provider=st.sampled_from(["openai_compatible", None]))
def test_only_servers_on_this_machine_or_a_private_network_are_asked(
    address: ipaddress.IPv4Address | ipaddress.IPv6Address, provider: str | None
) -> None:
    host = f"[{address}]" if address.version == 6 else str(address)
    url = f"http://{host}:8080/v1"
    local = address.is_loopback or address.is_private or address.is_link_local
    assert worth_asking(provider, url) == local
    # A provider that names a local server kind is always asked; a cloud one never.
    assert worth_asking("llamacpp", url) and worth_asking("ollama", url)
    assert not worth_asking("openai", url) and not worth_asking("azure", url)


@pytest.mark.parametrize(
    ("url", "asked"),
    [
        ("http://localhost:8080/v1", True),
        ("http://llama:8080/v1", True),  # a container's name
        ("http://gpu-box.local:11434/v1", True),
        ("https://api.openai.com/v1", False),
        ("https://openrouter.ai/api/v1", False),
        (None, False),
    ],
)
def test_named_hosts_are_asked_when_they_are_local(url: str | None, asked: bool) -> None:
    assert worth_asking("openai_compatible", url) == asked
