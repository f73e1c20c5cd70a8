"""Typed extensions: `Environment.register_extension` holds an extension to a pydantic model.

Every write that touches the extension is validated against the model (a wrong one is undone
whole), the extension reads back as the model, and a saved copy keeps the check as the
model's JSON schema.
"""

from __future__ import annotations

import contextlib
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from agent_flow._types import JsonValue
from agent_flow.environment import Environment
from agent_flow.errors import EnvironmentValidationError, PointerError, UserError
from agent_flow.testing.strategies import environments, json_values


class Dataset(BaseModel):
    """Every field required and no extra keys: a write fits exactly when the model says so."""

    model_config = ConfigDict(extra="forbid")

    name: str
    rows: int
    columns: list[str]

    @field_validator("rows")
    @classmethod
    def _not_negative(cls, rows: int) -> int:
        if rows < 0:
            raise ValueError("rows must not be negative")
        return rows


def fits(value: JsonValue) -> bool:
    """The model's verdict on JSON data, in strict JSON mode as the environment asks it."""
    try:
        Dataset.model_validate_json(json.dumps(value), strict=True)
    except ValidationError:
        return False
    return True


_TARGETS = (
    "/extensions/dataset",
    "/extensions/dataset/name",
    "/extensions/dataset/rows",
    "/extensions/dataset/columns",
    "/extensions/dataset/columns/-",
    "/extensions/dataset/columns/0",
    "/extensions",
    "",
)

# Values that often fit (typed like the field) and values of any JSON type.
_VALUES = st.one_of(
    st.integers(-3, 10**6),
    st.text(alphabet="ab1", max_size=3),
    st.lists(st.text(alphabet="ab", max_size=2), max_size=3),
    st.builds(
        dict,
        name=st.text(alphabet="ab", max_size=2),
        rows=st.integers(-1, 5) | st.text(max_size=1),
        columns=st.lists(st.text(alphabet="ab", max_size=2), max_size=2),
    ),
    json_values(max_leaves=4),
)


@st.composite
def writes(draw: st.DrawFn) -> tuple[str, str, JsonValue]:
    """A set or delete somewhere on the way to, or inside, the typed extension."""
    if draw(st.integers(0, 4)) == 0:
        pointer = draw(st.sampled_from(["/extensions/dataset", "/extensions/dataset/columns/0"]))
        return "delete", pointer, None
    pointer = draw(st.sampled_from(_TARGETS))
    value = draw(_VALUES)
    if pointer == "/extensions":
        value = {"dataset": value}
    elif pointer == "":
        value = {"extensions": {"dataset": value}}
    return "set", pointer, value


def apply(env: Environment, op: str, pointer: str, value: JsonValue) -> None:
    if op == "set":
        env.set(pointer, value)
    else:
        env.delete(pointer)


@given(env=environments(extensions={"dataset": Dataset}), write=writes())
def test_a_write_is_kept_exactly_when_the_extension_still_fits_its_model(
    env: Environment, write: tuple[str, str, JsonValue]
) -> None:
    op, pointer, value = write
    # The oracle: the same write on an untyped copy, then the model's verdict on the result.
    extensions = env.get("/extensions")
    assert isinstance(extensions, dict)
    plain = Environment(extensions=extensions)
    try:
        apply(plain, op, pointer, value)
    except (PointerError, UserError):
        expected = False
    else:
        candidate = plain.get("/extensions")
        assert isinstance(candidate, dict)
        expected = "dataset" not in candidate or fits(candidate["dataset"])
    before = env.to_json()
    try:
        apply(env, op, pointer, value)
    except (EnvironmentValidationError, PointerError, UserError):
        accepted = False
        assert env.to_json() == before  # undone whole: state, version and change log
    else:
        accepted = True
        if env.has("/extensions/dataset"):
            assert isinstance(env.get_extension("dataset"), Dataset)
    assert accepted == expected, f"{op} {pointer} {value!r}"


