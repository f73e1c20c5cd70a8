from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from agent_flow.agent import AgentExecutor, tool_executor_from_config
from agent_flow.config import AgentConfig, ContextConfig, Skill, load_config
from agent_flow.context import ContextManager
from agent_flow.environment import Environment
from agent_flow.errors import ConfigError
from agent_flow.history import History
from agent_flow.llm import LLMConfig
from agent_flow.testing import ScriptedLLM
from agent_flow.tokens import ApproxCounter
from agent_flow.tools import MIN_OUTPUT_TOKENS, MCPServerStdio, ToolExecutor

TOML = """
[llms.local]
provider = "ollama"
model = "qwen2.5-coder"
temperature = 0.7

[agent]
name = "coder"
llm = "local"
max_iterations = 30
deny_tools = ["run_command"]

[agent.llm_overrides]
temperature = 0.1

[agent.context]
max_tokens = 32000
strategy = "sliding_window"

[[agent.mcp_servers]]
kind = "stdio"
name = "fs"
command = "python"
args = ["-m", "srv"]

[[agent.skills]]
name = "review"
system_prompt = "Review only."
allowed_tools = ["read_file"]
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "agent.toml"
    path.write_text(text)
    return path


def test_a_toml_file_loads_with_named_llm_and_the_agents_overrides_winning(
    tmp_path: Path,
) -> None:
    config = load_config(write(tmp_path, TOML), environ={})
    assert config.name == "coder"
    assert config.max_iterations == 30
    assert config.context.strategy == "sliding_window"
    assert config.mcp_servers[0].name == "fs"
    assert config.skill("review").allowed_tools == ("read_file",)
    llm = config.resolved_llm()
    assert (llm.model, llm.provider, llm.temperature) == ("qwen2.5-coder", "ollama", 0.1)
    assert llm.resolved_base_url() == "http://localhost:11434/v1"


def test_environment_variables_override_the_file_and_nested_fields(tmp_path: Path) -> None:
    environ = {
        "AGENT_FLOW_MAX_ITERATIONS": "5",
        "AGENT_FLOW_CONTEXT__MAX_TOKENS": "16000",
        "AGENT_FLOW_NAME": "from-env",
        "AGENT_FLOW_HOME": "/not/a/field",
        "UNRELATED": "1",
    }
    config = load_config(write(tmp_path, TOML), environ=environ)
    assert config.max_iterations == 5
    assert config.context.max_tokens == 16000
    assert config.context.strategy == "sliding_window"
    assert config.name == "from-env"


def test_explicit_overrides_win_over_everything(tmp_path: Path) -> None:
    config = load_config(
        write(tmp_path, TOML),
        environ={"AGENT_FLOW_MAX_ITERATIONS": "5"},
        overrides={"max_iterations": 2},
    )
    assert config.max_iterations == 2


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "[agent]\nmax_iterations = 0\n",
            "max_iterations: Input should be greater than or equal to 1",
        ),
        ("[agent]\nbogus = 1\n", "bogus: Extra inputs are not permitted"),
        (
            "[agent.context]\nmax_tokens = 100\nreserve_output_tokens = 200\n",
            "reserve_output_tokens",
        ),
        ("[agent]\nllm = 'nope'\n[llms.a]\nmodel = 'm'\n", "'nope', which is not among"),
        ("[agnet]\nname = 'x'\n", "unknown top-level table(s) ['agnet']"),
        ("[agent\n", "not valid TOML"),
        ("[agent]\nllm = 'local'\n", "define it in an [llms.local] table"),
    ],
)
def test_invalid_config_files_raise_one_clear_error_naming_the_key_and_file(
    tmp_path: Path, text: str, message: str
) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_config(path, environ={})
    assert message in str(info.value)
    if "TOML" not in message and "top-level" not in message:
        assert str(path) in str(info.value)


def test_a_missing_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "missing.toml")


def test_inline_llm_configs_and_unknown_skills() -> None:
    config = AgentConfig(
        llm=LLMConfig(model="m", temperature=0.5),
        skills=(Skill(name="a", system_prompt="A"),),
        context=ContextConfig(max_tokens=1000, reserve_output_tokens=10),
    )
    assert config.resolved_llm().temperature == 0.5
    with pytest.raises(ConfigError, match="no skill named 'b'; defined: a"):
        config.skill("b")
    with pytest.raises(ConfigError, match="no model is configured"):
        AgentConfig().resolved_llm()


# -- one source of defaults ------------------------------------------------------------------


def test_a_context_manager_built_directly_reserves_what_the_default_config_does() -> None:
    history = History(counter=ApproxCounter())
    manager = ContextManager(Environment(), history, ContextConfig().max_tokens)
    config = ContextConfig()
    assert manager.reserve_output_tokens == config.reserve_output_tokens == 2048
    assert manager.environment_allocation == config.environment_allocation
    assert manager.prune_target == config.prune_target


def test_parts_built_directly_and_from_the_default_config_agree() -> None:
    config = AgentConfig(context=ContextConfig(counter="approx"))
    direct, built = ToolExecutor(), tool_executor_from_config(config)
    assert direct.default_timeout == built.default_timeout == config.tool_timeout
    assert direct.max_output_tokens == built.max_output_tokens == config.max_tool_output_tokens
    assert MCPServerStdio(name="s", command="srv").timeout == config.tool_timeout
    agent = AgentExecutor(ScriptedLLM([]), config=config)
    manager = ContextManager(Environment(), agent.history, config.context.max_tokens)
    for name in ("reserve_output_tokens", "environment_allocation", "prune_target"):
        assert getattr(agent.context, name) == getattr(manager, name), name
    assert agent.context.system_prompt_template == manager.system_prompt_template


def test_a_tool_output_limit_below_the_executors_minimum_is_refused_by_the_config() -> None:
    with pytest.raises(ValidationError, match=f"greater than or equal to {MIN_OUTPUT_TOKENS}"):
        AgentConfig(max_tool_output_tokens=16)
    with pytest.raises(ConfigError, match="max_tool_output_tokens"):
        load_config(None, environ={"AGENT_FLOW_MAX_TOOL_OUTPUT_TOKENS": "16"})


@given(limit=st.integers(min_value=1, max_value=64) | st.integers(min_value=1) | st.none())
def test_every_tool_output_limit_the_config_accepts_builds_its_tool_executor(
    limit: int | None,
) -> None:
    try:
        config = AgentConfig(max_tool_output_tokens=limit)
    except ValidationError:
        assert limit is not None and limit < MIN_OUTPUT_TOKENS
        return
    assert tool_executor_from_config(config).max_output_tokens == limit


# -- a small budget without a reserve --------------------------------------------------------


def test_a_small_budget_works_without_setting_the_output_reserve(tmp_path: Path) -> None:
    assert ContextConfig(max_tokens=1000).reserve_output_tokens == 250
    from_env = load_config(None, environ={"AGENT_FLOW_CONTEXT__MAX_TOKENS": "1000"})
    assert from_env.context.reserve_output_tokens == 250
    from_file = load_config(write(tmp_path, "[agent.context]\nmax_tokens = 600\n"), environ={})
    assert from_file.context.reserve_output_tokens == 150


def test_an_explicit_reserve_too_big_for_the_budget_still_fails_clearly() -> None:
    with pytest.raises(
        ValidationError,
        match=r"reserve_output_tokens \(1000\) must be smaller than max_tokens \(1000\); "
        r"lower it, or leave it unset for 250",
    ):
        ContextConfig(max_tokens=1000, reserve_output_tokens=1000)


def test_an_invalid_budget_is_reported_once_not_also_as_the_reserve_it_defaults() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(None, environ={"AGENT_FLOW_CONTEXT__MAX_TOKENS": "0"})
    message = str(info.value)
    assert "AGENT_FLOW_CONTEXT__MAX_TOKENS (sets context.max_tokens): Input should" in message
    assert "reserve_output_tokens" not in message and "default factory" not in message


@given(max_tokens=st.integers(min_value=1, max_value=10_000_000))
def test_every_budget_gives_a_valid_config_with_the_default_reserve(max_tokens: int) -> None:
    config = ContextConfig(max_tokens=max_tokens)
    assert config.reserve_output_tokens == min(2048, max_tokens // 4)
    assert 0 <= config.reserve_output_tokens < max_tokens
    assert "reserve_output_tokens" not in config.model_fields_set
    history = History(counter=ApproxCounter())
    manager = ContextManager(Environment(), history, max_tokens)
    assert manager.reserve_output_tokens == config.reserve_output_tokens


def _smallest_working_budget() -> int:
    """The smallest budget whose non-reserved part holds a default agent's fixed costs."""
    agent = AgentExecutor(
        ScriptedLLM([]), config=AgentConfig(context=ContextConfig(counter="approx"))
    )
    fixed = agent.context.fixed_tokens(tools=agent.offered_tools())
    return next(n for n in range(fixed, 2 * fixed + 8) if n - n // 4 >= fixed)


@settings(max_examples=60)
@given(data=st.data())
def test_an_agent_on_any_budget_above_its_fixed_costs_builds_its_prompts(
    data: st.DataObject,
) -> None:
    minimum = _smallest_working_budget()
    max_tokens = data.draw(st.integers(min_value=minimum, max_value=200_000), label="max_tokens")
    config = AgentConfig(context=ContextConfig(max_tokens=max_tokens, counter="approx"))
    agent = AgentExecutor(ScriptedLLM([]), config=config)
    prompt = agent.context.build_prompt(tools=agent.offered_tools())
    assert prompt.total_tokens <= max_tokens - config.context.reserve_output_tokens


def test_the_strategy_names_are_spelled_alike_in_the_config_and_the_defaults() -> None:
    from typing import get_args

    from agent_flow._defaults import PRUNING_STRATEGIES
    from agent_flow.config import StrategyName

    assert get_args(StrategyName) == PRUNING_STRATEGIES
