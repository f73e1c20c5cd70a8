"""Which model endpoint a session's runs call, and with whose key.

The server's keys belong to the operator's configuration. A key goes only to the endpoint the
operator configured it for:

- The operator's endpoints are the agent config's own model (named ``default`` unless the
  config refers to a named one) and every ``[llms.NAME]`` table. A client picks one by name
  (``"llm"``) and a model from that endpoint's allowed list (`LLMConfig.allowed_models`: its
  ``model`` and its ``models``). The endpoint's URL, key variable, organization, project and
  headers are the operator's and nothing a client sends changes them.
- A client's own endpoint (``"base_url"``) is refused unless the operator allows client
  endpoints (`ServerSettings.allow_client_endpoints`); such a session then sends no key at all
  (``send_key = false``), nor the operator's headers or extra body fields.

Every refusal is an `ApiError` 422 with the documented codes ``unknown_llm``,
``model_not_allowed``, ``client_endpoint_not_allowed`` and ``invalid_option``.
"""

from __future__ import annotations

import contextlib
from typing import Any

from pydantic import BaseModel, Field

from agent_flow.config import AgentConfig
from agent_flow.errors import AgentFlowError
from agent_flow.llm.config import LLMConfig, LLMOverrides
from agent_flow.server._errors import ApiError
from agent_flow.server.models import SessionOptions

__all__ = [
    "DEFAULT_ENDPOINT",
    "EndpointList",
    "EndpointView",
    "endpoints",
    "operator_endpoints",
    "session_llm",
]

#: The name of the agent config's own model when it does not refer to a named one.
DEFAULT_ENDPOINT = "default"
#: What only the operator says about an endpoint: where it is, and what goes with its key.
_OPERATOR_FIELDS = (
    "provider",
    "base_url",
    "api_key_env",
    "organization",
    "project",
    "headers",
    "extra_body",
    "send_key",
    "models",
)


class EndpointView(BaseModel):
    """A model endpoint a session may choose (``GET /endpoints``)."""

    name: str = Field(description="What a session names in its `llm` option.")
    models: list[str] = Field(description="The models a session may choose; the first is used.")
    default: bool = Field(description="Whether a session without an `llm` option uses it.")


class EndpointList(BaseModel):
    """The endpoints a session may choose, and whether a client may bring its own."""

    endpoints: list[EndpointView]
    client_endpoints: bool = Field(
        description="Whether a session may name its own `base_url` (it then sends no key)."
    )


def _default_name(config: AgentConfig) -> str:
    return config.llm if isinstance(config.llm, str) else DEFAULT_ENDPOINT


def operator_endpoints(config: AgentConfig) -> dict[str, LLMConfig]:
    """Every endpoint the operator configured, by name (the agent's own first)."""
    found: dict[str, LLMConfig] = {}
    # Without a model of the agent's own, only the named tables are offered.
    with contextlib.suppress(AgentFlowError):
        found[_default_name(config)] = config.resolved_llm()
    for name, llm in config.llms.items():
        found.setdefault(name, llm)
    return found


def endpoints(config: AgentConfig, *, client_endpoints: bool) -> EndpointList:
    """What ``GET /endpoints`` answers: names and allowed models, never URLs or keys."""
    default = _default_name(config)
    return EndpointList(
        endpoints=[
            EndpointView(name=name, models=list(llm.allowed_models()), default=name == default)
            for name, llm in operator_endpoints(config).items()
        ],
        client_endpoints=client_endpoints,
    )


def session_llm(
    config: AgentConfig, options: SessionOptions, *, client_endpoints: bool
) -> LLMConfig | None:
    """The model a session with `options` calls (None: the config's own, unchanged).

    Raises:
        ApiError: 422 for an unknown endpoint, a model outside its allowed list, or a client
            endpoint the server does not allow.
    """
    if options.base_url is not None:
        return _client_endpoint(config, options, allowed=client_endpoints)
    if options.llm is None and options.model is None:
        return None
    known = operator_endpoints(config)
    name = options.llm if options.llm is not None else _default_name(config)
    endpoint = known.get(name)
    if endpoint is None:
        names = ", ".join(sorted(known)) or "none"
        raise ApiError(
            422,
            "unknown_llm",
            f"no model endpoint is named {name!r} on this server (known: {names}); choose one "
            "of GET /endpoints",
            field="llm",
        )
    model = options.model if options.model is not None else endpoint.model
    allowed = endpoint.allowed_models()
    if model not in allowed:
        raise ApiError(
            422,
            "model_not_allowed",
            f"model {model!r} is not allowed on endpoint {name!r}; choose one of "
            f"{', '.join(allowed)}",
            field="model",
        )
    if name != _default_name(config) and config.llm_overrides is not None:
        # The agent's own settings (sampling, timeouts, prompt) apply on any endpoint it may
        # use; what identifies an endpoint stays the endpoint's.
        own = config.llm_overrides.model_dump(exclude_none=True)
        for field in (*_OPERATOR_FIELDS, "model"):
            own.pop(field, None)
        endpoint = endpoint.with_overrides(LLMOverrides.model_validate(own))
    return endpoint.model_copy(update={"model": model})


def _client_endpoint(config: AgentConfig, options: SessionOptions, *, allowed: bool) -> LLMConfig:
    base_url = options.base_url
    assert base_url is not None
    if not allowed:
        raise ApiError(
            422,
            "client_endpoint_not_allowed",
            "this server calls only the model endpoints its operator configured; leave out "
            "base_url and choose an endpoint by name (llm) from GET /endpoints",
            field="base_url",
        )
    if options.llm is not None:
        raise ApiError(
            422,
            "invalid_option",
            "give either llm (an endpoint of this server) or base_url (your own), not both",
            field="llm",
        )
    if not base_url.startswith(("http://", "https://")):
        raise ApiError(
            422, "invalid_option", f"base_url {base_url!r} is not an http(s) URL", field="base_url"
        )
    if options.model is None:
        raise ApiError(
            422,
            "invalid_option",
            "a session with its own base_url must name its model",
            field="model",
        )
    # The operator's sampling and timeout settings carry over; nothing that identifies or
    # authenticates the operator's endpoint does.
    data: dict[str, Any] = {}
    with contextlib.suppress(AgentFlowError):
        data = config.resolved_llm().model_dump()
    for name in _OPERATOR_FIELDS:
        data.pop(name, None)
    data.update(
        provider="openai_compatible", base_url=base_url, model=options.model, send_key=False
    )
    data.pop("name", None)
    return LLMConfig.model_validate(data)
