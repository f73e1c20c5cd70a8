"""Agent configuration: `AgentConfig` and its parts, validated, loadable from TOML.

A TOML file holds named LLM configs and one agent::

    [llms.local]
    provider = "ollama"
    model = "qwen2.5-coder"

    [agent]
    name = "coder"
    llm = "local"                  # a named config; or an inline [agent.llm] table
    max_iterations = 30
    [agent.llm_overrides]          # the agent's own settings win over the named config
    temperature = 0.1
    [agent.context]
    max_tokens = 32000

    [store]                        # where sessions are kept (`load_store_config`)
    url = "postgresql://agents@db.internal/agents"   # or a file path; default: the SQLite file

Environment variables override file values: ``AGENT_FLOW_<FIELD>`` for a top-level field and
``AGENT_FLOW_<SECTION>__<FIELD>`` for nested ones (``AGENT_FLOW_CONTEXT__MAX_TOKENS=16000``);
values of text fields are taken as written, others are parsed as TOML literals
(``30``, ``true``, ``["a", "b"]``). Errors name the
key, the file (or the variable) and what is wrong. An ``AGENT_FLOW_*`` variable that names no
config field is ignored with a `ConfigWarning` (suggesting the field it may have meant);
`OTHER_VARIABLES` lists the ones read elsewhere.
"""

from __future__ import annotations

import difflib
import os
import tomllib
import types
import typing
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

import jsonschema
import jsonschema.exceptions
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from agent_flow._defaults import (
    DEFAULT_ENVIRONMENT_ALLOCATION,
    DEFAULT_ENVIRONMENT_PLACEMENT,
    DEFAULT_MAX_ITERATIONS,
    DEFAULT_MAX_TOKENS,
    DEFAULT_MAX_TOOL_CALLS_PER_TURN,
    DEFAULT_MAX_TOOL_OUTPUT_TOKENS,
    DEFAULT_PRUNE_TARGET,
    DEFAULT_SYSTEM_PROMPT_TEMPLATE,
    DEFAULT_TOOL_TIMEOUT,
    DEFAULT_WINDOW_TURNS,
    MIN_OUTPUT_TOKENS,
    default_reserve_output_tokens,
)
from agent_flow._prompt_environment import EnvironmentPlacement
from agent_flow._toml_file import read_toml
from agent_flow._types import JsonObject, JsonValue
from agent_flow.errors import ConfigError
from agent_flow.llm.config import LLMConfig, LLMOverrides, resolve_llm_config
from agent_flow.pricing import Pricing
from agent_flow.tools._sandbox import ShellSettings
from agent_flow.tools.mcp_config import MCPAgentSettings, MCPPromptRef, MCPServerConfig
from agent_flow.tools.policy import RiskLevel

__all__ = [
    "OTHER_VARIABLES",
    "AgentConfig",
    "ConfigWarning",
    "ContextConfig",
    "PolicyConfig",
    "Pricing",
    "Skill",
    "StoreConfig",
    "StrategyName",
    "load_config",
    "load_store_config",
]

StrategyName = Literal["elide_then_drop", "drop_oldest", "sliding_window", "summarize"]


