"""The rules an environment may carry beyond its sections: JSON schemas and extension models.

An environment may have one schema for the whole state, one per extension, and a registered
pydantic model per extension. A schema is checked when the environment is built
(`_make_validator` rejects an invalid one); after each write the whole-state schema is
checked, and an extension's schema and model only when the write touched that extension
(`_touched`). A model is checked in strict JSON mode, as the typed sections are: a value must
already be of the field's type (``"3"`` is not an ``int``).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from typing import Any, cast

import jsonschema.exceptions
import jsonschema.validators
from pydantic import BaseModel, ValidationError

from agent_flow._types import JsonObject, JsonValue
from agent_flow.environment._pointer import _adapter, _brief, _pointer, _validation_problem
from agent_flow.environment._writes import _Applied
from agent_flow.errors import EnvironmentValidationError, UserError


def _make_validator(schema: JsonObject, what: str) -> Any:
    cls = jsonschema.validators.validator_for(schema)
    try:
        cls.check_schema(schema)
    except jsonschema.exceptions.SchemaError as err:
        raise UserError(
            f"the JSON schema for {what} is invalid ({err.message}); fix the schema"
        ) from err
    return cls(schema)


def _check_schemas(
    state: JsonObject,
    validator: Any,
    extension_validators: Mapping[str, Any],
    applied: Sequence[_Applied],
) -> None:
    """Raise if `state` breaks its schema, or an extension `applied` touched breaks its own."""
    if validator is not None:
        error = jsonschema.exceptions.best_match(validator.iter_errors(state))
        if error is not None:
            raise EnvironmentValidationError(
                f"the environment would break its schema: {error.message} at "
                f"{_pointer(str(p) for p in error.absolute_path) or 'the root'!r}; "
                "write a value the schema allows"
            )
    if not extension_validators:
        return
    extensions = cast(JsonObject, state["extensions"])
    for name in sorted(_touched(applied, extension_validators)):
        ext_validator = extension_validators[name]
        if name not in extensions:
            continue
        error = jsonschema.exceptions.best_match(ext_validator.iter_errors(extensions[name]))
        if error is not None:
            where = _pointer(["extensions", name, *(str(p) for p in error.absolute_path)])
            raise EnvironmentValidationError(
                f"extension {name!r} would break its schema: {error.message} at "
                f"{where!r}; write a value the schema allows"
            )


def _touched(applied: Sequence[_Applied], names: Mapping[str, object]) -> set[str]:
    """The extensions among `names` that the `applied` steps may have changed."""
    touched: set[str] = set()
    for step in applied:
        if len(step.parts) < 2:
            if not step.parts or step.parts[0] == "extensions":
                return set(names)
        elif step.parts[0] == "extensions" and step.parts[1] in names:
            touched.add(step.parts[1])
    return touched


def _check_models(
    state: JsonObject, models: Mapping[str, type[BaseModel]], applied: Sequence[_Applied]
) -> None:
    """Raise if an extension the `applied` steps touched no longer fits its registered model.

    The whole extension is validated, so the model's own validators (across fields too) hold
    after a write deep inside it, not just the type at the written location.
    """
    if not models:
        return
    extensions = cast(JsonObject, state["extensions"])
    for name in sorted(_touched(applied, models)):
        if name in extensions:
            _check_model(name, extensions[name], models[name])


def _check_model(name: str, value: JsonValue, model: type[BaseModel]) -> None:
    try:
        _adapter(model).validate_json(json.dumps(value), strict=True)
    except ValidationError as err:
        raise EnvironmentValidationError(
            f"extension {name!r} is registered as {model.__name__}, and {_brief(value)} does "
            f"not fit it ({_validation_problem(err)}); write a {model.__name__} (or its JSON)"
        ) from err


@functools.cache  # one schema per model class, reused by every `to_json`
def _model_schema(model: type[BaseModel]) -> JsonObject:
    """The JSON schema of an extension model, kept with a saved environment."""
    return cast(JsonObject, model.model_json_schema(mode="validation"))
