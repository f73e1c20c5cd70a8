"""Hypothesis strategies for `AgentConfig` and every config model it holds.

Each model is built from a random subset of its optional fields, so copies made with
``exclude_unset`` meet every mix of given and defaulted fields. A field's values come from
its annotation and constraints (`field_values`), so a field added later is covered without a
change here; only fields tied together by a validator are drawn by hand (`_ADJUST`).
"""

from __future__ import annotations

import enum
import re
import types
import typing
from collections.abc import Callable
from typing import Any

from hypothesis import strategies as st
from pydantic import BaseModel, JsonValue
from pydantic.fields import FieldInfo

from agent_flow._defaults import DEFAULT_MAX_TOKENS
from agent_flow.config import AgentConfig, ContextConfig, Skill
from agent_flow.llm.config import LLMConfig
from agent_flow.testing.strategies import json_values
from agent_flow.tools.mcp_config import MCPPromptRef

__all__ = ["agent_configs", "config_models", "field_values", "models"]

_UNIONS = (typing.Union, types.UnionType)
_BIG = 10**9

#: A few valid JSON schemas (`AgentConfig.output_schema` must be one).
_SCHEMAS: tuple[dict[str, JsonValue], ...] = (
    {"type": "object"},
    {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]},
    {"type": "array", "items": {"type": "integer", "minimum": 0}},
)


def _bounds(metadata: list[Any]) -> dict[str, Any]:
    """The numeric and length bounds among a field's constraints."""
    found: dict[str, Any] = {}
    for item in metadata:
        for name in ("gt", "ge", "lt", "le", "min_length", "max_length", "pattern"):
            value = getattr(item, name, None)
            if value is not None:
                found[name] = value
    return found


def _numbers(kind: type, bounds: dict[str, Any]) -> st.SearchStrategy[Any]:
    low = bounds.get("ge", bounds.get("gt"))
    high = bounds.get("le", bounds.get("lt"))
    if kind is int:
        low_int = (low + 1 if "gt" in bounds else low) if low is not None else -_BIG
        high_int = (high - 1 if "lt" in bounds else high) if high is not None else low_int + _BIG
        return st.integers(low_int, high_int)
    # Finite floats only: JSON has no infinity (see the test module's docstring).
    return st.floats(
        min_value=low,
        max_value=high if high is not None else _BIG,
        exclude_min="gt" in bounds,
        exclude_max="lt" in bounds,
        allow_nan=False,
        allow_infinity=False,
    )


def field_values(annotation: Any, metadata: list[Any] | None = None) -> st.SearchStrategy[Any]:
    """Valid values of a field typed `annotation` with pydantic constraints `metadata`."""
    bounds = _bounds(metadata or [])
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Annotated:
        extra = [item for item in args[1:] if not isinstance(item, FieldInfo)]
        return field_values(args[0], [*(metadata or []), *extra])
    if origin in _UNIONS:
        return st.one_of(*(field_values(option, metadata) for option in args))
    if origin is typing.Literal:
        return st.sampled_from(args)
    if origin is tuple:
        return st.lists(field_values(args[0]), max_size=3).map(tuple)
    if origin is dict:
        return st.dictionaries(st.text(max_size=8), field_values(args[1]), max_size=3)
    if annotation is JsonValue:
        return json_values(max_leaves=4)
    if annotation is type(None):
        return st.none()
    if annotation is bool:
        return st.booleans()
    if annotation in (int, float):
        return _numbers(annotation, bounds)
    if annotation is str:
        if "pattern" in bounds:
            return st.from_regex(re.compile(bounds["pattern"]), fullmatch=True)
        return st.text(min_size=bounds.get("min_length", 0), max_size=20)
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return st.sampled_from(list(annotation))
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return models(annotation)
    raise NotImplementedError(f"no strategy for fields of type {annotation!r}; add one here")


def _context(draw: st.DrawFn, given: dict[str, Any]) -> None:
    if "reserve_output_tokens" in given:  # must stay below the budget
        limit = given.get("max_tokens", DEFAULT_MAX_TOKENS)
        given["reserve_output_tokens"] = draw(st.integers(0, limit - 1))


def _skill(draw: st.DrawFn, given: dict[str, Any]) -> None:
    given.pop("system_prompt", None)
    given.pop("mcp_prompt", None)
    if draw(st.booleans()):  # one of them, never both
        given["system_prompt"] = draw(st.text(min_size=1, max_size=20))
    else:
        given["mcp_prompt"] = draw(models(MCPPromptRef))


def _agent(draw: st.DrawFn, given: dict[str, Any]) -> None:
    skills = {skill.name: skill for skill in given.get("skills", ())}
    if "skills" in given:
        given["skills"] = tuple(skills.values())  # names are unique
    if "output_schema" in given:
        given["output_schema"] = draw(st.none() | st.sampled_from(_SCHEMAS))
    given.pop("llm", None)
    named = sorted(given.get("llms", {}))
    choice = draw(st.sampled_from(["unset", "none", "inline", *(["named"] if named else [])]))
    if choice == "none":
        given["llm"] = None
    elif choice == "inline":
        given["llm"] = draw(models(LLMConfig))
    elif choice == "named":
        given["llm"] = draw(st.sampled_from(named))


#: Fields a validator ties together, drawn by hand after the others.
_ADJUST: dict[type[BaseModel], Callable[[st.DrawFn, dict[str, Any]], None]] = {
    ContextConfig: _context,
    Skill: _skill,
    AgentConfig: _agent,
}


@st.composite
def _models(draw: st.DrawFn, model: type[BaseModel]) -> BaseModel:
    given: dict[str, Any] = {}
    for name, field in model.model_fields.items():
        if field.is_required() or draw(st.booleans()):
            given[name] = draw(field_values(field.annotation, field.metadata))
    adjust = _ADJUST.get(model)
    if adjust is not None:
        adjust(draw, given)
    return model(**given)


def models(model: type[BaseModel]) -> st.SearchStrategy[Any]:
    """Instances of the config model `model`, each given a random subset of its fields."""
    return st.deferred(lambda: _models(model))


def agent_configs() -> st.SearchStrategy[AgentConfig]:
    """`AgentConfig`s with every kind of part: LLM configs, MCP servers, skills, policies, ..."""
    return models(AgentConfig)


def config_models(root: type[BaseModel] = AgentConfig) -> set[type[BaseModel]]:
    """Every model class reachable from `root`'s fields (`root` included)."""
    found: set[type[BaseModel]] = set()
    pending: list[Any] = [root]
    while pending:
        item = pending.pop()
        if isinstance(item, type) and issubclass(item, BaseModel):
            if item not in found:
                found.add(item)
                pending.extend(field.annotation for field in item.model_fields.values())
        else:
            pending.extend(typing.get_args(item))
    return found