class ContextConfig(BaseModel):
    """How the prompt budget is spent (see `agent_flow.context.ContextManager`).

    Attributes:
        max_tokens: The hard budget of every prompt (the model's context window, or less).
        environment_allocation: The environment's share of what fixed costs leave.
        reserve_output_tokens: Tokens kept free for the answer. Unset: 2,048, or a quarter of
            `max_tokens` when that is less (so a small budget works without it); when set, it
            must be smaller than `max_tokens`.
        strategy: How history is pruned: elide old tool results then drop the oldest units,
            drop oldest only, a sliding window of turns, or summarize old units with the model.
        window_turns: Turns kept by ``sliding_window``.
        prune_target: Pruning shrinks history to this fraction of its budget.
        counter: ``tiktoken`` (exact, offline) or ``approx`` (characters / 4).
        environment_placement: Where the rendered environment goes: ``system``, at the
            system prompt's ``{environment}``; ``last``, in a system message of its own after
            the history, so that a provider's prompt cache serves the system message and the
            history before the newest step (README: "Where the environment goes: prompt
            caches").
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_tokens: int = Field(default=DEFAULT_MAX_TOKENS, gt=0)
    environment_allocation: float = Field(default=DEFAULT_ENVIRONMENT_ALLOCATION, ge=0.0, le=1.0)
    # Declared after max_tokens: the default is computed from its validated value.
    reserve_output_tokens: int = Field(
        default_factory=lambda data: default_reserve_output_tokens(data["max_tokens"]), ge=0
    )
    strategy: StrategyName = "elide_then_drop"
    window_turns: int = Field(default=DEFAULT_WINDOW_TURNS, ge=1)
    prune_target: float = Field(default=DEFAULT_PRUNE_TARGET, gt=0.0, le=1.0)
    counter: Literal["tiktoken", "approx"] = "tiktoken"
    environment_placement: EnvironmentPlacement = DEFAULT_ENVIRONMENT_PLACEMENT

    @model_validator(mode="after")
    def _reserve_fits(self) -> ContextConfig:
        if self.reserve_output_tokens >= self.max_tokens:
            raise ValueError(
                f"reserve_output_tokens ({self.reserve_output_tokens}) must be smaller than "
                f"max_tokens ({self.max_tokens}); lower it, or leave it unset for "
                f"{default_reserve_output_tokens(self.max_tokens)}"
            )
        return self


class Skill(BaseModel):
    """A named mode of the agent: its own system prompt and the tools it may use.

    Attributes:
        name: How the skill is activated.
        system_prompt: Replaces the agent's system prompt while active.
        allowed_tools: Tool names (globs) offered and callable while active; the loop-control
            tools stay available.
        description: What the skill is for.
        mcp_prompt: An MCP server's prompt whose text is the system prompt instead, fetched
            when the agent starts (give it or `system_prompt`, not both).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(min_length=1)
    system_prompt: str = ""
    allowed_tools: tuple[str, ...] = ()
    description: str = ""
    mcp_prompt: MCPPromptRef | None = None

    @model_validator(mode="after")
    def _one_prompt(self) -> Skill:
        if (self.mcp_prompt is None) == (not self.system_prompt):
            raise ValueError(
                f"skill {self.name!r} needs a system_prompt or an mcp_prompt (not both)"
            )
        return self


