"""The JSON schemas an environment may carry: checking them, and checking them after a write.

An environment may have one schema for the whole state and one per extension. A schema is
checked when the environment is built (`_make_validator` rejects an invalid one); after each
write the whole-state schema is checked, and an extension's schema only when the write
touched that extension.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, cast

import jsonschema.exceptions
import jsonschema.validators

from agent_flow._types import JsonObject
from agent_flow.environment._pointer import _pointer
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
    names: set[str] = set()
    for step in applied:
        if len(step.parts) < 2:
            if not step.parts or step.parts[0] == "extensions":
                names.update(extension_validators)
        elif step.parts[0] == "extensions":
            names.add(step.parts[1])
    extensions = cast(JsonObject, state["extensions"])
    for name in sorted(names):
        ext_validator = extension_validators.get(name)
        if ext_validator is None or name not in extensions:
            continue
        error = jsonschema.exceptions.best_match(ext_validator.iter_errors(extensions[name]))
        if error is not None:
            where = _pointer(["extensions", name, *(str(p) for p in error.absolute_path)])
            raise EnvironmentValidationError(
                f"extension {name!r} would break its schema: {error.message} at "
                f"{where!r}; write a value the schema allows"
            )
