"""The fast argument check of flat schemas agrees with jsonschema, and covers what it claims."""

from __future__ import annotations

import jsonschema
from hypothesis import given
from hypothesis import strategies as st

from agent_flow._types import JsonObject
from agent_flow.tools import tool
from agent_flow.tools._validation import _flat_check, _validator

_TYPES = ["string", "integer", "number", "boolean", "null"]
_NAMES = ["a", "b", "c", "d"]

_values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, 1.0, -3.0, 2.5]),
    st.text(max_size=5),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=2), st.integers(), max_size=2),
)


@st.composite
def flat_schemas(draw: st.DrawFn) -> JsonObject:
    names = draw(st.lists(st.sampled_from(_NAMES), unique=True, max_size=4))
    properties: JsonObject = {}
    for name in names:
        spec: JsonObject = {"description": f"the {name}"}
        if draw(st.booleans()):
            spec["type"] = draw(st.sampled_from(_TYPES))
        if draw(st.booleans()):
            spec["default"] = draw(_values)
        properties[name] = spec
    schema: JsonObject = {"type": "object", "properties": properties}
    if names:
        schema["required"] = draw(st.lists(st.sampled_from(names), unique=True))
    extra = draw(st.sampled_from([None, True, False]))
    if extra is not None:
        schema["additionalProperties"] = extra
    return schema


@given(flat_schemas(), st.dictionaries(st.sampled_from([*_NAMES, "e"]), _values, max_size=5))
def test_flat_check_agrees_with_jsonschema(schema: JsonObject, arguments: JsonObject) -> None:
    check = _flat_check(schema)
    assert check is not None
    assert check(arguments) == jsonschema.Draft202012Validator(schema).is_valid(arguments)


def test_schemas_beyond_flat_primitives_have_no_fast_check() -> None:
    base: JsonObject = {"type": "object", "properties": {"a": {"type": "integer"}}}
    assert _flat_check(base) is not None
    for spec in (
        {"type": "integer", "minimum": 0},
        {"enum": ["x", "y"]},
        {"type": ["integer", "null"]},
        {"type": "array", "items": {"type": "integer"}},
        {"$ref": "#/$defs/A"},
        {"anyOf": [{"type": "integer"}, {"type": "null"}]},
    ):
        assert _flat_check({"type": "object", "properties": {"a": spec}}) is None, spec
    assert _flat_check({**base, "additionalProperties": {"type": "string"}}) is None
    assert _flat_check({**base, "$defs": {}}) is None
    assert _flat_check({**base, "$schema": "http://json-schema.org/draft-07/schema#"}) is None


def test_a_typed_function_tool_gets_the_fast_check() -> None:
    @tool
    def add(a: int, b: float, label: str = "", flag: bool = False) -> float:
        """Add."""
        return a + b

    _, check = _validator("add", add.parameters)
    assert check is not None
    assert check({"a": 1, "b": 2.5})
    assert not check({"a": "1", "b": 2})
    assert not check({"a": 1, "b": 2, "other": 3})
