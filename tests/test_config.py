from __future__ import annotations

from pathlib import Path

import pytest

from agent_flow.config import AgentConfig, ContextConfig, Skill, load_config
from agent_flow.errors import ConfigError
from agent_flow.llm import LLMConfig

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
        ("[agent]\nmax_cost_usd = 1.0\n", "max_cost_usd needs pricing"),
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
