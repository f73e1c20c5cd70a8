"""The environment as it was at an earlier version, rolled back through its change log.

A session stores its last environment and the log of changes that led there (pointer, old
value, new value). `environment_at` undoes the changes after a version, newest first, on the
plain JSON state. The log does not record the objects a set created on its way to its
pointer; `_Touches` infers them from when each object was last written or removed. A value
that was JSON ``null`` before a set is restored as absent (the log says "nothing" for both).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Sequence

from agent_flow._types import JsonObject, JsonValue
from agent_flow.environment import Environment
from agent_flow.errors import EnvironmentValidationError, UserError

__all__ = ["environment_at"]


def _parse_pointer(pointer: str) -> list[str]:
    return [p.replace("~1", "/").replace("~0", "~") for p in pointer.split("/")[1:]]


def _walk(state: JsonObject, parts: list[str], *, create: bool) -> JsonValue:
    """The node at `parts`; with `create`, missing objects on the way are made."""
    node: JsonValue = state
    for part in parts:
        if isinstance(node, list):
            node = node[int(part)]
        elif isinstance(node, dict):
            if part not in node and create:
                node[part] = {}
            node = node[part]
        else:
            raise LookupError(part)
    return node


class _Touches:
    """When each object of the state was written to, or removed, by the recorded changes.

    A set that found nothing at its pointer (``old`` is None) also created the missing objects
    on its way, which the log does not say: an object was created by the set at version ``v``
    when nothing was written at or below it since it was last removed (or ever) before ``v``.
    """

    def __init__(self, changes: Sequence[JsonObject]) -> None:
        self.writes: dict[tuple[str, ...], list[int]] = {}
        self.removals: dict[tuple[str, ...], list[int]] = {}
        for change in changes:
            parts = tuple(_parse_pointer(str(change["pointer"])))
            version = int(str(change["version"]))
            deleted = change["op"] == "delete"
            for depth in range(1, len(parts) + 1):
                table = self.removals if deleted and depth == len(parts) else self.writes
                table.setdefault(parts[:depth], []).append(version)

    def created_by(self, prefix: tuple[str, ...], version: int) -> bool:
        """Whether the set at `version` created the object at `prefix`."""
        written = max((v for v in self.writes.get(prefix, ()) if v < version), default=-1)
        removed = max(
            (
                v
                for depth in range(1, len(prefix) + 1)
                for v in self.removals.get(prefix[:depth], ())
                if v < version
            ),
            default=-1,
        )
        return removed >= written


def _undo(state: JsonObject, change: JsonObject, touches: _Touches) -> None:
    """Undo one recorded change on the plain JSON state (`_Touches` says what a set created)."""
    op, old, version = change["op"], change["old"], int(str(change["version"]))
    parts = _parse_pointer(str(change["pointer"]))
    if not parts:
        if isinstance(old, dict):
            state.clear()
            state.update(copy.deepcopy(old))
        return
    node = _walk(state, parts[:-1], create=op == "delete")
    last = parts[-1]
    if isinstance(node, list):
        index = int(last)
        if op == "delete":
            node.insert(index, copy.deepcopy(old))
        elif old is None and index == len(node) - 1:
            node.pop()  # an append
        else:
            node[index] = copy.deepcopy(old)
    elif isinstance(node, dict):
        if op == "set" and old is None:
            node.pop(last, None)  # typed fields come back as their defaults
            # Sections (depth 1) always exist; deeper objects this set created go with it.
            for depth in range(len(parts) - 1, 1, -1):
                parent = _walk(state, parts[: depth - 1], create=False)
                if (
                    not isinstance(parent, dict)
                    or parent.get(parts[depth - 1]) != {}
                    or not touches.created_by(tuple(parts[:depth]), version)
                ):
                    break
                del parent[parts[depth - 1]]
        else:
            node[last] = copy.deepcopy(old)


def environment_at(final: Environment, version: int) -> tuple[Environment, bool]:
    """Return `final` as it was at `version`, and whether the change log reached back that far."""
    if version >= final.version:
        return final, True
    payload = json.loads(final.to_json())
    changes = [c for c in payload["changes"] if c["version"] > version]
    reached = bool(changes) and changes[0]["version"] == version + 1
    state: JsonObject = payload["state"]
    touches = _Touches(payload["changes"])
    try:
        for change in reversed(changes):
            _undo(state, change, touches)
        payload.update(version=version if reached else final.version, changes=[])
        return Environment.from_json(json.dumps(payload)), reached
    except (LookupError, ValueError, TypeError, UserError, EnvironmentValidationError):
        return final, False
