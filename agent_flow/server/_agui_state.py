"""The AG-UI shared state: the Environment, its deltas, and the rule for a client's own state.

The state an AG-UI client holds is the environment's state (``system``, ``task``,
``knowledge``, ``workspace``, ``extensions``) plus ``version``, the environment's version
(`Environment.version`). A stream opens with a ``STATE_SNAPSHOT`` of it; `StateReplica` then
turns the environment's change log (`Environment.changes`) into RFC 6902 ``STATE_DELTA``
patches, checked against a replica of what the client holds, so applying every delta to the
snapshot gives the server's state; each delta sets ``/version`` too. When the log no longer
reaches back far enough, or a write cannot be followed, a fresh snapshot is sent.

A client's own ``state`` (in `RunAgentInput`) is applied only when it was based on the
environment as it is now (`plan_client_state`):

- absent, null or ``{}``: nothing to apply;
- ``version`` equal to the environment's version (or no ``version`` at all while the
  environment was never written, version 0: a new thread's initial state): each section the
  client sends replaces the server's, written key by key (a key it left out of a section is
  deleted, a list is replaced whole; a section it leaves out is kept). Every write is checked
  as any write to the environment (typed sections, JSON schemas); if one is refused nothing is
  written and the request is answered 422 ``invalid_state`` (`apply_client_state`);
- any other ``version`` (the client is behind, or names a version that never was): nothing is
  written, the run goes on with the server's state, the stream's opening snapshot gives it
  to the client and a ``CUSTOM`` event ``state_not_applied`` says why.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from typing import Any, Literal

from ag_ui.core import BaseEvent, StateDeltaEvent, StateSnapshotEvent

from agent_flow.environment import Environment, EnvironmentChange
from agent_flow.errors import AgentFlowError
from agent_flow.server._errors import ApiError

__all__ = [
    "SECTIONS",
    "VERSION_KEY",
    "StatePlan",
    "StateReplica",
    "Write",
    "agui_state",
    "apply_client_state",
    "plan_client_state",
]

_Json = Any

#: The key of the environment's version in the AG-UI state.
VERSION_KEY = "version"
#: The environment's sections: the other keys of the AG-UI state.
SECTIONS = ("system", "task", "knowledge", "workspace", "extensions")
_MISSING = object()


def agui_state(environment: Environment) -> dict[str, _Json]:
    """The AG-UI state of `environment`: its state and its ``version``."""
    state: dict[str, _Json] = json.loads(environment.to_json())["state"]
    state[VERSION_KEY] = environment.version
    return state


def _tokens(pointer: str) -> list[str]:
    if pointer == "":
        return []
    return [part.replace("~1", "/").replace("~0", "~") for part in pointer.split("/")[1:]]


def _pointer(tokens: list[str]) -> str:
    return "".join("/" + token.replace("~", "~0").replace("/", "~1") for token in tokens)


def _lookup(document: _Json, tokens: list[str]) -> _Json:
    node = document
    for token in tokens:
        if isinstance(node, dict) and token in node:
            node = node[token]
        elif isinstance(node, list) and token.isdigit() and int(token) < len(node):
            node = node[int(token)]
        else:
            return _MISSING
    return node


def _apply(document: _Json, operation: dict[str, _Json]) -> None:
    """Apply one add/replace/remove to `document` in place (the client's replica)."""
    tokens = _tokens(operation["path"])
    parent = _lookup(document, tokens[:-1])
    last = tokens[-1]
    value = copy.deepcopy(operation.get("value"))
    if isinstance(parent, list):
        index = len(parent) if last == "-" else int(last)
        if operation["op"] == "add":
            parent.insert(index, value)
        elif operation["op"] == "replace":
            parent[index] = value
        else:
            del parent[index]
    elif operation["op"] == "remove":
        del parent[last]
    else:
        parent[last] = value


class StateReplica:
    """What the client holds of the environment's state, and the events that keep it in step.

    Args:
        environment: The session's environment (read when it moves).
    """

    def __init__(self, environment: Environment) -> None:
        self.environment = environment
        self.replica = agui_state(environment)
        self.version = environment.version

    def snapshot(self) -> StateSnapshotEvent:
        """A ``STATE_SNAPSHOT`` of what the client holds."""
        return StateSnapshotEvent(snapshot=copy.deepcopy(self.replica))

    def _resync(self) -> list[BaseEvent]:
        self.replica = agui_state(self.environment)
        return [self.snapshot()]

    def events(self) -> list[BaseEvent]:
        """A ``STATE_DELTA`` (or a new snapshot) for what changed since the last one."""
        if self.environment.version == self.version:
            return []
        changes = self.environment.changes(since_version=self.version)
        first_expected = self.version + 1
        self.version = self.environment.version
        # The log was trimmed past what the client has, or the whole state was replaced.
        if (
            not changes
            or changes[0].version != first_expected
            or any(not _tokens(change.pointer) for change in changes)
        ):
            return self._resync()
        operations: list[dict[str, _Json]] = []
        for change in changes:
            patch = self._operations(change)
            if patch is None:
                return self._resync()
            for operation in patch:
                _apply(self.replica, operation)
                operations.append(operation)
        version = {"op": "replace", "path": "/" + VERSION_KEY, "value": self.version}
        _apply(self.replica, version)
        operations.append(version)
        return [StateDeltaEvent(delta=operations)]

    def _operations(self, change: EnvironmentChange) -> list[dict[str, _Json]] | None:
        """The patch for one change (None: the replica cannot follow; send a snapshot)."""
        tokens = _tokens(change.pointer)
        if change.op == "delete":
            if _lookup(self.replica, tokens) is _MISSING:
                return []
            return [{"op": "remove", "path": change.pointer}]
        parent = _lookup(self.replica, tokens[:-1])
        if parent is _MISSING:
            # Written under containers the replica lacks: add the highest missing one whole.
            depth = next(
                n for n in range(1, len(tokens)) if _lookup(self.replica, tokens[:n]) is _MISSING
            )
            missing = tokens[:depth]
            value = _lookup(agui_state(self.environment), missing)
            if value is _MISSING:  # gone again since: nothing to tell
                return []
            return [{"op": "add", "path": _pointer(missing), "value": value}]
        if isinstance(parent, list):
            if not tokens[-1].isdigit():
                return None
            index = int(tokens[-1])
            op = "replace" if index < len(parent) else "add"
            return [{"op": op, "path": change.pointer, "value": change.new}]
        if not isinstance(parent, dict):
            return None
        return [{"op": "add", "path": change.pointer, "value": change.new}]


# -- the client's own state -------------------------------------------------------------------


@dataclass(frozen=True)
class Write:
    """One write of the client's state: set `value` at `pointer`, or delete it."""

    pointer: str
    op: Literal["set", "delete"]
    value: _Json = None


@dataclass(frozen=True)
class StatePlan:
    """What to do with a client's state (`plan_client_state`).

    Attributes:
        writes: The writes that make the environment what the client sent (empty: none).
        applied: Whether the client's state is taken (False: it was based on another
            version, and `reason` says so).
        client_version: The version the client named (None: none).
        reason: Why it is not taken ("" when it is).
    """

    writes: tuple[Write, ...] = ()
    applied: bool = True
    client_version: int | None = None
    reason: str = ""


def _same(a: _Json, b: _Json) -> bool:
    """JSON equality (``1``, ``1.0`` and ``True`` are three values here, as in JSON)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


def _diff(old: _Json, new: _Json, tokens: list[str]) -> list[Write]:
    """The writes that turn `old` into `new` at `tokens`: objects key by key, the rest whole."""
    if _same(old, new):
        return []
    if isinstance(old, dict) and isinstance(new, dict):
        writes = [Write(_pointer([*tokens, key]), "delete") for key in old if key not in new]
        for key, value in new.items():
            if key in old:
                writes += _diff(old[key], value, [*tokens, key])
            else:
                writes.append(Write(_pointer([*tokens, key]), "set", copy.deepcopy(value)))
        return writes
    return [Write(_pointer(tokens), "set", copy.deepcopy(new))]


def plan_client_state(server: dict[str, _Json], version: int, client: _Json) -> StatePlan:
    """Decide what a client's `state` does to the environment whose state is `server`.

    Args:
        server: The environment's state (its five sections).
        version: The environment's version.
        client: The ``state`` of the run input.

    Raises:
        ApiError: 422 when `client` is not an object, its ``version`` is not an integer, or
            it has a key that is neither a section nor ``version``.
    """
    if client is None or client == {}:
        return StatePlan()
    if not isinstance(client, dict):
        raise _invalid("state must be a JSON object: the environment's sections and its version")
    named = client.get(VERSION_KEY)
    if named is not None and (not isinstance(named, int) or isinstance(named, bool)):
        raise _invalid(f"state.version must be an integer (the version you hold), not {named!r}")
    unknown = sorted(set(client) - {*SECTIONS, VERSION_KEY})
    if unknown:
        raise _invalid(
            f"state has no section {unknown[0]!r}; its keys are {', '.join(SECTIONS)} and "
            f"{VERSION_KEY}"
        )
    based_on = 0 if named is None else named
    if based_on != version:
        why = (
            "it has no version and the environment was written already"
            if named is None
            else f"it is based on version {named}, and the environment is at {version}"
        )
        return StatePlan(applied=False, client_version=named, reason=why)
    writes: list[Write] = []
    for section in SECTIONS:
        if section in client:
            writes += _diff(server.get(section), client[section], [section])
    return StatePlan(writes=tuple(writes), client_version=named)


def _invalid(message: str) -> ApiError:
    return ApiError(422, "invalid_state", message, field="state")


def _write(environment: Environment, writes: tuple[Write, ...]) -> None:
    for write in writes:
        if write.op == "delete":
            environment.delete(write.pointer)
        else:
            environment.set(write.pointer, write.value)


def apply_client_state(environment: Environment, plan: StatePlan) -> None:
    """Make the writes of `plan`: all of them, or (422 ``invalid_state``) none.

    They are tried on a copy first, so a refused write leaves `environment` untouched.
    """
    if not plan.writes:
        return
    trial = Environment.from_json(environment.to_json())
    try:
        _write(trial, plan.writes)
    except AgentFlowError as err:
        raise _invalid(f"the state cannot be written: {err}") from None
    _write(environment, plan.writes)
