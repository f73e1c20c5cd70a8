"""Checking a call's arguments: JSON parsing and validation against the tool's JSON schema.

Every problem becomes a message for the model that says what is wrong and what was
expected (``{path: string, limit?: integer}``), so it can correct the call.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, cast

import jsonschema
import jsonschema.exceptions
import jsonschema.protocols
import jsonschema.validators

from agent_flow._types import JsonObject, JsonValue
from agent_flow.errors import ToolDefinitionError

if TYPE_CHECKING:
    from agent_flow.tools._registry import RegisteredTool

# JSON schema's primitive types as jsonschema decides them on parsed JSON (a bool is no
# number; 1.0 is an integer).
_TYPE_CHECKS: dict[str, Callable[[JsonValue], bool]] = {
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: (
        (isinstance(v, int) and not isinstance(v, bool))
        or (isinstance(v, float) and v.is_integer())
    ),
    "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
}
_ANNOTATIONS = frozenset({"title", "description", "default", "examples"})
_FLAT_OBJECT_KEYS = _ANNOTATIONS | {"type", "properties", "required", "additionalProperties"}

ArgumentsCheck = Callable[[JsonObject], bool]


# Checking a schema against its metaschema costs milliseconds; agents are often built per
# run with the same tools, so each distinct schema is checked once per process.
_validators: dict[str, tuple[jsonschema.protocols.Validator, ArgumentsCheck | None]] = {}
_MAX_CACHED_VALIDATORS = 1024


def schema_key(parameters: JsonObject) -> str:
    """The key of a parameter schema in the caches of what is derived from it (its content)."""
    return json.dumps(parameters, sort_keys=True, default=str)


def _validator(
    exposed: str, parameters: JsonObject, key: str | None = None
) -> tuple[jsonschema.protocols.Validator, ArgumentsCheck | None]:
    """Return a validator for `parameters` and its fast check (`_flat_check`), cached.

    The schema itself is checked first. `key` is its `schema_key`, when the caller has it.
    """
    key = schema_key(parameters) if key is None else key
    cached = _validators.get(key)
    if cached is not None:
        return cached
    validator_class = jsonschema.validators.validator_for(
        parameters, default=jsonschema.Draft202012Validator
    )
    try:
        validator_class.check_schema(parameters)
    except jsonschema.exceptions.SchemaError as err:
        raise ToolDefinitionError(
            f"the parameter schema of tool {exposed!r} is not a valid JSON schema: {err.message}"
        ) from err
    if parameters.get("type") != "object":
        raise ToolDefinitionError(
            f"the parameter schema of tool {exposed!r} must have type 'object', "
            f"got {parameters.get('type')!r}"
        )
    if len(_validators) >= _MAX_CACHED_VALIDATORS:
        _validators.clear()
    validator = validator_class(parameters)
    _validators[key] = (validator, _flat_check(parameters))
    return _validators[key]


def _flat_check(parameters: JsonObject) -> ArgumentsCheck | None:
    """A fast exact check of `parameters` when it is a flat object of primitive-typed fields.

    Most tools take a few strings and numbers: for their schemas (an object whose properties
    each give at most one primitive ``type``, with ``required`` and ``additionalProperties``)
    this says whether arguments are valid with jsonschema's own verdict, in a fraction of its
    time. Any other schema returns None: jsonschema checks it. Only a pass is trusted: the
    problems of failing arguments are always described by jsonschema.
    """
    if parameters.keys() - _FLAT_OBJECT_KEYS or parameters.get("type") != "object":
        return None
    properties = parameters.get("properties", {})
    required = parameters.get("required", [])
    additional = parameters.get("additionalProperties", True)
    if not isinstance(properties, dict) or not isinstance(required, list):
        return None
    if not isinstance(additional, bool) or not all(isinstance(n, str) for n in required):
        return None
    checks: dict[str, Callable[[JsonValue], bool] | None] = {}
    for name, spec in properties.items():
        if not isinstance(spec, dict) or spec.keys() - _ANNOTATIONS - {"type"}:
            return None
        kind = spec.get("type")
        if kind is None:
            checks[name] = None
        elif isinstance(kind, str) and kind in _TYPE_CHECKS:
            checks[name] = _TYPE_CHECKS[kind]
        else:
            return None
    names = tuple(cast(list[str], required))

    def check(arguments: JsonObject) -> bool:
        for name in names:
            if name not in arguments:
                return False
        for name, value in arguments.items():
            if name not in checks:
                if not additional:
                    return False
                continue
            kind_check = checks[name]
            if kind_check is not None and not kind_check(value):
                return False
        return True

    return check


def _schema_problems(registered: RegisteredTool, arguments: JsonObject) -> str:
    if registered.quick_check is not None and registered.quick_check(arguments):
        return ""
    errors = sorted(
        registered.validator.iter_errors(arguments), key=lambda e: (list(e.path), e.message)
    )
    if not errors:
        return ""
    problems = []
    for error in errors[:5]:
        where = "/".join(str(part) for part in error.path)
        problems.append(f"{where}: {error.message}" if where else error.message)
    more = f" (and {len(errors) - 5} more)" if len(errors) > 5 else ""
    return (
        f"invalid arguments for tool {registered.name!r}: {'; '.join(problems)}{more}. "
        f"Expected: {_signature(registered.definition.parameters)}"
    )


def _signature(schema: JsonObject) -> str:
    properties = schema.get("properties")
    if not isinstance(properties, dict) or not properties:
        return "no arguments"
    required = schema.get("required")
    required_names = set(required) if isinstance(required, list) else set()
    definitions = schema.get("$defs")
    parts = []
    for name, spec in properties.items():
        marker = "" if name in required_names else "?"
        parts.append(f"{name}{marker}: {_type_name(spec, definitions)}")
    return "{" + ", ".join(parts) + "}"


def _type_name(spec: JsonValue, definitions: JsonValue, depth: int = 0) -> str:
    """A short type description of a property schema, for error messages."""
    if not isinstance(spec, dict) or depth > 3:
        return "any"
    ref = spec.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/$defs/") and isinstance(definitions, dict):
        return _type_name(definitions.get(ref.removeprefix("#/$defs/")), definitions, depth + 1)
    if isinstance(spec.get("enum"), list):
        return " | ".join(json.dumps(v) for v in cast(list[JsonValue], spec["enum"]))
    for key in ("anyOf", "oneOf"):
        options = spec.get(key)
        if isinstance(options, list):
            return " | ".join(_type_name(o, definitions, depth + 1) for o in options)
    kind = spec.get("type")
    if isinstance(kind, str):
        if kind == "array":
            return f"{_type_name(spec.get('items'), definitions, depth + 1)}[]"
        return kind
    if isinstance(kind, list):
        return " | ".join(str(k) for k in kind)
    return "any"
