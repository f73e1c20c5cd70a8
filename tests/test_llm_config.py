"""LLMConfig, the override rule, and building a client from a config."""

from __future__ import annotations

import pydantic
import pytest

from agent_flow.agent import AgentExecutor
from agent_flow.config import AgentConfig, ContextConfig
from agent_flow.context import DEFAULT_SYSTEM_PROMPT_TEMPLATE
from agent_flow.errors import ConfigError
from agent_flow.llm import (
    LLMConfig,
    LLMOverrides,
    LLMRequest,
    OpenAIClient,
    resolve_llm_config,
)
from agent_flow.messages import ChatMessage, ToolDefinition
from agent_flow.testing import ScriptedLLM
from tests.openai_server import OpenAIServer, completion_body, json_reply

FAST = LLMConfig(
    name="fast",
    provider="ollama",
    model="llama3.2",
    temperature=0.7,
    max_tokens=512,
    extra_body={"top_k": 40, "num_ctx": 8192},
    headers={"X-A": "1"},
    system_prompt="You are fast.",
)


def test_an_agents_own_settings_override_the_named_config_and_unset_ones_keep_it() -> None:
    resolved = FAST.with_overrides(
        LLMOverrides(temperature=0.0, system_prompt="You are careful.", extra_body={"top_k": 1})
    )

    assert resolved.temperature == 0.0
    assert resolved.system_prompt == "You are careful."
    assert resolved.model == "llama3.2"
    assert resolved.max_tokens == 512
    assert resolved.extra_body == {"top_k": 1, "num_ctx": 8192}
    assert resolved.headers == {"X-A": "1"}
    assert FAST.temperature == 0.7  # configs are immutable values


def test_no_overrides_keep_the_config_as_it_is() -> None:
    assert FAST.with_overrides(None) is FAST
    assert FAST.with_overrides(LLMOverrides()) is FAST


def test_resolving_applies_the_rule_to_the_referenced_config() -> None:
    named = {"fast": FAST, "smart": LLMConfig(provider="openai", model="gpt-4.1")}

    assert resolve_llm_config(named=named, ref="smart").model == "gpt-4.1"
    assert (
        resolve_llm_config(named=named, ref="fast", overrides=LLMOverrides(model="qwen3")).model
        == "qwen3"
    )
    with pytest.raises(ConfigError, match=r"no LLM config is named 'fats' \(known: fast, smart\)"):
        resolve_llm_config(named=named, ref="fats")


def test_without_a_reference_the_agents_settings_stand_alone_and_must_name_a_model() -> None:
    alone = resolve_llm_config(overrides=LLMOverrides(model="m", temperature=0.1))

    assert (alone.model, alone.temperature, alone.provider) == ("m", 0.1, "openai_compatible")
    with pytest.raises(ConfigError, match="no model is configured"):
        resolve_llm_config(overrides=LLMOverrides(temperature=0.1))


def test_invalid_settings_are_refused_with_the_offending_field() -> None:
    with pytest.raises(pydantic.ValidationError, match="temperature"):
        LLMConfig(model="m", temperature=3.0)
    with pytest.raises(pydantic.ValidationError, match="api_key"):
        LLMConfig.model_validate({"model": "m", "api_key": "sk-do-not-store-keys"})
    with pytest.raises(pydantic.ValidationError, match="model"):
        LLMConfig(model="")


def test_providers_supply_base_url_key_variable_and_max_tokens_field_defaults() -> None:
    ollama = LLMConfig(provider="ollama", model="llama3")
    gemini = LLMConfig(provider="gemini", model="gemini-2.5-flash")
    openai = LLMConfig(provider="openai", model="gpt-4.1")

    assert ollama.resolved_base_url() == "http://localhost:11434/v1"
    assert gemini.resolved_api_key_env() == "GEMINI_API_KEY"
    assert openai.resolved_base_url() is None
    assert openai.resolved_max_tokens_field() == "max_completion_tokens"
    assert ollama.resolved_max_tokens_field() == "max_tokens"
    assert LLMConfig(
        provider="ollama", model="x", base_url="http://gpu:11434/v1"
    ).resolved_base_url() == ("http://gpu:11434/v1")


def test_the_key_is_read_from_its_variable_and_never_printed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("GEMINI_API_KEY", "g-secret-value")
    config = LLMConfig(provider="gemini", model="gemini-2.5-flash")

    key = config.read_api_key()

    assert key is not None
    assert key.get_secret_value() == "g-secret-value"
    assert "g-secret-value" not in repr(key)
    assert "g-secret-value" not in repr(config)
    monkeypatch.delenv("GEMINI_API_KEY")
    assert config.read_api_key() is None


