"""``AGENT_FLOW_*`` overrides: a bad value names its variable, a misspelt one is warned about."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent_flow.config import (
    OTHER_VARIABLES,
    AgentConfig,
    ConfigWarning,
    _is_config_path,
    load_config,
)
from agent_flow.errors import ConfigError


def test_a_bad_value_names_the_variable_not_the_defaults() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(environ={"AGENT_FLOW_MAX_ITERATIONS": "lots"})
    message = str(info.value)
    assert message.startswith(
        "invalid agent config from the environment: AGENT_FLOW_MAX_ITERATIONS (sets "
        "max_iterations): Input should be a valid integer"
    )
    assert message.endswith("; fix or unset the variable")
    assert "defaults" not in message


def test_a_section_that_fails_as_a_whole_names_the_variable_that_broke_it() -> None:
    with pytest.raises(ConfigError, match="AGENT_FLOW_CONTEXT__RESERVE_OUTPUT_TOKENS"):
        load_config(environ={"AGENT_FLOW_CONTEXT__RESERVE_OUTPUT_TOKENS": "999999"})


def test_a_bad_file_value_still_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "agent.toml"
    path.write_text("[agent]\nmax_iterations = 0\n")
    with pytest.raises(ConfigError) as info:
        load_config(path, environ={"AGENT_FLOW_NAME": "fine"})
    assert f"invalid agent config in {path}: max_iterations" in str(info.value)


def test_an_explicit_override_is_not_blamed_on_a_variable() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(environ={"AGENT_FLOW_MAX_ITERATIONS": "5"}, overrides={"max_iterations": 0})
    assert "AGENT_FLOW_MAX_ITERATIONS" not in str(info.value)


@pytest.mark.parametrize(
    ("variable", "suggestion"),
    [
        ("AGENT_FLOW_MAX_ITERATINS", "AGENT_FLOW_MAX_ITERATIONS"),
        ("AGENT_FLOW_CONTEXT__MAX_TOKEN", "AGENT_FLOW_CONTEXT__MAX_TOKENS"),
        ("AGENT_FLOW_POLICY__AUTO_APROVE", "AGENT_FLOW_POLICY__AUTO_APPROVE"),
        ("AGENT_FLOW_LLMS__LOCAL__MODLE", "AGENT_FLOW_LLMS__LOCAL__MODEL"),
    ],
)
def test_a_misspelt_variable_is_ignored_with_a_warning_suggesting_the_field(
    variable: str, suggestion: str
) -> None:
    with pytest.warns(ConfigWarning) as caught:
        config = load_config(environ={variable: "3"})
    assert str(caught[0].message) == (
        f"{variable} is ignored: it names no agent config field; did you mean {suggestion}?"
    )
    assert config == AgentConfig()


def test_a_variable_far_from_any_field_is_warned_about_without_a_guess() -> None:
    with pytest.warns(ConfigWarning, match="AGENT_FLOW_COLOUR is ignored.*see AgentConfig"):
        load_config(environ={"AGENT_FLOW_COLOUR": "blue"})


def test_variables_read_elsewhere_and_the_tests_own_are_not_warned_about() -> None:
    environ = dict.fromkeys(OTHER_VARIABLES, "x") | {"AGENT_FLOW_TEST_POSTGRES": "dsn"}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert load_config(environ=environ) == AgentConfig()


def test_fields_inside_named_llm_configs_are_real_overrides() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        config = load_config(
            environ={"AGENT_FLOW_LLMS__LOCAL__MODEL": "qwen", "AGENT_FLOW_LLM": "local"}
        )
    assert config.resolved_llm().model == "qwen"


FIELDS = sorted(AgentConfig.model_fields)


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(FIELDS), st.text(alphabet="ABCDEFGHIJKLMNOPQRSTUVWXYZ_", max_size=12))
def test_every_variable_either_overrides_a_field_or_warns(field: str, extra: str) -> None:
    """No AGENT_FLOW_* variable is silently ignored (outside the documented others)."""
    variable = f"AGENT_FLOW_{field.upper()}{extra}"
    path = variable.removeprefix("AGENT_FLOW_").lower().split("__")
    real = all(path) and _is_config_path(path)
    error = ""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            load_config(environ={variable: "1"})
        except ConfigError as err:
            error = str(err)
    if error:  # an override that was applied, and is named
        assert real and variable in error
    warned = [str(w.message) for w in caught if issubclass(w.category, ConfigWarning)]
    if real:
        assert warned == []
    else:
        assert len(warned) == 1 and warned[0].startswith(f"{variable} is ignored")
