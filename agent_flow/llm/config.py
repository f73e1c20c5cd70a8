"""`LLMConfig`: which model to call and how, as validated data; and the override rule.

A configuration may name a reusable LLM setup (``[llms.fast]`` in a config file) that
several agents share. The rule (from the design this library follows): an agent's own
settings — model, temperature, max tokens, system prompt, ... — **override** the named
configuration's values; settings the agent leaves unset (``None``) keep the named values.
Without a named configuration the agent's settings stand alone and must at least name a
model. `resolve_llm_config` applies exactly that; `LLMConfig.with_overrides` is its core.

Secrets never live in a config: `api_key_env` names the environment variable that holds the
key, and the key is read only when a client is built. A key goes only where the config points:
``provider = "openai_compatible"`` (the default: "some other server") without a base URL is a
`ConfigError` when a client is built, never a silent fall-back to OpenAI's public endpoint
(`LLMConfig.resolved_base_url`); ``send_key = false`` sends no key at all (what a server does for
an endpoint its client chose).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Literal, TypeAlias

from pydantic import BaseModel, ConfigDict, Field, SecretStr

from agent_flow._types import JsonObject
from agent_flow.errors import ConfigError
from agent_flow.llm.base import ToolMode

__all__ = ["PROVIDER_DEFAULTS", "LLMConfig", "LLMOverrides", "Provider", "resolve_llm_config"]

#: Servers with known defaults; ``"openai_compatible"`` is any other server (give `base_url`).
Provider: TypeAlias = Literal[
    "openai",
    "azure",
    "gemini",
    "ollama",
    "vllm",
    "llamacpp",
    "lmstudio",
    "openai_compatible",
]

#: Per provider: (default base URL, default API-key environment variable).
PROVIDER_DEFAULTS: dict[str, tuple[str | None, str]] = {
    "openai": (None, "OPENAI_API_KEY"),
    "azure": (None, "AZURE_OPENAI_API_KEY"),
    "gemini": ("https://generativelanguage.googleapis.com/v1beta/openai/", "GEMINI_API_KEY"),
    "ollama": ("http://localhost:11434/v1", "OPENAI_API_KEY"),
    "vllm": ("http://localhost:8000/v1", "OPENAI_API_KEY"),
    "llamacpp": ("http://localhost:8080/v1", "OPENAI_API_KEY"),
    "lmstudio": ("http://localhost:1234/v1", "OPENAI_API_KEY"),
    "openai_compatible": (None, "OPENAI_API_KEY"),
}


class LLMConfig(BaseModel):
    """How to reach and call one model.

    Attributes:
        name: The id other configs refer to this one by (optional).
        provider: Which kind of server; fills in `base_url` / `api_key_env` defaults.
        model: The model name the server knows.
        base_url: The API root (default: the provider's, else ``OPENAI_BASE_URL``, else
            OpenAI's). Azure: ``https://<resource>.openai.azure.com/openai/v1/``.
        api_key_env: The environment variable holding the key (default per provider).
        organization: OpenAI organization id.
        project: OpenAI project id.
        headers: Extra HTTP headers.
        temperature: Sampling temperature.
        max_tokens: Limit on generated tokens per call.
        max_tokens_field: Body field for `max_tokens` (OpenAI reasoning models need
            ``"max_completion_tokens"``; default chosen per provider).
        timeout: Seconds one attempt at a model call may take in all (default 600).
        connect_timeout: Seconds to wait for a connection (default 10).
        first_byte_timeout: Seconds a streamed answer may take to start (default 120).
        chunk_timeout: Seconds a streamed answer may go silent between chunks (default 60).
        max_retries: Retries of failures that may pass (connection errors, timeouts, 429,
            5xx, cut streams), honouring ``Retry-After`` (default 2).
        stream: Stream answers (deltas arrive as they are generated).
        stream_usage: Ask streamed answers to report usage.
        tool_mode: ``"native"`` tool calling or ``"xml"`` in the prompt.
        tool_choice: ``tool_choice`` sent when tools are offered and a request sets none
            (``"auto"``; ``None`` or empty: send none).
        extra_body: Provider-specific request fields.
        system_prompt: A default system prompt agents using this config start from.
        models: More models the clients of `agent-flow serve` may choose on this endpoint
            (`model` is always allowed; a library user may call any).
        send_key: Send the key read from `api_key_env` (``False``: send none, for an endpoint
            that is not the operator's).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str | None = None
    provider: Provider = "openai_compatible"
    model: str = Field(min_length=1)
    base_url: str | None = None
    api_key_env: str | None = None
    organization: str | None = None
    project: str | None = None
    headers: dict[str, str] = Field(default_factory=dict)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    max_tokens: int | None = Field(default=None, ge=1)
    max_tokens_field: Literal["max_tokens", "max_completion_tokens"] | None = None
    timeout: float | None = Field(default=None, gt=0)
    connect_timeout: float | None = Field(default=None, gt=0)
    first_byte_timeout: float | None = Field(default=None, gt=0)
    chunk_timeout: float | None = Field(default=None, gt=0)
    max_retries: int | None = Field(default=None, ge=0)
    stream: bool = True
    stream_usage: bool = True
    tool_mode: ToolMode = "native"
    tool_choice: str | None = "auto"
    extra_body: JsonObject = Field(default_factory=dict)
    system_prompt: str | None = None
    models: tuple[str, ...] = ()
    send_key: bool = True

    def allowed_models(self) -> tuple[str, ...]:
        """The models a server's client may choose here: `model`, then `models`."""
        return (self.model, *(name for name in self.models if name != self.model))

    def resolved_base_url(self) -> str | None:
        """The base URL requests go to (``None``: OpenAI's own, for ``openai`` and ``azure``).

        Explicit, else the provider's default, else ``OPENAI_BASE_URL``; ``openai`` and
        ``azure`` may leave it to the SDK.

        Raises:
            ConfigError: ``provider = "openai_compatible"`` and no base URL anywhere: the
                request (and its key) would otherwise go to OpenAI's public endpoint.
        """
        url = self.base_url or PROVIDER_DEFAULTS[self.provider][0]
        url = url or os.environ.get("OPENAI_BASE_URL") or None
        if url is None and self.provider == "openai_compatible":
            raise ConfigError(
                f"model {self.model!r} has provider 'openai_compatible' but no base_url, so its "
                "requests and key would go to OpenAI's public endpoint; set base_url (--base-url "
                "URL, or OPENAI_BASE_URL), or set provider = 'openai' (--provider openai) to call "
                "OpenAI"
            )
        return url

    def resolved_api_key_env(self) -> str:
        """The environment variable the key is read from."""
        return self.api_key_env or PROVIDER_DEFAULTS[self.provider][1]

    def resolved_max_tokens_field(self) -> Literal["max_tokens", "max_completion_tokens"]:
        """The body field for `max_tokens`.

        Explicit, else OpenAI's current one for OpenAI and Azure, else the widely supported
        ``"max_tokens"``.
        """
        if self.max_tokens_field is not None:
            return self.max_tokens_field
        return "max_completion_tokens" if self.provider in ("openai", "azure") else "max_tokens"

    def read_api_key(self) -> SecretStr | None:
        """Read the API key from its environment variable (``None`` when unset)."""
        value = os.environ.get(self.resolved_api_key_env())
        return SecretStr(value) if value else None

    def with_overrides(self, overrides: LLMOverrides | None = None) -> LLMConfig:
        """Return this config with an agent's own settings applied on top.

        Every override that is set (not ``None``) wins; unset ones keep this config's value.
        ``headers`` and ``extra_body`` are merged key by key, the override's keys winning.

        Args:
            overrides: The agent's settings.

        Raises:
            ConfigError: The result is invalid (e.g. a temperature out of range).
        """
        if overrides is None:
            return self
        changes = {
            key: value
            for key, value in overrides.model_dump(exclude_none=True).items()
            if key not in ("headers", "extra_body")
        }
        if overrides.headers:
            changes["headers"] = {**self.headers, **overrides.headers}
        if overrides.extra_body:
            changes["extra_body"] = {**self.extra_body, **overrides.extra_body}
        if not changes:
            return self
        data = {**self.model_dump(), **changes}
        try:
            return LLMConfig.model_validate(data)
        except ValueError as err:
            raise ConfigError(f"the LLM settings are invalid after overrides: {err}") from err


class LLMOverrides(BaseModel):
    """An agent's own LLM settings; each one set here overrides the named `LLMConfig`.

    Every field mirrors `LLMConfig`'s and defaults to ``None`` (keep the named value).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    provider: Provider | None = None
    model: str | None = Field(default=None, min_length=1)
    base_url: str | None = None
    api_key_env: str | None = None
    organization: str | None = None
    project: str | None = None
    headers: dict[str, str] | None = None
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    max_tokens: int | None = Field(default=None, ge=1)
    max_tokens_field: Literal["max_tokens", "max_completion_tokens"] | None = None
    timeout: float | None = Field(default=None, gt=0)
    connect_timeout: float | None = Field(default=None, gt=0)
    first_byte_timeout: float | None = Field(default=None, gt=0)
    chunk_timeout: float | None = Field(default=None, gt=0)
    max_retries: int | None = Field(default=None, ge=0)
    stream: bool | None = None
    stream_usage: bool | None = None
    tool_mode: ToolMode | None = None
    tool_choice: str | None = None
    extra_body: JsonObject | None = None
    system_prompt: str | None = None
    models: tuple[str, ...] | None = None
    send_key: bool | None = None


def resolve_llm_config(
    *,
    named: Mapping[str, LLMConfig] | None = None,
    ref: str | None = None,
    overrides: LLMOverrides | None = None,
) -> LLMConfig:
    """Apply the override rule: the referenced config, with the agent's own settings on top.

    Args:
        named: The named LLM configs available (e.g. a config file's ``[llms.*]`` tables).
        ref: The name the agent refers to, or ``None`` for none.
        overrides: The agent's own settings.

    Returns:
        The config to build the client from.

    Raises:
        ConfigError: `ref` names no config (the message lists the known names), or there is
            no reference and the agent's settings name no model.
    """
    if ref is not None:
        configs = named or {}
        if ref not in configs:
            known = ", ".join(sorted(configs)) or "none are defined"
            raise ConfigError(f"no LLM config is named {ref!r} (known: {known}); fix the reference")
        return configs[ref].with_overrides(overrides)
    settings = overrides.model_dump(exclude_none=True) if overrides is not None else {}
    if "model" not in settings:
        raise ConfigError(
            "no model is configured: set the agent's model or refer to a named LLM config"
        )
    try:
        return LLMConfig.model_validate(settings)
    except ValueError as err:
        raise ConfigError(f"the LLM settings are invalid: {err}") from err