def test_a_config_round_trips_through_json() -> None:
    assert LLMConfig.model_validate_json(FAST.model_dump_json()) == FAST


async def test_a_client_built_from_a_config_sends_what_the_config_says(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("LOCAL_KEY", "local-secret")
    async with OpenAIServer() as server:
        server.script(json_reply(completion_body("ok")))
        config = FAST.with_overrides(
            LLMOverrides(base_url=server.base_url, api_key_env="LOCAL_KEY", max_retries=0)
        )
        client = OpenAIClient.from_config(config)
        request = LLMRequest(
            messages=[ChatMessage(role="user", content="hi")], tools=[ToolDefinition(name="ls")]
        )
        try:
            completion = await client.complete(request)
        finally:
            await client.aclose()

    assert completion.text == "ok"
    recorded = server.requests[0]
    assert recorded.headers["authorization"] == "Bearer local-secret"
    assert recorded.headers["x-a"] == "1"
    body = recorded.body
    assert (body["model"], body["temperature"], body["max_tokens"]) == ("llama3.2", 0.7, 512)
    assert (body["top_k"], body["num_ctx"]) == (40, 8192)


async def test_a_config_in_xml_tool_mode_builds_an_xml_client() -> None:
    client = OpenAIClient.from_config(
        LLMConfig(provider="llamacpp", model="qwen", tool_mode="xml", stream_usage=False)
    )
    try:
        body = client.build_body(
            LLMRequest(
                messages=[ChatMessage(role="user", content="hi")], tools=[ToolDefinition(name="ls")]
            ),
            stream=True,
        )
    finally:
        await client.aclose()

    assert client.base_url == "http://localhost:8080/v1/"
    assert "tools" not in body
    assert "stream_options" not in body
    assert "<available_tools>" in body["messages"][0]["content"]


# -- the system prompt of an LLM config ------------------------------------------------------

TERSE = LLMConfig(model="m", system_prompt="You are terse.\n{task}\n{environment}")


def test_the_system_prompt_is_the_agents_then_its_llm_configs_then_the_default() -> None:
    assert AgentConfig(llm=TERSE).resolved_system_prompt() == TERSE.system_prompt
    assert AgentConfig(llms={"t": TERSE}, llm="t").resolved_system_prompt() == TERSE.system_prompt
    assert AgentConfig(llm=TERSE, system_prompt="Mine.").resolved_system_prompt() == "Mine."
    overridden = AgentConfig(llm=TERSE, llm_overrides=LLMOverrides(system_prompt="Override."))
    assert overridden.resolved_system_prompt() == "Override."
    without_model = AgentConfig(llm_overrides=LLMOverrides(system_prompt="No model yet."))
    assert without_model.resolved_system_prompt() == "No model yet."
    assert AgentConfig().resolved_system_prompt() == DEFAULT_SYSTEM_PROMPT_TEMPLATE
    assert AgentConfig(system_prompt="").resolved_system_prompt() == DEFAULT_SYSTEM_PROMPT_TEMPLATE


async def test_an_agent_sends_the_system_prompt_of_its_llm_config() -> None:
    llm = ScriptedLLM(["Done."])
    config = AgentConfig(llm=TERSE, context=ContextConfig(counter="approx"))
    agent = AgentExecutor(llm, config=config)
    await agent.run("Say hi")
    system = llm.requests[0].messages[0].content
    assert system.startswith("You are terse.\nCurrent task: Say hi\n")
    # Leaving a skill goes back to it.
    agent.activate_skill(None)
    assert agent.context.system_prompt_template == TERSE.system_prompt


def test_openai_compatible_without_a_base_url_is_a_config_error_not_a_call_to_openai(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-must-not-leave")
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    for base_url in (None, ""):
        config = LLMConfig(model="m", base_url=base_url)
        with pytest.raises(ConfigError, match="openai_compatible"):
            OpenAIClient.from_config(config)
    # Said on purpose, OpenAI's own endpoint is fine; so is a URL from the environment.
    assert LLMConfig(model="m", provider="openai").resolved_base_url() is None
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
    assert LLMConfig(model="m").resolved_base_url() == "http://127.0.0.1:9/v1"


def test_a_config_that_sends_no_key_reads_none(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-must-not-leave")
    config = LLMConfig(model="m", base_url="http://127.0.0.1:9/v1", send_key=False)
    client = OpenAIClient.from_config(config)
    assert client.sdk_client.api_key != "sk-must-not-leave"
