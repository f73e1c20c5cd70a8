"""Applying one write to the environment's plain JSON state, with a way to undo it.

`Environment` runs each write as a transaction: it applies every step (`_set_at`,
`_apply_delete`), each validated against the type at its location only, checks the schemas,
and undoes the applied steps in reverse if anything fails. Each step returns an `_Applied`:
what changed, and how to put it back.

The type at a location comes from the section models, and below ``/extensions/<name>`` from
the extension's registered model, when it has one (`typed`: name → model); other extensions
hold free JSON.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, cast

from agent_flow._types import JsonObject, JsonValue
from agent_flow.environment._pointer import (
    _brief,
    _child_type,
    _copy,
    _index,
    _is_model,
    _parse,
    _pointer,
    _strip_optional,
    _validate_typed,
)
from agent_flow.environment.sections import _State
from agent_flow.errors import PointerError, UserError


@dataclass
class _Applied:
    """A change applied to the state but not yet committed, with how to undo it."""

    op: Literal["set", "delete"]
    parts: tuple[str, ...]
    old: JsonValue | None
    new: JsonValue | None
    undo: Callable[[], object]


def _reinsert(
    container: JsonObject, key: str, value: JsonValue, position: int
) -> Callable[[], object]:
    def undo() -> None:
        items = list(container.items())
        items.insert(position, (key, value))
        container.clear()
        container.update(items)

    return undo


#: Extension name → the model its value must fit (see `Environment.register_extension`).
_Typed = Mapping[str, Any]


def _type_below(tp: Any, parts: tuple[str, ...], depth: int, pointer: str, typed: _Typed) -> Any:
    """The type at ``parts[depth]`` (a child of `tp`): an extension's model when registered."""
    if depth == 1 and parts[0] == "extensions" and parts[1] in typed:
        return typed[parts[1]]
    return _child_type(tp, parts[depth], pointer)


def _set_at(
    state: JsonObject,
    parts: tuple[str, ...],
    data: JsonValue,
    pointer: str,
    typed: _Typed,
) -> _Applied:
    """Write `data` at `parts` (below the root) inside `state`; missing objects are created."""
    node: JsonValue = state
    tp: Any = _State
    for depth, part in enumerate(parts[:-1]):
        child_tp = _type_below(tp, parts, depth, pointer, typed)
        if isinstance(node, dict):
            if part not in node:
                return _create_parents(node, parts, depth, child_tp, data, pointer)
            node = node[part]
        elif isinstance(node, list):
            node = node[_index(node, part, pointer)]
        else:
            raise PointerError(
                f"cannot write {pointer!r}: {_pointer(parts[:depth])!r} holds "
                f"{_brief(node, 30)}, not an object or array"
            )
        tp = child_tp
    last = parts[-1]
    target_tp = _type_below(tp, parts, len(parts) - 1, pointer, typed)
    if isinstance(node, dict):
        container = node
        normalized = _validate_typed(target_tp, data, pointer)
        if last in container:
            old = container[last]
            container[last] = normalized

            def put_back() -> None:
                container[last] = old

            return _Applied("set", parts, old, _copy(normalized), put_back)
        container[last] = normalized
        return _Applied(
            "set", parts, None, _copy(normalized), functools.partial(container.pop, last)
        )
    if isinstance(node, list):
        items = node
        if last == "-":
            normalized = _validate_typed(target_tp, data, pointer)
            items.append(normalized)
            resolved = (*parts[:-1], str(len(items) - 1))
            return _Applied("set", resolved, None, _copy(normalized), items.pop)
        index = _index(items, last, pointer)
        normalized = _validate_typed(target_tp, data, pointer)
        old = items[index]
        items[index] = normalized

        def put_item_back() -> None:
            items[index] = old

        return _Applied("set", parts, old, _copy(normalized), put_item_back)
    raise PointerError(
        f"cannot write {pointer!r}: {_pointer(parts[:-1])!r} holds {_brief(node, 30)}, "
        "not an object or array"
    )


def _create_parents(
    container: JsonObject,
    parts: tuple[str, ...],
    depth: int,
    tp: Any,
    data: JsonValue,
    pointer: str,
) -> _Applied:
    """Write `data` at `parts`, creating the objects from ``parts[depth]`` down."""
    chain = data
    for part in reversed(parts[depth + 1 :]):
        chain = {part: chain}
    normalized = _validate_typed(tp, chain, pointer)
    container[parts[depth]] = normalized
    new: JsonValue = normalized
    for part in parts[depth + 1 :]:
        new = cast(JsonObject, new)[part]
    return _Applied("set", parts, None, _copy(new), functools.partial(container.pop, parts[depth]))


def _apply_delete(state: JsonObject, pointer: str, typed: _Typed) -> _Applied:
    """Remove the value at `pointer` from `state` (a dict entry or an array item)."""
    parts = _parse(pointer)
    if not parts:
        raise UserError(
            "cannot delete the whole environment (pointer ''); set '' to a new state instead"
        )
    node: JsonValue = state
    tp: Any = _State
    for depth, part in enumerate(parts[:-1]):
        tp = _type_below(tp, parts, depth, pointer, typed)
        if isinstance(node, dict):
            if part not in node:
                raise PointerError(
                    f"cannot delete {pointer!r}: there is no key {part!r} at "
                    f"{_pointer(parts[:depth]) or 'the root'!r}"
                )
            node = node[part]
        elif isinstance(node, list):
            node = node[_index(node, part, pointer)]
        else:
            raise PointerError(
                f"cannot delete {pointer!r}: {_pointer(parts[:depth])!r} holds "
                f"{_brief(node, 30)}, not an object or array"
            )
    last = parts[-1]
    owner = _strip_optional(tp)
    if _is_model(owner):
        raise UserError(
            f"cannot delete {pointer!r}: it is a field of {owner.__name__}, which always "
            "exists; set it to its default instead"
        )
    if isinstance(node, dict):
        container = node
        if last not in container:
            raise PointerError(f"cannot delete {pointer!r}: it names nothing")
        if next(reversed(container)) == last:
            old = container.pop(last)
            undo: Callable[[], object] = functools.partial(container.__setitem__, last, old)
        else:
            position = list(container).index(last)
            old = container.pop(last)
            undo = _reinsert(container, last, old, position)
        return _Applied("delete", parts, old, None, undo)
    if isinstance(node, list):
        index = _index(node, last, pointer)
        old = node.pop(index)
        return _Applied("delete", parts, old, None, functools.partial(node.insert, index, old))
    raise PointerError(
        f"cannot delete {pointer!r}: {_pointer(parts[:-1])!r} holds {_brief(node, 30)}, "
        "not an object or array"
    )
