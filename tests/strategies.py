"""Hypothesis strategies for agent_flow's data: environments, histories, tools."""

from __future__ import annotations

from hypothesis import strategies as st

from agent_flow.messages import ToolDefinition
from tests._env_strategies import env_environments as environments
from tests._env_strategies import json_values, pointer_writes
from tests._history_strategies import entry_lists, histories, history_entries, pruning_strategies

__all__ = [
    "entry_lists",
    "environments",
    "histories",
    "history_entries",
    "json_values",
    "pointer_writes",
    "pruning_strategies",
    "tool_definitions",
]

_names = st.from_regex(r"[a-z][a-z0-9_]{0,20}", fullmatch=True)


@st.composite
def tool_definitions(draw: st.DrawFn) -> ToolDefinition:
    """A tool schema with a few typed, described, optional or required parameters."""
    properties = draw(
        st.dictionaries(
            _names,
            st.fixed_dictionaries(
                {"type": st.sampled_from(["string", "integer", "boolean", "number"])},
                optional={"description": st.text(max_size=40)},
            ),
            max_size=4,
        )
    )
    required = (
        draw(st.lists(st.sampled_from(sorted(properties)), unique=True)) if properties else []
    )
    return ToolDefinition(
        name=draw(_names),
        description=draw(st.text(max_size=80)),
        parameters={"type": "object", "properties": properties, "required": required},
    )
