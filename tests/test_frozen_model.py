"""`FrozenModel`: instances given the same fields share one fields-set, and nothing else."""

from __future__ import annotations

import pickle

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from agent_flow._types import FrozenModel
from agent_flow.environment import EnvironmentChange
from agent_flow.history import ToolResultEntry
from agent_flow.llm import Usage
from agent_flow.messages import ChatMessage, ToolCall


class _Point(FrozenModel):
    x: int = 0
    y: int = 0
    label: str | None = None


_FIELDS = {"x": st.integers(), "y": st.integers(), "label": st.none() | st.text(max_size=5)}


@given(st.fixed_dictionaries({}, optional=_FIELDS), st.fixed_dictionaries({}, optional=_FIELDS))
def test_model_fields_set_is_what_each_instance_was_given(
    first: dict[str, object], second: dict[str, object]
) -> None:
    a, b = _Point.model_validate(first), _Point.model_validate(second)
    assert a.model_fields_set == set(first)
    assert b.model_fields_set == set(second)
    # A copy with changes gets its own set; the originals' stay as they were.
    c = a.model_copy(update={"label": "copied"})
    assert c.model_fields_set == set(first) | {"label"}
    assert a.model_fields_set == set(first)
    assert b.model_fields_set == set(second)
    assert pickle.loads(pickle.dumps(a)).model_fields_set == set(first)
    assert a.model_dump(exclude_unset=True) == first


def test_instances_given_the_same_fields_share_one_set() -> None:
    a, b = _Point(x=1, y=2), _Point(x=3, y=4)
    assert a.model_fields_set is b.model_fields_set
    assert _Point(x=1).model_fields_set is not a.model_fields_set
    with pytest.raises(ValidationError):
        a.x = 5  # type: ignore[misc]  # frozen: the shared set can never grow this way
    assert b.model_fields_set == {"x", "y"}


def test_the_models_a_run_keeps_by_the_dozen_share_their_sets() -> None:
    pairs = [
        (ToolCall(id="1", name="a"), ToolCall(id="2", name="b")),
        (ChatMessage(role="user", content="a"), ChatMessage(role="user", content="b")),
        (
            ToolResultEntry(call_id="1", tool_name="a", content="x"),
            ToolResultEntry(call_id="2", tool_name="b", content="y"),
        ),
        (Usage(prompt_tokens=1, completion_tokens=2), Usage(prompt_tokens=3, completion_tokens=4)),
        (
            EnvironmentChange.model_construct(version=1, op="set", pointer="/a", old=None, new=1),
            EnvironmentChange.model_construct(version=2, op="set", pointer="/b", old=None, new=2),
        ),
    ]
    for a, b in pairs:
        assert a.model_fields_set is b.model_fields_set, type(a).__name__