@given(env=environments(extensions={"dataset": Dataset}), write=writes())
def test_a_saved_copy_refuses_what_the_model_refuses(
    env: Environment, write: tuple[str, str, JsonValue]
) -> None:
    """The model travels as its JSON schema; a wrong type is refused by the copy too."""
    copy = Environment.from_json(env.to_json())
    op, pointer, value = write
    typed_ok = untyped_ok = True
    try:
        apply(env, op, pointer, value)
    except (EnvironmentValidationError, PointerError, UserError):
        typed_ok = False
    try:
        apply(copy, op, pointer, value)
    except (EnvironmentValidationError, PointerError, UserError):
        untyped_ok = False
    # The schema cannot express the model's validator (rows >= 0): the copy accepts more.
    if untyped_ok != typed_ok:
        assert untyped_ok
        assert not typed_ok
        rows = copy.get("/extensions/dataset/rows")
        assert isinstance(rows, int)
        assert rows < 0


def test_registering_reads_the_extension_back_as_the_model_and_is_not_a_change() -> None:
    env = Environment(extensions={"dataset": {"name": "sales", "rows": 3, "columns": ["a"]}})
    version, changes = env.version, env.changes()
    env.register_extension("dataset", Dataset)
    assert (env.version, env.changes()) == (version, changes)
    assert env.get_extension("dataset") == Dataset(name="sales", rows=3, columns=["a"])
    assert env.extension_models == {"dataset": Dataset}


def test_a_wrong_write_names_the_extension_the_model_and_the_problem() -> None:
    env = Environment.builder().extension_model("dataset", Dataset).build()
    env.set_extension("dataset", Dataset(name="sales", rows=3, columns=[]))
    with pytest.raises(EnvironmentValidationError, match=r"'/extensions/dataset/rows'.*int"):
        env.set("/extensions/dataset/rows", "12")
    with pytest.raises(EnvironmentValidationError, match=r"'dataset' is registered as Dataset"):
        env.set("/extensions/dataset/rows", -1)
    with pytest.raises(PointerError, match="not a field of Dataset"):
        env.set("/extensions/dataset/size", 1)
    with pytest.raises(UserError, match="field of Dataset"):
        env.delete("/extensions/dataset/rows")
    assert env.get_extension("dataset").rows == 3


def test_registering_a_model_the_extension_does_not_fit_registers_nothing() -> None:
    env = Environment(extensions={"dataset": {"name": "sales", "rows": "3", "columns": []}})
    with pytest.raises(EnvironmentValidationError, match="Dataset"):
        env.register_extension("dataset", Dataset)
    assert env.extension_models == {}
    env.set("/extensions/dataset/rows", "still free JSON")


def test_register_extension_needs_a_pydantic_model() -> None:
    with pytest.raises(UserError, match="pydantic model class"):
        Environment().register_extension("dataset", dict)  # type: ignore[arg-type]


def test_get_extension_without_a_model_needs_a_registration() -> None:
    env = Environment(extensions={"dataset": {"name": "sales", "rows": 3, "columns": []}})
    with pytest.raises(UserError, match=r"register_extension\('dataset', Model\)"):
        env.get_extension("dataset")
    assert env.get_extension("dataset", Dataset).rows == 3


def test_the_model_registered_again_after_from_json_replaces_its_saved_schema() -> None:
    env = Environment(extension_models={"dataset": Dataset})
    env.set_extension("dataset", Dataset(name="sales", rows=3, columns=[]))
    copy = Environment.from_json(env.to_json())
    assert set(copy.extension_schemas) == {"dataset"}
    with contextlib.suppress(EnvironmentValidationError):
        copy.set("/extensions/dataset/rows", "x")
    assert copy.get("/extensions/dataset/rows") == 3
    copy.register_extension("dataset", Dataset)
    assert copy.extension_schemas == {}
    assert copy.to_json() == env.to_json()
