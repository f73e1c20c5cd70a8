"""The suite's guard (``tests/conftest.py``): a real model request from a test fails loudly."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agent_flow.agent import AgentExecutor
from agent_flow.llm import OpenAIClient
from agent_flow.llm.base import LLMRequest
from agent_flow.messages import ChatMessage
from tests.openai_server import OpenAIServer, completion_body, json_reply

HELLO = LLMRequest(messages=[ChatMessage(role="user", content="hi")])
REAL_API = "https://api.openai.com/v1"
WHERE = "POST https://api.openai.com/v1/chat/completions"


def test_no_model_credentials_or_endpoints_reach_the_tests() -> None:
    assert not [name for name in os.environ if name.startswith(("OPENAI_", "AZURE_OPENAI_"))]
    assert "GEMINI_API_KEY" not in os.environ


async def test_a_request_to_a_real_api_fails_the_test_and_says_where_it_went(
    real_request_attempts: list[str],
) -> None:
    before = len(real_request_attempts)
    client = OpenAIClient("gpt-4o-mini", base_url=REAL_API, api_key="sk-not-real", max_retries=2)
    try:
        with pytest.raises(
            pytest.fail.Exception, match=f"a test made a real network request \\({WHERE}\\)"
        ):
            await client.complete(HELLO)
    finally:
        await client.aclose()
    # One attempt: the SDK's retries (which catch Exception) never see the failure.
    assert real_request_attempts[before:] == [WHERE]
    del real_request_attempts[before:]


async def test_an_agent_run_does_not_turn_a_real_request_into_an_error_outcome(
    real_request_attempts: list[str],
) -> None:
    before = len(real_request_attempts)
    client = OpenAIClient("gpt-4o-mini", base_url=REAL_API, api_key="sk-not-real", max_retries=0)
    agent = AgentExecutor(client)
    try:
        with pytest.raises(pytest.fail.Exception, match="a test made a real network request"):
            await agent.run("What is 2 + 2?")
    finally:
        await client.aclose()
    assert real_request_attempts[before:] == [WHERE]
    del real_request_attempts[before:]


async def test_loopback_servers_are_allowed(openai_server: OpenAIServer) -> None:
    openai_server.script(json_reply(completion_body("hello")))
    client = OpenAIClient("m", base_url=openai_server.base_url, api_key="k")
    try:
        assert (await client.complete(HELLO)).text == "hello"
    finally:
        await client.aclose()


def test_a_request_the_code_under_test_swallows_still_fails_its_test(
    pytester: pytest.Pytester,
) -> None:
    pytester.makeconftest((Path(__file__).parent / "conftest.py").read_text())
    pytester.makepyfile(
        test_swallowing="""
        import httpx2

        def test_swallows_everything():
            try:
                httpx2.get("https://example.com/data?token=secret")
            except BaseException:
                pass
        """
    )
    pytester.makeini("[pytest]\nasyncio_default_fixture_loop_scope = function\n")
    result = pytester.runpytest("-p", "no:cacheprovider")
    # The test body "passed", and its teardown failed it: the query (a token) is not shown.
    result.assert_outcomes(passed=1, errors=1)
    assert (
        "real network requests were attempted: ['GET https://example.com/data']"
        in result.stdout.str()
    )