class PolicyConfig(BaseModel):
    """Tool policy settings (see `agent_flow.tools.PolicyEngine`).

    Attributes:
        auto_approve: Approve every call that would need approval (trusted runs only).
        read_only: Refuse every tool not marked read-only.
        approval_tools: Tools (globs) that always need approval.
        approval_risk: Tools at or above this risk need approval.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    auto_approve: bool = False
    read_only: bool = False
    approval_tools: tuple[str, ...] = ()
    approval_risk: RiskLevel | None = RiskLevel.HIGH


class AgentConfig(BaseModel):
    """Everything that defines an agent, validated.

    Attributes:
        name: The agent's name (in events and sessions).
        system_prompt: The system prompt template (``{environment}`` marks where the
            environment goes, appended when absent; ``{task}`` a "Current task: ..." line
            naming the task's objective). The first set of: this, the resolved LLM config's
            ``system_prompt`` (its ``llm_overrides`` included), the library's default
            (`resolved_system_prompt`).
        llm: An inline LLM config, or the name of one in `llms` / the config file.
        llm_overrides: The agent's own LLM settings, overriding the named config's.
        llms: Named LLM configs `llm` may refer to.
        context: The prompt budget.
        allow_tools: Only these tools (globs) are offered; ``None`` offers all.
        deny_tools: Denied tools (``fnmatch`` globs on the registered name, e.g. ``fs_*``
            for an MCP server's): never offered to the model, and refused if it calls one
            anyway, even a loop-control tool. The tool executor built from this config
            refuses them in its `PolicyEngine` (``denied_tools``), and the agent hides the
            tools its executor's policy denies as well: one list, both effects.
        mcp_servers: MCP servers whose tools the agent gets: ``async with AgentExecutor(...)``
            starts them and registers their tools as ``<server>_<tool>``, and leaving the
            block stops them.
        mcp: How this agent uses MCP servers (its own or shared ones): which servers and
            components it may use, the resource tools, resources loaded at start; see
            `agent_flow.tools.MCPAgentSettings`.
        control_tools: Offer ``task_completion``, ``ask_question``, ``converse`` and
            ``update_plan``.
        max_iterations: Model calls per run before it stops.
        max_tool_calls_per_turn: Tool calls of one answer that run; the rest get an error
            result saying so, which the model reads.
        max_total_tokens: Prompt + completion tokens per run before it stops.
        max_cost_usd: Cost per run, in US dollars. Every model call, the summarizer's
            included, is checked before it is made against its worst case: its counted prompt
            and the whole output allowance it sends (``max_tokens``), priced as the model
            asked for. A call that could take the run past the limit is not made, and the run
            stops with ``cost_limit``. Only a server that bills more than it was asked can
            pass the limit, and only by that one call's excess: one that counts more prompt
            tokens than agent_flow's counter, answers as a pricier model, or writes past
            ``max_tokens``. Such a call is reported (``warning_raised``, source ``cost``), and
            later calls to that model are estimated as it billed. A failed attempt the
            provider bills without reporting usage (a stream cut mid-answer, then retried) is
            not counted. The model must be priced (genai-prices knows it, or `pricing` is
            set): with a limit set, a call to a model with no known price is refused with a
            `ConfigError`, ending the run with an error rather than running unlimited.
        pricing: Prices overriding genai-prices' data for this agent's model calls.
        output_schema: A JSON schema the final answer must match (JSON text).
        max_output_retries: Corrections asked for before a bad final answer ends the run.
        on_text_answer: What an answer without tool calls does: ``finish`` the run, or
            ``reprompt`` the model to use its tools or call ``task_completion``.
        max_reprompts: Reminders before a text answer finishes the run anyway.
        stuck_threshold: Identical calls with identical results in a row before the model is
            warned; twice as many stop the run.
        model_retries: Extra attempts after a retryable model failure the SDK could not
            retry (a stream cut mid-answer).
        tool_timeout: Seconds a tool call may run by default.
        max_tool_output_tokens: Token limit of one tool result shown to the model (at least
            `agent_flow.tools.MIN_OUTPUT_TOKENS`, 32; ``None``: no limit).
        skills: Named modes; see `Skill`.
        policy: Tool policy settings.
        workspace: A directory the built-in file tools work in (``None``: no file tools).
        shell: How ``run_command`` runs commands: the environment variables they inherit,
            and their confinement (see `agent_flow.tools.ShellSettings`).
        secret_env: Environment variables whose values are redacted from every tool result,
            besides the model's key variable and every variable whose name looks secret
            (``*API_KEY*``, ``*TOKEN*``, ``*SECRET*``, ``*PASSWORD*``, ...).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(default="agent", min_length=1)
    system_prompt: str | None = None
    llm: LLMConfig | str | None = None
    llm_overrides: LLMOverrides | None = None
    llms: dict[str, LLMConfig] = Field(default_factory=dict)
    context: ContextConfig = Field(default_factory=ContextConfig)
    allow_tools: tuple[str, ...] | None = None
    deny_tools: tuple[str, ...] = ()
    mcp_servers: tuple[MCPServerConfig, ...] = ()
    mcp: MCPAgentSettings = Field(default_factory=MCPAgentSettings)
    control_tools: bool = True
    max_iterations: int = Field(default=DEFAULT_MAX_ITERATIONS, ge=1)
    max_tool_calls_per_turn: int = Field(default=DEFAULT_MAX_TOOL_CALLS_PER_TURN, ge=1)
    max_total_tokens: int | None = Field(default=None, ge=1)
    max_cost_usd: float | None = Field(default=None, gt=0)
    pricing: Pricing | None = None
    output_schema: JsonObject | None = None
    max_output_retries: int = Field(default=2, ge=0)
    on_text_answer: Literal["finish", "reprompt"] = "finish"
    max_reprompts: int = Field(default=2, ge=0)
    stuck_threshold: int = Field(default=3, ge=2)
    model_retries: int = Field(default=1, ge=0)
    tool_timeout: float | None = Field(default=DEFAULT_TOOL_TIMEOUT, gt=0)
    max_tool_output_tokens: int | None = Field(
        default=DEFAULT_MAX_TOOL_OUTPUT_TOKENS, ge=MIN_OUTPUT_TOKENS
    )
    skills: tuple[Skill, ...] = ()
    policy: PolicyConfig = Field(default_factory=PolicyConfig)
    workspace: str | None = None
    shell: ShellSettings = Field(default_factory=ShellSettings)
    secret_env: tuple[str, ...] = ()

    @field_validator("output_schema")
    @classmethod
    def _valid_schema(cls, schema: JsonObject | None) -> JsonObject | None:
        if schema is not None:
            try:
                jsonschema.Draft202012Validator.check_schema(schema)
            except jsonschema.exceptions.SchemaError as err:
                raise ValueError(f"not a valid JSON schema: {err.message}") from err
        return schema

    @model_validator(mode="after")
    def _consistent(self) -> AgentConfig:
        names = [skill.name for skill in self.skills]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"skill names must be unique; repeated: {duplicates}")
        if isinstance(self.llm, str) and self.llm not in self.llms:
            raise ValueError(
                f"llm refers to {self.llm!r}, which is not among the named configs "
                f"{sorted(self.llms)}; define it in an [llms.{self.llm}] table"
            )
        return self

    def resolved_llm(self) -> LLMConfig:
        """The LLM config this agent uses: the named or inline one, with its overrides.

        Raises:
            ConfigError: No model is configured, or the reference names no config.
        """
        if isinstance(self.llm, LLMConfig):
            return self.llm.with_overrides(self.llm_overrides)
        return resolve_llm_config(named=self.llms, ref=self.llm, overrides=self.llm_overrides)

    def resolved_system_prompt(self) -> str:
        """The system prompt template this agent starts from.

        The precedence: the agent's own `system_prompt`; else the ``system_prompt`` of its
        LLM config (after ``llm_overrides``, which may set one even without a model); else
        the library's `DEFAULT_SYSTEM_PROMPT_TEMPLATE`. An empty prompt counts as unset.
        """
        if self.system_prompt:
            return self.system_prompt
        from_llm: str | None = None
        if self.llm is not None:
            try:
                from_llm = self.resolved_llm().system_prompt
            except ConfigError:
                from_llm = None
        if not from_llm and self.llm_overrides is not None:
            from_llm = self.llm_overrides.system_prompt
        return from_llm or DEFAULT_SYSTEM_PROMPT_TEMPLATE

    def skill(self, name: str) -> Skill:
        """Return the skill called `name`.

        Raises:
            ConfigError: No skill has that name.
        """
        for skill in self.skills:
            if skill.name == name:
                return skill
        raise ConfigError(
            f"no skill named {name!r}; defined: {', '.join(s.name for s in self.skills) or '-'}"
        )


def _is_text_field(path: list[str]) -> bool:
    """Whether `path` names a field whose values are plain text (kept as written)."""
    model: type[BaseModel] | None = AgentConfig
    annotation: object = None
    for part in path:
        if model is None or part not in model.model_fields:
            return False
        annotation = model.model_fields[part].annotation
        nested = [a for a in typing.get_args(annotation) or (annotation,) if isinstance(a, type)]
        model = next((a for a in nested if issubclass(a, BaseModel)), None)
    return annotation in (str, str | None)


def _parse_env_value(raw: str, path: list[str]) -> JsonValue:
    if _is_text_field(path):
        return raw
    try:
        value: JsonValue = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        return raw
    return value


#: ``AGENT_FLOW_*`` variables that are not config overrides (read elsewhere); never warned
#: about. Variables starting with ``AGENT_FLOW_TEST_`` are the test suite's own.
OTHER_VARIABLES = frozenset({"AGENT_FLOW_HOME", "AGENT_FLOW_SERVER_TOKEN"})

_PREFIX = "AGENT_FLOW_"
_UNIONS = (typing.Union, types.UnionType)


class ConfigWarning(UserWarning):
    """An ``AGENT_FLOW_*`` environment variable names no config field, so it is ignored."""


def _nested(annotation: object) -> tuple[type[BaseModel] | None, bool]:
    """The model a field holds (directly or as a dict's values), and whether via a dict."""
    options = typing.get_args(annotation) if typing.get_origin(annotation) in _UNIONS else ()
    for option in options or (annotation,):
        if typing.get_origin(option) is dict:
            value = typing.get_args(option)[-1]
            if isinstance(value, type) and issubclass(value, BaseModel):
                return value, True
        elif isinstance(option, type) and issubclass(option, BaseModel):
            return option, False
    return None, False


def _is_config_path(path: list[str]) -> bool:
    """Whether `path` names a field of `AgentConfig` (dict keys such as llm names included)."""
    model: type[BaseModel] | None = AgentConfig
    index = 0
    while index < len(path):
        if model is None or path[index] not in model.model_fields:
            return False
        model, keyed = _nested(model.model_fields[path[index]].annotation)
        index += 2 if keyed and index + 1 < len(path) else 1
    return True


def _variable_names(key: str) -> list[str]:
    """Every field as its variable, one level deep, for matching a misspelt `key` against.

    Fields inside a dict (``AGENT_FLOW_LLMS__<NAME>__MODEL``) use the name `key` gives.
    """
    parts = key.removeprefix(_PREFIX).split("__")
    names = []
    for name, field in AgentConfig.model_fields.items():
        names.append(f"{_PREFIX}{name.upper()}")
        model, keyed = _nested(field.annotation)
        if model is None:
            continue
        if not keyed:
            names.extend(f"{_PREFIX}{name.upper()}__{sub.upper()}" for sub in model.model_fields)
        elif len(parts) == 3 and parts[0].lower() == name:
            names.extend(
                f"{_PREFIX}{name.upper()}__{parts[1]}__{sub.upper()}" for sub in model.model_fields
            )
    return names


def _unknown_variable(key: str) -> None:
    close = difflib.get_close_matches(key, _variable_names(key), n=1, cutoff=0.8)
    hint = f"; did you mean {close[0]}?" if close else "; see AgentConfig for the fields"
    warnings.warn(
        f"{key} is ignored: it names no agent config field{hint}",
        ConfigWarning,
        stacklevel=4,
    )


def _apply_env_overrides(
    data: dict[str, JsonValue], environ: Mapping[str, str]
) -> dict[tuple[str, ...], str]:
    """Apply the ``AGENT_FLOW_*`` overrides; return which variable set each field path."""
    sources: dict[tuple[str, ...], str] = {}
    for key, raw in sorted(environ.items()):
        if not key.startswith(_PREFIX) or key in OTHER_VARIABLES:
            continue
        if key.startswith(f"{_PREFIX}TEST_"):
            continue
        path = [part.lower() for part in key.removeprefix(_PREFIX).split("__")]
        if not all(path) or not _is_config_path(path):
            _unknown_variable(key)
            continue
        target: dict[str, JsonValue] = data
        for part in path[:-1]:
            child = target.get(part)
            if not isinstance(child, dict):
                child = {}
                target[part] = child
            target = child
        target[path[-1]] = _parse_env_value(raw, path)
        sources[tuple(path)] = key
    return sources


def _describe(
    err: ValidationError, source: str, variables: Mapping[tuple[str, ...], str] | None = None
) -> str:
    """One message for every problem, naming the variable that set a field where one did."""
    environ = variables or {}
    problems = []
    from_variables = 0
    for item in err.errors():
        if item["type"] == "default_factory_not_called":
            # A default computed from a field that failed: that field's error says it all.
            continue
        loc = tuple(str(p) for p in item["loc"])
        where = ".".join(loc) or "(top level)"
        # A variable set this field (or a part of it: a union's member), or a field inside
        # a section that failed as a whole.
        names = [
            name
            for path, name in environ.items()
            if path[: len(loc)] == loc or loc[: len(path)] == path
        ]
        if names:
            from_variables += 1
            where = f"{' and '.join(sorted(names))} (sets {where})"
        problems.append(f"{where}: {item['msg']}")
    if problems and from_variables == len(problems):
        return (
            "invalid agent config from the environment: "
            + "; ".join(problems)
            + "; fix or unset the variable"
        )
    return f"invalid agent config in {source}: " + "; ".join(problems)


def load_config(
    path: str | Path | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    overrides: Mapping[str, JsonValue] | None = None,
) -> AgentConfig:
    """Load an `AgentConfig` from a TOML file, then environment variables, then `overrides`.

    Args:
        path: The TOML file (``None``: defaults plus environment variables only).
        environ: The environment to read ``AGENT_FLOW_*`` variables from (default: the
            process environment).
        overrides: Top-level fields that win over everything (e.g. from command-line flags).

    Raises:
        ConfigError: The file is missing or not TOML, or a value is invalid; the message
            names the key and the file, or the ``AGENT_FLOW_*`` variable that set it.

    Warns:
        ConfigWarning: An ``AGENT_FLOW_*`` variable names no config field (it is ignored).
    """
    source = str(path) if path is not None else "defaults"
    data: dict[str, JsonValue] = {}
    if path is not None:
        document = read_toml(path)
        unknown = sorted(set(document) - {"agent", "llms", "store", "durable"})
        if unknown:
            raise ConfigError(
                f"unknown top-level table(s) {unknown} in {source}; expected [agent], [llms.*], "
                "[store] and [durable]"
            )
        agent = document.get("agent", {})
        if not isinstance(agent, dict):
            raise ConfigError(f"[agent] in {source} must be a table")
        data = dict(agent)
        if "llms" in document:
            data["llms"] = document["llms"]
    variables = _apply_env_overrides(data, os.environ if environ is None else environ)
    if overrides:
        data.update(overrides)
        variables = {path: name for path, name in variables.items() if path[0] not in overrides}
    try:
        return AgentConfig.model_validate(data)
    except ValidationError as err:
        raise ConfigError(_describe(err, source, variables)) from err


class StoreConfig(BaseModel):
    """The ``[store]`` table: where sessions are kept.

    Attributes:
        url: A file path or ``sqlite:///path`` (SQLite), ``postgresql://user@host/database``
            (PostgreSQL; ``?schema=name`` picks the schema), or ``memory://``; None for the
            default SQLite file. `agent_flow.sessions.open_store` opens it.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    url: str | None = Field(default=None, min_length=1)


def load_store_config(path: str | Path | None) -> StoreConfig:
    """Read the ``[store]`` table of a TOML config file (defaults when `path` is None or no table).

    Raises:
        ConfigError: The file is missing or not TOML, or ``[store]`` is not a valid table; the
            message names the key and the file.
    """
    if path is None:
        return StoreConfig()
    source = str(path)
    document = read_toml(path)
    table = document.get("store", {})
    if not isinstance(table, dict):
        raise ConfigError(f'[store] in {source} must be a table, with url = "..."')
    try:
        return StoreConfig.model_validate(table)
    except ValidationError as err:
        item = err.errors()[0]
        where = ".".join(str(part) for part in item["loc"])
        raise ConfigError(f"invalid [store] {where} in {source}: {item['msg']}") from err
