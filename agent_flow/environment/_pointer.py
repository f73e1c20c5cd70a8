"""JSON values, RFC 6901 pointers, and the types at pointer locations: the untyped core.

Everything that handles values and types as `Any` lives here, isolated from the rest of the
package: copying arbitrary values into plain JSON (`_json_copy`), parsing and building
pointers (`_parse`, `_pointer`, `_index`), walking the section models' annotations to find
the type at a location (`_children`, `_child_type`), and validating a value against that
type in strict JSON mode (`_validate_typed`).
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Iterable
from enum import Enum
from types import UnionType
from typing import Any, Final, Union, cast, get_args, get_origin

import jsonpointer
from pydantic import BaseModel, TypeAdapter, ValidationError

from agent_flow._types import JsonObject, JsonValue
from agent_flow._unicode import first_surrogate, is_clean
from agent_flow.environment.sections import _State
from agent_flow.errors import EnvironmentValidationError, PointerError, UserError

# -- JSON values and pointers ----------------------------------------------------------------


def _brief(value: object, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _unencodable(text: str, pointer: str) -> EnvironmentValidationError:
    """The error for a text holding a surrogate, which no UTF-8 encoder takes."""
    index = first_surrogate(text)
    assert index is not None, "called for a text that holds one"
    return EnvironmentValidationError(
        f"the text {_brief(text)} written to {pointer!r} holds a lone surrogate "
        f"({text[index]!a} at index {index}), which UTF-8 cannot encode: the prompt and "
        "the stored session could not be written; decode the bytes it came from with "
        "errors='replace', or join the surrogate pair it was cut from"
    )


def _json_copy(value: object, pointer: str) -> JsonValue:
    """Return a deep copy of `value` as plain JSON data (models dumped, enums by value).

    Raises:
        UserError: The value is not JSON.
        EnvironmentValidationError: A text in it (a key or a value) holds a lone surrogate.
    """
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str):
        if not is_clean(value):
            raise _unencodable(value, pointer)
        return value if type(value) is str else str.__str__(value)
    if isinstance(value, int):
        return value if type(value) is int else int.__index__(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise UserError(
                f"the value {value!r} written to {pointer!r} is not valid JSON; "
                "use a finite number or a string"
            )
        return float(value)
    if isinstance(value, BaseModel):
        return _json_copy(value.model_dump(mode="json"), pointer)
    if isinstance(value, Enum):
        return _json_copy(value.value, pointer)
    if isinstance(value, list | tuple):
        return [_json_copy(item, pointer) for item in value]
    if isinstance(value, dict):
        out: JsonObject = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise UserError(
                    f"the key {key!r} in the value written to {pointer!r} is not a string; "
                    "JSON objects need string keys"
                )
            if not is_clean(key):
                raise _unencodable(key, pointer)
            out[key] = _json_copy(item, pointer)
        return out
    raise UserError(
        f"the value {_brief(value)} of type {type(value).__name__} written to {pointer!r} is "
        "not JSON; convert it to a dict, list, string, number, bool or None first"
    )


def _copy(value: JsonValue) -> JsonValue:
    """Deep-copy plain JSON data (faster than `copy.deepcopy`)."""
    if isinstance(value, dict):
        return {key: _copy(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_copy(item) for item in value]
    return value


@functools.lru_cache(maxsize=4096)
def _parse(pointer: str) -> tuple[str, ...]:
    if not isinstance(pointer, str):
        raise PointerError(f"the pointer {pointer!r} is not a string; write e.g. '/task/status'")
    if not is_clean(pointer):
        raise PointerError(
            f"the pointer {pointer!r} holds a lone surrogate, which UTF-8 cannot encode (no "
            "stored key can hold it); write the text it stands for"
        )
    try:
        return tuple(jsonpointer.JsonPointer(pointer).parts)
    except jsonpointer.JsonPointerException as err:
        raise PointerError(
            f"{pointer!r} is not a JSON pointer ({err}); write e.g. '/task/status', "
            "escaping '~' as '~0' and '/' as '~1'"
        ) from err


def _pointer(parts: Iterable[str]) -> str:
    return "".join("/" + part.replace("~", "~0").replace("/", "~1") for part in parts)


def _index(items: list[JsonValue], part: str, pointer: str) -> int:
    if part == "-":
        raise PointerError(
            f"{pointer!r} uses '-', which names the end of an array and is only valid as the "
            "last token of a set (to append)"
        )
    if not (part.isascii() and part.isdigit()) or (len(part) > 1 and part[0] == "0"):
        raise PointerError(
            f"{pointer!r} uses {part!r} as an array index; write a decimal index without "
            "leading zeros, or '-' to append"
        )
    index = int(part)
    if index >= len(items):
        raise PointerError(
            f"{pointer!r} names index {index} of an array of {len(items)} items; "
            "use an existing index, or '-' to append"
        )
    return index


# -- types at pointer locations --------------------------------------------------------------

_ANY: Final = object()  # the location holds any JSON value: nothing to validate
_SCALAR: Final = object()  # the location holds a scalar: nothing below it


def _strip_optional(tp: Any) -> Any:
    if get_origin(tp) in (Union, UnionType):
        args = [arg for arg in get_args(tp) if arg is not type(None)]
        if len(args) == 1:
            return args[0]
    return tp


def _is_model(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, BaseModel)


@functools.lru_cache(maxsize=256)
def _children(tp: Any) -> tuple[Any, dict[str, Any] | None]:
    """Return (item type, None) for lists and dicts, (model, field types) for models."""
    if tp is _ANY or tp is JsonValue:
        return _ANY, None
    tp = _strip_optional(tp)
    if _is_model(tp):
        return tp, {name: f.annotation for name, f in tp.model_fields.items()}
    origin = get_origin(tp)
    if origin is list:
        return get_args(tp)[0], None
    if origin is dict:
        return get_args(tp)[1], None
    return _SCALAR, None


def _child_type(tp: Any, part: str, pointer: str) -> Any:
    """Return the type at ``tp``'s child `part` (`_ANY` below free JSON)."""
    item, fields = _children(tp)
    if fields is None:
        return item
    if part not in fields:
        if item is _State:
            raise PointerError(
                f"{pointer!r} names {part!r}, which is not a section; the sections are "
                f"{', '.join(fields)}"
            )
        raise PointerError(
            f"{pointer!r} names {part!r}, which is not a field of {item.__name__}; "
            f"its fields are {', '.join(fields)}"
        )
    return fields[part]


