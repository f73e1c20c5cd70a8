"""What a session's options make of the server's agent config: `session_config`.

A session chooses among what the operator allows: a model endpoint and model
(`agent_flow.server._endpoints`), a workspace under a `ServerSettings.workspace_roots` root, a
skill and a budget. Everything else is the operator's config. Every refusal is a 422
`ApiError` naming the option.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import ValidationError

from agent_flow.config import AgentConfig
from agent_flow.errors import AgentFlowError
from agent_flow.server._endpoints import operator_endpoints, session_llm
from agent_flow.server._errors import ApiError
from agent_flow.server.models import SessionOptions
from agent_flow.server.settings import ServerSettings

__all__ = ["session_config"]


def session_config(
    config: AgentConfig,
    options: SessionOptions,
    settings: ServerSettings,
    *,
    check_model: bool = True,
) -> AgentConfig:
    """The server's agent config with a session's options applied.

    Raises:
        ApiError: 422 naming the option that is invalid.
    """
    data = config.model_dump(mode="json", exclude_unset=True)
    llm = session_llm(config, options, client_endpoints=settings.allow_client_endpoints)
    if llm is not None:
        # The chosen endpoint, whole: the agent's own overrides named the default one.
        data["llm"] = llm.model_dump(mode="json")
        data.pop("llm_overrides", None)
    if options.workspace is not None:
        data["workspace"] = str(_workspace(settings, options.workspace))
    if options.max_tokens is not None:
        data["context"] = {**dict(data.get("context") or {}), "max_tokens": options.max_tokens}
    try:
        result = AgentConfig.model_validate(data)
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        raise ApiError(
            422, "invalid_config", f"the session's config is invalid at {where}: {first['msg']}"
        ) from None
    if options.skill is not None:
        try:
            result.skill(options.skill)
        except AgentFlowError as err:
            raise ApiError(422, "invalid_option", str(err), field="skill") from None
    if check_model:
        try:
            # Where its requests go must be known now: never a silent fall-back to OpenAI.
            result.resolved_llm().resolved_base_url()
        except AgentFlowError as err:
            said = str(err)
            if not operator_endpoints(config):
                said += (
                    "; this server has no model endpoint: its operator starts it with "
                    "--config agent.toml naming one ([agent.llm] or [llms.NAME])"
                )
            raise ApiError(422, "invalid_option", said, field="model") from None
    return result


def _workspace(settings: ServerSettings, requested: str) -> Path:
    roots = [root.resolve() for root in settings.workspace_roots]
    if not roots:
        raise ApiError(
            422,
            "workspace_not_allowed",
            "this server has no workspace roots, so a session cannot choose a workspace; "
            "start it with --workspace-root DIR",
            field="workspace",
        )
    try:
        path = Path(requested).expanduser().resolve()
    except (OSError, RuntimeError, ValueError):
        path = None
    if path is None or not any(path == root or path.is_relative_to(root) for root in roots):
        raise ApiError(
            422,
            "workspace_not_allowed",
            f"workspace {requested!r} is not under an allowed root "
            f"({', '.join(str(root) for root in roots)})",
            field="workspace",
        )
    if not path.is_dir():
        raise ApiError(
            422,
            "workspace_not_allowed",
            f"workspace {requested!r} is not a directory",
            field="workspace",
        )
    return path
