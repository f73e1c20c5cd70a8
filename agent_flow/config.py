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

Environment variables override file values: ``AGENT_FLOW_<FIELD>`` for a top-level field and
``AGENT_FLOW_<SECTION>__<FIELD>`` for nested ones (``AGENT_FLOW_CONTEXT__MAX_TOKENS=16000``);
values of text fields are taken as written, others are parsed as TOML literals
(``30``, ``true``, ``["a", "b"]``). Errors name the
key, the file and what is wrong.
"""

from __future__ import annotations

import os
import tomllib
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Literal

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

from agent_flow._types import JsonObject, JsonValue
from agent_flow.errors import ConfigError
from agent_flow.llm.config import LLMConfig, LLMOverrides, resolve_llm_config
from agent_flow.tools._sandbox import ShellSettings
from agent_flow.tools.mcp_config import MCPServerHTTP, MCPServerStdio
from agent_flow.tools.policy import RiskLevel

__all__ = [
    "AgentConfig",
    "ContextConfig",
    "PolicyConfig",
    "Pricing",
    "Skill",
    "StrategyName",
    "load_config",
]

StrategyName = Literal["elide_then_drop", "drop_oldest", "sliding_window", "summarize"]


class ContextConfig(BaseModel):
    """How the prompt budget is spent (see `agent_flow.context.ContextManager`).

    Attributes:
        max_tokens: The hard budget of every prompt (the model's context window, or less).
        environment_allocation: The environment's share of what fixed costs leave.
        reserve_output_tokens: Tokens kept free for the answer.
        strategy: How history is pruned: elide old tool results then drop the oldest units,
            drop oldest only, a sliding window of turns, or summarize old units with the model.
        window_turns: Turns kept by ``sliding_window``.
        prune_target: Pruning shrinks history to this fraction of its budget.
        counter: ``tiktoken`` (exact, offline) or ``approx`` (characters / 4).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_tokens: int = Field(default=32_000, gt=0)
    environment_allocation: float = Field(default=0.3, ge=0.0, le=1.0)
    reserve_output_tokens: int = Field(default=2048, ge=0)
    strategy: StrategyName = "elide_then_drop"
    window_turns: int = Field(default=8, ge=1)
    prune_target: float = Field(default=0.8, gt=0.0, le=1.0)
    counter: Literal["tiktoken", "approx"] = "tiktoken"

    @model_validator(mode="after")
    def _reserve_fits(self) -> ContextConfig:
        if self.reserve_output_tokens >= self.max_tokens:
            raise ValueError(
                f"reserve_output_tokens ({self.reserve_output_tokens}) must be smaller than "
                f"max_tokens ({self.max_tokens})"
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
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(min_length=1)
    system_prompt: str
    allowed_tools: tuple[str, ...] = ()
    description: str = ""


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


class Pricing(BaseModel):
    """Prices in US dollars per million tokens, for the cost limit."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    input_per_million: float = Field(ge=0)
    output_per_million: float = Field(ge=0)

    def cost(self, prompt_tokens: int, completion_tokens: int) -> float:
        """The cost of this many tokens."""
        return (
            prompt_tokens * self.input_per_million + completion_tokens * self.output_per_million
        ) / 1_000_000


MCPServerEntry = Annotated[MCPServerStdio | MCPServerHTTP, Field(discriminator="kind")]


class AgentConfig(BaseModel):
    """Everything that defines an agent, validated.

    Attributes:
        name: The agent's name (in events and sessions).
        system_prompt: The system prompt template (``{environment}`` marks where the
            environment goes; ``{task}`` the current task line). Default: the library's.
        llm: An inline LLM config, or the name of one in `llms` / the config file.
        llm_overrides: The agent's own LLM settings, overriding the named config's.
        llms: Named LLM configs `llm` may refer to.
        context: The prompt budget.
        allow_tools: Only these tools (globs) are offered; ``None`` offers all.
        deny_tools: These tools (globs) are never offered.
        mcp_servers: MCP servers whose tools the agent gets.
        control_tools: Offer ``task_completion``, ``ask_question``, ``converse`` and
            ``update_plan``.
        max_iterations: Model calls per run before it stops.
        max_total_tokens: Prompt + completion tokens per run before it stops.
        max_cost_usd: Cost per run before it stops (needs `pricing`).
        pricing: Prices used for `max_cost_usd`.
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
        max_tool_output_tokens: Token limit of one tool result shown to the model.
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
    mcp_servers: tuple[MCPServerEntry, ...] = ()
    control_tools: bool = True
    max_iterations: int = Field(default=25, ge=1)
    max_total_tokens: int | None = Field(default=None, ge=1)
    max_cost_usd: float | None = Field(default=None, gt=0)
    pricing: Pricing | None = None
    output_schema: JsonObject | None = None
    max_output_retries: int = Field(default=2, ge=0)
    on_text_answer: Literal["finish", "reprompt"] = "finish"
    max_reprompts: int = Field(default=2, ge=0)
    stuck_threshold: int = Field(default=3, ge=2)
    model_retries: int = Field(default=1, ge=0)
    tool_timeout: float | None = Field(default=60.0, gt=0)
    max_tool_output_tokens: int | None = Field(default=4000, ge=16)
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
        if self.max_cost_usd is not None and self.pricing is None:
            raise ValueError("max_cost_usd needs pricing (input/output dollars per million)")
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


def _apply_env_overrides(data: dict[str, JsonValue], environ: Mapping[str, str]) -> None:
    for key, raw in environ.items():
        if not key.startswith("AGENT_FLOW_") or key == "AGENT_FLOW_HOME":
            continue
        path = [part.lower() for part in key.removeprefix("AGENT_FLOW_").split("__")]
        if not path[0] or path[0] not in AgentConfig.model_fields:
            continue
        target: dict[str, JsonValue] = data
        for part in path[:-1]:
            child = target.get(part)
            if not isinstance(child, dict):
                child = {}
                target[part] = child
            target = child
        target[path[-1]] = _parse_env_value(raw, path)


def _describe(err: ValidationError, source: str) -> str:
    problems = []
    for item in err.errors():
        where = ".".join(str(p) for p in item["loc"]) or "(top level)"
        problems.append(f"{where}: {item['msg']}")
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
            names the key and the file.
    """
    source = str(path) if path is not None else "defaults"
    data: dict[str, JsonValue] = {}
    if path is not None:
        try:
            with open(path, "rb") as handle:
                document = tomllib.load(handle)
        except FileNotFoundError as err:
            raise ConfigError(f"config file {source!r} does not exist") from err
        except tomllib.TOMLDecodeError as err:
            raise ConfigError(f"config file {source!r} is not valid TOML: {err}") from err
        unknown = sorted(set(document) - {"agent", "llms"})
        if unknown:
            raise ConfigError(
                f"unknown top-level table(s) {unknown} in {source}; expected [agent] and [llms.*]"
            )
        agent = document.get("agent", {})
        if not isinstance(agent, dict):
            raise ConfigError(f"[agent] in {source} must be a table")
        data = dict(agent)
        if "llms" in document:
            data["llms"] = document["llms"]
    _apply_env_overrides(data, os.environ if environ is None else environ)
    if overrides:
        data.update(overrides)
    try:
        return AgentConfig.model_validate(data)
    except ValidationError as err:
        raise ConfigError(_describe(err, source)) from err