@functools.lru_cache(maxsize=256)
def _cached_adapter(tp: Any) -> TypeAdapter[Any]:
    return TypeAdapter(tp)


def _adapter(tp: Any) -> TypeAdapter[Any]:
    try:
        return _cached_adapter(tp)
    except TypeError:  # an unhashable annotation: build it each time
        return TypeAdapter(tp)


def _describe(tp: Any) -> str:
    if tp is _State:
        return "the environment's sections"
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _validation_problem(err: ValidationError) -> str:
    first = err.errors(include_url=False)[0]
    where = "/".join(str(loc) for loc in first["loc"])
    return f"{first['msg']}{f' at {where}' if where else ''}"


def _validate_typed(tp: Any, value: JsonValue, pointer: str) -> JsonValue:
    """Validate `value` as `tp` in strict JSON mode and return it normalized (defaults filled)."""
    if tp is _ANY or tp is JsonValue:
        return value
    if tp is _SCALAR:
        raise PointerError(f"{pointer!r} names a location inside a scalar value; write its parent")
    adapter = _adapter(tp)
    try:
        parsed = adapter.validate_json(json.dumps(value), strict=True)
    except ValidationError as err:
        raise EnvironmentValidationError(
            f"the value {_brief(value)} for {pointer!r} does not fit {_describe(tp)} "
            f"({_validation_problem(err)}); write a value of that type"
        ) from err
    return cast(JsonValue, adapter.dump_python(parsed, mode="json"))


def _locate(state: JsonValue, pointer: str) -> JsonValue:
    """Return the value at `pointer` inside `state` (not a copy)."""
    node: JsonValue = state
    parts = _parse(pointer)
    for depth, part in enumerate(parts):
        if isinstance(node, dict):
            if part not in node:
                raise PointerError(
                    f"{pointer!r} names nothing: there is no key {part!r} at "
                    f"{_pointer(parts[:depth]) or 'the root'!r}"
                )
            node = node[part]
        elif isinstance(node, list):
            node = node[_index(node, part, pointer)]
        else:
            raise PointerError(
                f"{pointer!r} names nothing: {_pointer(parts[:depth])!r} holds "
                f"{_brief(node, 30)}, not an object or array"
            )
    return node
