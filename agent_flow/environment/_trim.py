"""Trimming a section's JSON under caps: the newest N items of each collection, L chars a string.

`_shape_of` reads the section models once into `_Shape`s, so that records (sections, plan
steps, file and artifact entries) are never elided while lists and dicts are. `_Trim`
rebuilds a section's data under an item cap and a string cap, counting what it elided and
shortened and measuring the longest collection and string, which bound the renderer's search.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any, Final, Literal, get_args, get_origin

from agent_flow._types import JsonObject, JsonValue
from agent_flow.environment._pointer import _is_model, _strip_optional
from agent_flow.environment.sections import _State


@dataclass(frozen=True)
class _Shape:
    """How a value renders: records are never elided; lists and dicts are collections."""

    kind: Literal["record", "collection", "scalar"]
    fields: dict[str, _Shape] = field(default_factory=dict)
    item: _Shape | None = None  # None: free JSON below


_JSON_SHAPE: Final = _Shape("collection")
_SCALAR_SHAPE: Final = _Shape("scalar")


def _shape_of(tp: Any) -> _Shape:
    if tp is JsonValue:
        return _JSON_SHAPE
    tp = _strip_optional(tp)
    if _is_model(tp):
        return _Shape(
            "record", fields={name: _shape_of(f.annotation) for name, f in tp.model_fields.items()}
        )
    origin = get_origin(tp)
    if origin is list:
        return _Shape("collection", item=_shape_of(get_args(tp)[0]))
    if origin is dict:
        return _Shape("collection", item=_shape_of(get_args(tp)[1]))
    return _SCALAR_SHAPE


_SECTION_SHAPES: Final[dict[str, _Shape]] = {
    name: _shape_of(f.annotation) for name, f in _State.model_fields.items()
}


class _Trim:
    """Rebuilds a section's JSON keeping the newest `item_cap` items and `string_cap` chars.

    It also measures the longest collection and string it walks through, which bound the
    searches for the caps. Written for speed: a workspace of 10,000 files goes through it.
    """

    def __init__(self, item_cap: int | None, string_cap: int | None) -> None:
        self.item_cap = item_cap
        self.string_cap = string_cap
        self.elided = 0
        self.shortened = 0
        self.longest_collection = 0
        self.longest_string = 0

    def value(self, value: JsonValue, shape: _Shape | None) -> JsonValue:
        if isinstance(value, str):
            return self.string(value)
        if isinstance(value, dict):
            if shape is not None and shape.kind == "record":
                return self.record(value, shape)
            return self.mapping(value, shape.item if shape else None)
        if isinstance(value, list):
            return self.sequence(value, shape.item if shape else None)
        return value

    def record(self, value: JsonObject, shape: _Shape) -> JsonObject:
        out: JsonObject = {}
        string_cap = self.string_cap
        for key, item in value.items():
            if isinstance(item, str):
                size = len(item)
                if not size:
                    continue
                if size > self.longest_string:
                    self.longest_string = size
                out[key] = item if string_cap is None or size <= string_cap else self.string(item)
            elif isinstance(item, dict | list):
                if item:
                    out[key] = self.value(item, shape.fields.get(key))
            elif item is not None:
                out[key] = item
        return out

    def sequence(self, items: list[JsonValue], shape: _Shape | None) -> JsonValue:
        size = len(items)
        if size > self.longest_collection:
            self.longest_collection = size
        cap = self.item_cap
        value = self.value
        if cap is None or size <= cap:
            return [value(item, shape) for item in items]
        hidden = size - cap
        self.elided += hidden
        kept = items[size - cap :] if cap else []
        return [f"… {hidden} earlier items", *(value(item, shape) for item in kept)]

    def mapping(self, entries: JsonObject, shape: _Shape | None) -> JsonValue:
        size = len(entries)
        if size > self.longest_collection:
            self.longest_collection = size
        cap = self.item_cap
        value = self.value
        if cap is None or size <= cap:
            return {key: value(item, shape) for key, item in entries.items()}
        hidden = size - cap
        self.elided += hidden
        kept = list(itertools.islice(reversed(entries.items()), cap))
        kept.reverse()
        marker = "…"
        keys = {key for key, _ in kept}
        while marker in keys:
            marker += "…"
        out: JsonObject = {marker: f"{hidden} earlier entries"}
        for key, item in kept:
            out[key] = value(item, shape)
        return out

    def string(self, text: str) -> str:
        size = len(text)
        if size > self.longest_string:
            self.longest_string = size
        cap = self.string_cap
        if cap is None or size <= cap:
            return text
        suffix = f"… [+{size - cap} chars]"
        if size - cap <= len(suffix):  # shortening would not make it shorter
            return text
        self.shortened += 1
        return text[:cap] + suffix
