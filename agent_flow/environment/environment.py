"""The Environment: the agent's typed, versioned working memory, and its rendering under a budget.

This module owns the section models (`SystemState`, `TaskState`, `KnowledgeBase`,
`WorkspaceState` and their parts), `EnvironmentChange`, `Environment` with its builder, and
the budgeted rendering the model reads (`Environment.render`, `Environment.render_report`).

State. The environment is kept as plain JSON data: one object with the keys ``system``,
``task``, ``knowledge``, ``workspace`` (typed sections, always stored complete, defaults
included) and ``extensions`` (free JSON, one value per extension name). Reads and writes use
RFC 6901 pointers (``/task/status``, ``/knowledge/discovered_facts/-``,
``/extensions/datasets/sales``); the typed views (``env.task``) are pydantic models validated
once per section version and cached.

Writes. Every write goes through `Environment.set`, `Environment.delete`,
`Environment.update_section`, `Environment.set_extension` or a section property setter
(``env.task = ...``); there is no other way to change the state, so every change is recorded.
A write into a typed section is validated (in strict JSON mode) against the type at its
location only, so adding a file to a workspace of 10,000 files validates one `FileInfo`, not
the workspace. Optional JSON schemas (one for the whole state, one per extension) are checked
after the write; a write that fails any check is undone, and the state, the version and the
change log stay exactly as they were.

Errors. A malformed pointer, or one that names nothing, raises `PointerError`; a value that is
not JSON, deleting a typed field or a section, or a negative limit raises `UserError`; a value
that does not fit a typed section, a schema, or the model given to `get_extension` raises
`EnvironmentValidationError`.

An Environment is not thread-safe: use it from one thread (one agent loop) at a time.
"""

from __future__ import annotations

import copy
import functools
import itertools
import json
import math
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum, StrEnum
from types import UnionType
from typing import (
    Any,
    Final,
    Literal,
    NoReturn,
    Self,
    TypeAlias,
    TypeVar,
    Union,
    cast,
    get_args,
    get_origin,
)

import jsonpointer
import jsonschema.exceptions
import jsonschema.validators
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from agent_flow._types import JsonObject, JsonValue
from agent_flow.errors import EnvironmentValidationError, PointerError, UserError
from agent_flow.tokens import TokenCounter

__all__ = [
    "DEFAULT_MAX_CHANGES",
    "DROP_ORDER",
    "RENDER_ORDER",
    "ArtifactInfo",
    "Environment",
    "EnvironmentBuilder",
    "EnvironmentChange",
    "FileInfo",
    "KnowledgeBase",
    "PlanStep",
    "RenderReport",
    "SectionName",
    "SectionRender",
    "SystemState",
    "TaskState",
    "TaskStatus",
    "TypedSectionName",
    "WorkspaceState",
]

#: How many changes an Environment keeps by default; older ones are dropped first.
DEFAULT_MAX_CHANGES: Final = 10_000

SectionName: TypeAlias = Literal["system", "task", "knowledge", "workspace", "extensions"]
TypedSectionName: TypeAlias = Literal["system", "task", "knowledge", "workspace"]

#: The order sections appear in the rendered text.
RENDER_ORDER: Final[tuple[SectionName, ...]] = (
    "system",
    "task",
    "knowledge",
    "workspace",
    "extensions",
)
#: The order sections are dropped in when even fully degraded they do not fit.
DROP_ORDER: Final[tuple[SectionName, ...]] = (
    "extensions",
    "workspace",
    "knowledge",
    "system",
    "task",
)

_SECTION_CONFIG = ConfigDict(frozen=True, extra="forbid")


class TaskStatus(StrEnum):
    """Where the task stands."""

    NOT_STARTED = "not_started"
    IN_PROGRESS = "in_progress"
    WAITING = "waiting"
    COMPLETED = "completed"
    FAILED = "failed"


class PlanStep(BaseModel):
    """One step of the task's plan.

    Attributes:
        description: What the step does.
        completed: Whether it is done.
        result: What it produced, once done.
    """

    model_config = _SECTION_CONFIG

    description: str
    completed: bool = False
    result: str | None = None


class SystemState(BaseModel):
    """Facts about the machine the agent runs on.

    Attributes:
        working_directory: The directory the agent works in.
        permissions: What the agent may do (``"read"``, ``"write"``, ...).
        resources: Named limits and resources (``{"memory_limit": "8GB"}``).
    """

    model_config = _SECTION_CONFIG

    working_directory: str = ""
    permissions: list[str] = Field(default_factory=list)
    resources: dict[str, str] = Field(default_factory=dict)


class TaskState(BaseModel):
    """The task and its progress; the plan lives here.

    Attributes:
        objective: What the agent is asked to achieve.
        status: Where the task stands.
        steps_completed: How many steps are done.
        steps_total: How many steps are planned.
        current_step: What the agent is doing now.
        plan: The steps, in order.
    """

    model_config = _SECTION_CONFIG

    objective: str = ""
    status: TaskStatus = TaskStatus.NOT_STARTED
    steps_completed: int = 0
    steps_total: int = 0
    current_step: str | None = None
    plan: list[PlanStep] = Field(default_factory=list)


class KnowledgeBase(BaseModel):
    """What the agent has learned.

    Attributes:
        discovered_facts: Facts, oldest first.
        sources: Where knowledge came from, by name (``{"docs": "https://..."}``).
        key_concepts: Concepts worth keeping in mind.
        extra: Anything else, as JSON.
    """

    model_config = _SECTION_CONFIG

    discovered_facts: list[str] = Field(default_factory=list)
    sources: dict[str, str] = Field(default_factory=dict)
    key_concepts: list[str] = Field(default_factory=list)
    extra: dict[str, JsonValue] = Field(default_factory=dict)


class FileInfo(BaseModel):
    """What the agent knows about one file or directory of the workspace.

    Attributes:
        kind: File or directory.
        size: Size in bytes, when known.
        summary: A short description of the content.
    """

    model_config = _SECTION_CONFIG

    kind: Literal["file", "directory"] = "file"
    size: int | None = None
    summary: str | None = None


class ArtifactInfo(BaseModel):
    """Something the agent produced.

    Attributes:
        name: The artifact's name.
        path: Where it is stored, if it is a file.
        description: What it is.
    """

    model_config = _SECTION_CONFIG

    name: str
    path: str | None = None
    description: str = ""


class WorkspaceState(BaseModel):
    """The files the agent knows about and what it produced.

    Attributes:
        files: By path relative to the workspace root, in the order they were first added.
        artifacts: What the agent produced, oldest first.
        extra: Anything else, as JSON.
    """

    model_config = _SECTION_CONFIG

    files: dict[str, FileInfo] = Field(default_factory=dict)
    artifacts: list[ArtifactInfo] = Field(default_factory=list)
    extra: dict[str, JsonValue] = Field(default_factory=dict)


class _State(BaseModel):
    """The whole state; the root type of every pointer."""

    model_config = _SECTION_CONFIG

    system: SystemState = Field(default_factory=SystemState)
    task: TaskState = Field(default_factory=TaskState)
    knowledge: KnowledgeBase = Field(default_factory=KnowledgeBase)
    workspace: WorkspaceState = Field(default_factory=WorkspaceState)
    extensions: dict[str, JsonValue] = Field(default_factory=dict)


_SECTION_MODELS: Final[dict[str, type[BaseModel]]] = {
    "system": SystemState,
    "task": TaskState,
    "knowledge": KnowledgeBase,
    "workspace": WorkspaceState,
}
_DEFAULT_STATE: Final[JsonObject] = _State().model_dump(mode="json")


class EnvironmentChange(BaseModel):
    """One recorded change of the environment.

    Attributes:
        version: The environment's version right after this change (the first change is 1).
        op: ``"set"`` or ``"delete"``.
        pointer: Where: the pointer as written, except that an append (``.../-``) is recorded
            with the index the value got.
        old: The value before, or None if there was none.
        new: The value after (for a set), or None (for a delete).
    """

    model_config = ConfigDict(frozen=True)

    version: int
    op: Literal["set", "delete"]
    pointer: str
    old: JsonValue | None = None
    new: JsonValue | None = None


class SectionRender(BaseModel):
    """How one non-empty section came out of a render.

    Attributes:
        name: The section.
        tokens: Tokens of its block as rendered (header line included; the blank line between
            blocks is not), or of its one-line marker when dropped; 0 when left out entirely.
        elided_items: List items and dict entries replaced by "earlier ..." markers.
        shortened_strings: Strings cut short with a "… [+N chars]" marker.
        dropped: Whether the section was left out (replaced by a marker, if one fit).
    """

    model_config = ConfigDict(frozen=True)

    name: SectionName
    tokens: int
    elided_items: int = 0
    shortened_strings: int = 0
    dropped: bool = False


class RenderReport(BaseModel):
    """The rendered environment and what it took to fit the budget.

    Attributes:
        text: What the model reads; its token count never exceeds `max_tokens`.
        tokens: ``counter.count(text)``.
        max_tokens: The budget.
        sections: The non-empty sections, in render order.
        item_cap: The newest items each list and dict kept, or None if nothing was elided.
        string_cap: The characters each string kept, or None if no string was shortened.
    """

    model_config = ConfigDict(frozen=True)

    text: str
    tokens: int
    max_tokens: int
    sections: tuple[SectionRender, ...] = ()
    item_cap: int | None = None
    string_cap: int | None = None

    @property
    def dropped(self) -> list[SectionName]:
        """The sections left out, in render order."""
        return [s.name for s in self.sections if s.dropped]

    @property
    def degraded(self) -> bool:
        """Whether anything was elided, shortened or dropped."""
        return any(s.dropped or s.elided_items or s.shortened_strings for s in self.sections)


# -- JSON values and pointers ----------------------------------------------------------------


def _brief(value: object, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _json_copy(value: object, pointer: str) -> JsonValue:
    """Return a deep copy of `value` as plain JSON data (models dumped, enums by value)."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str):
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


# -- writes ------------------------------------------------------------------------------------


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


def _make_validator(schema: JsonObject, what: str) -> Any:
    cls = jsonschema.validators.validator_for(schema)
    try:
        cls.check_schema(schema)
    except jsonschema.exceptions.SchemaError as err:
        raise UserError(
            f"the JSON schema for {what} is invalid ({err.message}); fix the schema"
        ) from err
    return cls(schema)


_M = TypeVar("_M")
_S = TypeVar("_S", bound=BaseModel)


class Environment:
    """The agent's working memory: typed sections plus free extensions, versioned.

    Build one with `Environment.builder()` or the constructor (every argument optional).

    Reading: ``env.get("/task/status")`` returns a copy of the JSON at a pointer;
    ``env.task`` (and ``system``, ``knowledge``, ``workspace``) return frozen, validated
    models, cached until that section changes. They are read-only snapshots all the way
    down: their lists and dicts refuse in-place changes with a `TypeError` (a silent edit of
    a shared snapshot would be lost and would mislead every later reader). To change
    something, write; to get a mutable copy, use ``copy.deepcopy`` or
    ``model_copy(deep=True)``.

    Writing (each recorded as one `EnvironmentChange`, bumping `version` by one):
    ``env.set(pointer, value)`` (``-`` appends to an array; missing parent objects are
    created), ``env.delete(pointer)``, ``env.update_section("task", status=...)`` (several
    fields at once, all or nothing), ``env.task = TaskState(...)`` (a property setter is a
    set of ``/task``), ``env.set_extension(name, value)``.

    Args:
        system: The system section (model or JSON object); defaults to an empty one.
        task: The task section.
        knowledge: The knowledge section.
        workspace: The workspace section.
        extensions: Initial extensions by name (models are stored as their JSON).
        schema: A JSON schema the whole state (an object with the five section keys) must
            satisfy after every write; checking it costs time proportional to the state on
            every write, so prefer `extension_schemas` where they suffice.
        extension_schemas: JSON schemas by extension name; an extension, when present, must
            satisfy its schema after every write.
        max_changes: How many changes `changes` keeps; the oldest are dropped first.

    Raises:
        UserError: A section does not fit its model, a schema is invalid, or `max_changes`
            is negative.
        EnvironmentValidationError: The initial state breaks a schema.
    """

    def __init__(
        self,
        *,
        system: SystemState | JsonObject | None = None,
        task: TaskState | JsonObject | None = None,
        knowledge: KnowledgeBase | JsonObject | None = None,
        workspace: WorkspaceState | JsonObject | None = None,
        extensions: Mapping[str, BaseModel | JsonValue] | None = None,
        schema: JsonObject | None = None,
        extension_schemas: Mapping[str, JsonObject] | None = None,
        max_changes: int = DEFAULT_MAX_CHANGES,
    ) -> None:
        raw: JsonObject = {}
        for name, value in (
            ("system", system),
            ("task", task),
            ("knowledge", knowledge),
            ("workspace", workspace),
        ):
            if value is not None:
                raw[name] = _json_copy(value, f"/{name}")
        if extensions is not None:
            raw["extensions"] = {
                str(key): _json_copy(value, _pointer(["extensions", str(key)]))
                for key, value in extensions.items()
            }
        self._init(
            raw,
            schema=schema,
            extension_schemas=extension_schemas,
            max_changes=max_changes,
            version=0,
            changes=(),
        )

    def _init(
        self,
        raw: JsonObject,
        *,
        schema: JsonObject | None,
        extension_schemas: Mapping[str, JsonObject] | None,
        max_changes: int,
        version: int,
        changes: Iterable[EnvironmentChange],
    ) -> None:
        if max_changes < 0:
            raise UserError(f"max_changes={max_changes} is negative; pass 0 or more")
        try:
            state = _validate_typed(_State, raw, "")
        except EnvironmentValidationError as err:
            raise UserError(f"the initial environment is invalid: {err}") from err
        self._state: JsonObject = cast(JsonObject, state)
        self._version = version
        self._section_versions: dict[str, int] = dict.fromkeys(RENDER_ORDER, version)
        self._log: deque[EnvironmentChange] = deque(changes, maxlen=max_changes)
        self._schema = cast(JsonObject, _copy(schema)) if schema is not None else None
        self._validator = (
            _make_validator(self._schema, "the environment") if self._schema is not None else None
        )
        self._extension_schemas: dict[str, JsonObject] = {
            name: cast(JsonObject, _copy(s)) for name, s in (extension_schemas or {}).items()
        }
        self._extension_validators = {
            name: _make_validator(s, f"extension {name!r}")
            for name, s in self._extension_schemas.items()
        }
        self._views: dict[str, tuple[int, BaseModel]] = {}
        self._renderer = _Renderer()
        self._check_schemas([_Applied("set", (), None, None, lambda: None)])

    # -- construction and persistence ---------------------------------------------------

    @classmethod
    def builder(cls) -> EnvironmentBuilder:
        """Return a builder: ``Environment.builder().task(...).extension(...).build()``."""
        return EnvironmentBuilder()

    def to_json(self) -> str:
        """Return the state, version, schemas, change limit and change log as JSON text."""
        payload = {
            "format": 1,
            "version": self._version,
            "state": self._state,
            "schema": self._schema,
            "extension_schemas": self._extension_schemas,
            "max_changes": self._log.maxlen,
            "changes": [
                {"version": c.version, "op": c.op, "pointer": c.pointer, "old": c.old, "new": c.new}
                for c in self._log
            ],
        }
        return json.dumps(payload, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> Environment:
        """Rebuild an Environment from `to_json` output, exactly as it was.

        Raises:
            UserError: `text` is not an environment written by `to_json`.
            EnvironmentValidationError: The stored state breaks its stored schemas.
        """
        try:
            snapshot = _Snapshot.model_validate(json.loads(text))
        except (ValueError, ValidationError) as err:
            raise UserError(
                f"the text {_brief(text)} is not an environment saved by Environment.to_json "
                f"({err}); pass to_json output unchanged"
            ) from err
        env = cls.__new__(cls)
        env._init(
            snapshot.state,
            schema=snapshot.schema_,
            extension_schemas=snapshot.extension_schemas,
            max_changes=snapshot.max_changes,
            version=snapshot.version,
            changes=snapshot.changes,
        )
        return env

    # -- reading -------------------------------------------------------------------------

    @property
    def version(self) -> int:
        """The number of changes made since the environment was built (0 when new)."""
        return self._version

    @property
    def schema(self) -> JsonObject | None:
        """A copy of the whole-state JSON schema, if any."""
        return cast(JsonObject, _copy(self._schema)) if self._schema is not None else None

    @property
    def extension_schemas(self) -> dict[str, JsonObject]:
        """Copies of the per-extension JSON schemas."""
        return {name: cast(JsonObject, _copy(s)) for name, s in self._extension_schemas.items()}

    def get(self, pointer: str) -> JsonValue:
        """Return a copy of the value at `pointer` (``""`` is the whole state).

        Raises:
            PointerError: The pointer is malformed or names nothing.
        """
        return _copy(self._locate(pointer))

    def has(self, pointer: str) -> bool:
        """Return whether `pointer` names a value (a malformed pointer still raises).

        Raises:
            PointerError: The pointer is malformed.
        """
        try:
            self._locate(pointer)
        except PointerError:
            _parse(pointer)
            return False
        return True

    def _locate(self, pointer: str) -> JsonValue:
        node: JsonValue = self._state
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

    @property
    def system(self) -> SystemState:
        """The system section (a frozen snapshot); assigning to it sets ``/system``."""
        return self._view("system", SystemState)

    @system.setter
    def system(self, value: SystemState) -> None:
        self.set("/system", value)

    @property
    def task(self) -> TaskState:
        """The task section (a frozen snapshot); assigning to it sets ``/task``."""
        return self._view("task", TaskState)

    @task.setter
    def task(self, value: TaskState) -> None:
        self.set("/task", value)

    @property
    def knowledge(self) -> KnowledgeBase:
        """The knowledge section (a frozen snapshot); assigning to it sets ``/knowledge``."""
        return self._view("knowledge", KnowledgeBase)

    @knowledge.setter
    def knowledge(self, value: KnowledgeBase) -> None:
        self.set("/knowledge", value)

    @property
    def workspace(self) -> WorkspaceState:
        """The workspace section (a frozen snapshot); assigning to it sets ``/workspace``."""
        return self._view("workspace", WorkspaceState)

    @workspace.setter
    def workspace(self, value: WorkspaceState) -> None:
        self.set("/workspace", value)

    def _view(self, name: str, model: type[_S]) -> _S:
        version = self._section_versions[name]
        cached = self._views.get(name)
        if cached is not None and cached[0] == version:
            return cast(_S, cached[1])
        view = model.model_validate(self._state[name])
        _freeze(view)
        self._views[name] = (version, view)
        return view

    def get_extension(self, name: str, model: type[_M]) -> _M:
        """Return extension `name` validated as `model` (a pydantic model or any type).

        Raises:
            PointerError: There is no extension `name`.
            EnvironmentValidationError: The stored data does not fit `model`.
        """
        pointer = _pointer(["extensions", name])
        data = self._locate(pointer)
        try:
            return cast(_M, _adapter(model).validate_python(_copy(data)))
        except ValidationError as err:
            raise EnvironmentValidationError(
                f"extension {name!r} holds {_brief(data)}, which does not fit "
                f"{_describe(model)} ({_validation_problem(err)}); read it with the model it "
                "was written with"
            ) from err

    def changes(self, since_version: int = 0) -> list[EnvironmentChange]:
        """Return the recorded changes with a version above `since_version`, oldest first.

        Only the newest ``max_changes`` changes are kept; older ones are gone.
        """
        newer: list[EnvironmentChange] = []
        for change in reversed(self._log):
            if change.version <= since_version:
                break
            newer.append(change)
        newer.reverse()
        return newer

    # -- writing -------------------------------------------------------------------------

    def set(self, pointer: str, value: JsonValue | BaseModel) -> EnvironmentChange:
        """Write `value` at `pointer` and return the recorded change.

        ``-`` as the last token appends to an array; missing parent objects are created.
        In a typed section the value must fit the field's type exactly (no coercion).

        Raises:
            PointerError: The pointer is malformed, names a field the section lacks, or
                walks through a missing array item or a scalar.
            UserError: The value is not JSON.
            EnvironmentValidationError: The value does not fit the typed section or a schema.
        """
        return self._transact([functools.partial(self._apply_set, pointer, value)])[0]

    def delete(self, pointer: str) -> EnvironmentChange:
        """Remove the value at `pointer` (a dict entry or an array item).

        Raises:
            PointerError: The pointer is malformed or names nothing.
            UserError: The pointer names a section or a field of a typed model (set it to
                its default instead).
            EnvironmentValidationError: The removal would break a schema.
        """
        return self._transact([functools.partial(self._apply_delete, pointer)])[0]

    def update_section(self, name: TypedSectionName, **fields: object) -> list[EnvironmentChange]:
        """Set several fields of a typed section at once: all succeed or none does.

        Each field is recorded as its own change, e.g.
        ``env.update_section("task", status=TaskStatus.IN_PROGRESS, current_step="read")``.

        Raises:
            UserError: `name` is not a typed section.
            PointerError: A field is not a field of the section.
            EnvironmentValidationError: A value does not fit its field or a schema.
        """
        if name not in _SECTION_MODELS:
            raise UserError(
                f"{name!r} is not a typed section; use one of {', '.join(_SECTION_MODELS)}"
            )
        actions = [
            functools.partial(self._apply_set, _pointer([name, key]), value)
            for key, value in fields.items()
        ]
        return self._transact(actions)

    def set_extension(self, name: str, value: BaseModel | JsonValue) -> EnvironmentChange:
        """Store `value` (a model is stored as its JSON) as extension `name`.

        Raises:
            UserError: The value is not JSON.
            EnvironmentValidationError: The value breaks the extension's or the state's schema.
        """
        return self.set(_pointer(["extensions", name]), value)

    def _transact(self, actions: Sequence[Callable[[], _Applied]]) -> list[EnvironmentChange]:
        applied: list[_Applied] = []
        try:
            for action in actions:
                applied.append(action())
            self._check_schemas(applied)
        except BaseException:
            for step in reversed(applied):
                step.undo()
            raise
        changes = []
        for step in applied:
            self._version += 1
            # model_construct: the values are plain JSON already, and may be large.
            change = EnvironmentChange.model_construct(
                version=self._version,
                op=step.op,
                pointer=_pointer(step.parts),
                old=step.old,
                new=step.new,
            )
            self._log.append(change)
            for section in step.parts[:1] or RENDER_ORDER:
                self._section_versions[section] = self._version
            changes.append(change)
        return changes

    def _apply_set(self, pointer: str, value: object) -> _Applied:
        parts = _parse(pointer)
        data = _json_copy(value, pointer)
        if not parts:
            normalized = _validate_typed(_State, data, pointer)
            old_state = self._state
            self._state = cast(JsonObject, normalized)

            def restore() -> None:
                self._state = old_state

            return _Applied("set", parts, old_state, _copy(normalized), restore)
        node: JsonValue = self._state
        tp: Any = _State
        for depth, part in enumerate(parts[:-1]):
            child_tp = _child_type(tp, part, pointer)
            if isinstance(node, dict):
                if part not in node:
                    return self._create_parents(node, parts, depth, child_tp, data, pointer)
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
        target_tp = _child_type(tp, last, pointer)
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
        self,
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
        return _Applied(
            "set", parts, None, _copy(new), functools.partial(container.pop, parts[depth])
        )

    def _apply_delete(self, pointer: str) -> _Applied:
        parts = _parse(pointer)
        if not parts:
            raise UserError(
                "cannot delete the whole environment (pointer ''); set '' to a new state instead"
            )
        node: JsonValue = self._state
        tp: Any = _State
        for depth, part in enumerate(parts[:-1]):
            tp = _child_type(tp, part, pointer)
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

    def _check_schemas(self, applied: list[_Applied]) -> None:
        if self._validator is not None:
            error = jsonschema.exceptions.best_match(self._validator.iter_errors(self._state))
            if error is not None:
                raise EnvironmentValidationError(
                    f"the environment would break its schema: {error.message} at "
                    f"{_pointer(str(p) for p in error.absolute_path) or 'the root'!r}; "
                    "write a value the schema allows"
                )
        if not self._extension_validators:
            return
        names: set[str] = set()
        for step in applied:
            if len(step.parts) < 2:
                if not step.parts or step.parts[0] == "extensions":
                    names.update(self._extension_validators)
            elif step.parts[0] == "extensions":
                names.add(step.parts[1])
        extensions = cast(JsonObject, self._state["extensions"])
        for name in sorted(names):
            validator = self._extension_validators.get(name)
            if validator is None or name not in extensions:
                continue
            error = jsonschema.exceptions.best_match(validator.iter_errors(extensions[name]))
            if error is not None:
                where = _pointer(["extensions", name, *(str(p) for p in error.absolute_path)])
                raise EnvironmentValidationError(
                    f"extension {name!r} would break its schema: {error.message} at "
                    f"{where!r}; write a value the schema allows"
                )

    # -- rendering -----------------------------------------------------------------------

    def render(self, max_tokens: int, counter: TokenCounter) -> str:
        """Return the text the model sees; ``counter.count(text) <= max_tokens``, always.

        The text has one block per non-empty section, in `RENDER_ORDER`, separated by a
        blank line: a header line ``## <section>`` and the section as compact JSON (typed
        sections leave out empty fields: None, "", [] and {}). A section still equal to its
        defaults is left out, so an empty environment renders as "".

        When the full text does not fit, it degrades in this fixed order, each stage only
        when the previous one cannot reach the budget:

        1. Elide the oldest items of long lists and dicts: every list and dict (the files
           dict and the extensions dict included, which lose their earliest-added keys
           first) keeps only its newest N items, N as large as fits (found by galloping,
           then interpolation and bisection; never below 1), behind a marker that stays
           valid JSON: a first list item ``"… 120 earlier items"``, or a first dict entry
           ``"…": "120 earlier entries"`` (the key grows to ``"……"`` if ``"…"`` is taken).
           Records (the sections themselves, plan steps, file and artifact entries) are
           never elided.
        2. Shorten long strings, with one newest item per list: every string value keeps
           its first L characters, L as large as fits (down to 0), followed by
           ``"… [+1234 chars]"``. Keys are never shortened.
        3. Drop whole sections in `DROP_ORDER` (extensions, workspace, knowledge, system,
           task last), each replaced by a line ``## <section>: omitted to fit the token
           budget`` while those lines fit (else they are left out too); after each drop the
           remaining sections are fitted again from stage 1, so they regain what the
           dropped one used.

        Every block that is not such a marker line is ``## <section>`` and one line of
        valid JSON. A budget of 0 (or less) gives "". The whole text is counted before it
        is returned, so the budget holds for any counter, even one whose counts of the
        parts do not add up to the count of the whole.

        Cost: results are cached per version, budget and counter, and each section's
        renders and counts per section version, so rendering an unchanged environment again
        costs a dictionary lookup and a change re-renders only the sections it touched.
        Shrinking renders only the newest N items of each list while it searches, so a
        workspace of 10,000 files fits a 2,000-token budget in tens of milliseconds.
        """
        return self.render_report(max_tokens, counter).text

    def render_report(self, max_tokens: int, counter: TokenCounter) -> RenderReport:
        """Render as `render` does and say what it cost per section and what was degraded."""
        return self._renderer.render(self._state, self._section_versions, max_tokens, counter)

    def __repr__(self) -> str:
        present = [name for name in RENDER_ORDER if self._state[name] != _DEFAULT_STATE[name]]
        return f"<Environment version={self._version} sections={present}>"


_READ_ONLY_MESSAGE: Final = (
    "this {} is part of a read-only environment snapshot; change the environment with "
    "Environment.set or update_section, or take a copy with copy.deepcopy"
)


class _SnapshotList(list[Any]):
    """A list inside a typed snapshot: reads like a list, refuses in-place changes."""

    def _refuse(self, *args: object, **kwargs: object) -> NoReturn:
        raise TypeError(_READ_ONLY_MESSAGE.format("list"))

    append = extend = insert = remove = pop = clear = sort = reverse = _refuse
    __setitem__ = __delitem__ = __iadd__ = __imul__ = _refuse

    def __reduce__(self) -> tuple[type[list[Any]], tuple[list[Any]]]:
        return (list, (list(self),))  # copies and pickles are plain, mutable lists

    def __copy__(self) -> list[Any]:
        return list(self)

    def __deepcopy__(self, memo: dict[int, object]) -> list[Any]:
        return [copy.deepcopy(item, memo) for item in self]


class _SnapshotDict(dict[str, Any]):
    """A dict inside a typed snapshot: reads like a dict, refuses in-place changes."""

    def _refuse(self, *args: object, **kwargs: object) -> NoReturn:
        raise TypeError(_READ_ONLY_MESSAGE.format("dict"))

    __setitem__ = __delitem__ = __ior__ = _refuse
    pop = popitem = clear = update = setdefault = _refuse

    def __reduce__(self) -> tuple[type[dict[str, Any]], tuple[dict[str, Any]]]:
        return (dict, (dict(self),))

    def __copy__(self) -> dict[str, Any]:
        return dict(self)

    def __deepcopy__(self, memo: dict[int, object]) -> dict[str, Any]:
        return {key: copy.deepcopy(item, memo) for key, item in self.items()}


@functools.cache
def _container_fields(model: type[BaseModel]) -> tuple[str, ...]:
    names = []
    for name, info in model.model_fields.items():
        annotation: Any = info.annotation
        if _children(annotation)[0] is not _SCALAR:
            names.append(name)
    return tuple(names)


def _freeze(value: object) -> object:
    """Make a validated snapshot read-only in place (its lists and dicts, at any depth)."""
    if isinstance(value, BaseModel):
        for name in _container_fields(type(value)):
            # Frozen models refuse setattr; this is the one place that replaces a field.
            object.__setattr__(value, name, _freeze(getattr(value, name)))
        return value
    if isinstance(value, list):
        return _SnapshotList([_freeze(item) for item in value])
    if isinstance(value, dict):
        return _SnapshotDict({key: _freeze(item) for key, item in value.items()})
    return value


class _Snapshot(BaseModel):
    """The shape of `Environment.to_json` output."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    format: Literal[1]
    version: int = Field(ge=0)
    state: JsonObject
    schema_: JsonObject | None = Field(default=None, alias="schema")
    extension_schemas: dict[str, JsonObject] = Field(default_factory=dict)
    max_changes: int = Field(default=DEFAULT_MAX_CHANGES, ge=0)
    changes: list[EnvironmentChange] = Field(default_factory=list)


class EnvironmentBuilder:
    """Collects the parts of an `Environment`; every method returns the builder.

    ``Environment.builder().system(SystemState(...)).task(TaskState(...))
    .extension("datasets", {...}).extension_schema("datasets", {...}).build()``
    """

    def __init__(self) -> None:
        self._sections: dict[str, BaseModel | JsonObject] = {}
        self._extensions: dict[str, BaseModel | JsonValue] = {}
        self._schema: JsonObject | None = None
        self._extension_schemas: dict[str, JsonObject] = {}
        self._max_changes = DEFAULT_MAX_CHANGES

    def system(self, value: SystemState | JsonObject) -> Self:
        """Set the system section."""
        self._sections["system"] = value
        return self

    def task(self, value: TaskState | JsonObject) -> Self:
        """Set the task section."""
        self._sections["task"] = value
        return self

    def knowledge(self, value: KnowledgeBase | JsonObject) -> Self:
        """Set the knowledge section."""
        self._sections["knowledge"] = value
        return self

    def workspace(self, value: WorkspaceState | JsonObject) -> Self:
        """Set the workspace section."""
        self._sections["workspace"] = value
        return self

    def extension(self, name: str, value: BaseModel | JsonValue) -> Self:
        """Add extension `name` (a model is stored as its JSON)."""
        self._extensions[name] = value
        return self

    def schema(self, schema: JsonObject) -> Self:
        """Require the whole state to satisfy a JSON schema after every write."""
        self._schema = schema
        return self

    def extension_schema(self, name: str, schema: JsonObject) -> Self:
        """Require extension `name`, when present, to satisfy a JSON schema."""
        self._extension_schemas[name] = schema
        return self

    def max_changes(self, limit: int) -> Self:
        """Keep at most `limit` changes in the change log (default `DEFAULT_MAX_CHANGES`)."""
        self._max_changes = limit
        return self

    def build(self) -> Environment:
        """Return the Environment (validated against its models and schemas).

        Raises:
            UserError: A section does not fit its model or a schema is invalid.
            EnvironmentValidationError: The state breaks a schema.
        """
        sections = self._sections
        return Environment(
            system=cast("SystemState | JsonObject | None", sections.get("system")),
            task=cast("TaskState | JsonObject | None", sections.get("task")),
            knowledge=cast("KnowledgeBase | JsonObject | None", sections.get("knowledge")),
            workspace=cast("WorkspaceState | JsonObject | None", sections.get("workspace")),
            extensions=self._extensions,
            schema=self._schema,
            extension_schemas=self._extension_schemas,
            max_changes=self._max_changes,
        )


# -- rendering ---------------------------------------------------------------------------------


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
_SEPARATOR: Final = "\n\n"
_DROPPED_SUFFIX: Final = ": omitted to fit the token budget"
# Prefix lengths (in characters per token of the limit) tried before counting a whole block.
_PREFIX_CHARS_PER_TOKEN: Final = (4, 16)


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


@dataclass
class _Block:
    text: str
    elided: int
    shortened: int
    counts: dict[int, tuple[int, bool]] = field(default_factory=dict)  # counter id → count


@dataclass
class _SectionCache:
    version: int
    longest_collection: int
    longest_string: int
    blocks: dict[tuple[int | None, int | None], _Block]


_Caps: TypeAlias = tuple[int | None, int | None]


class _Renderer:
    """Renders an environment's state within budgets, caching per section version."""

    _MAX_BLOCKS_PER_SECTION = 128
    _MAX_REPORTS = 16

    def __init__(self) -> None:
        self._sections: dict[str, _SectionCache] = {}
        self._reports: OrderedDict[tuple[int, int, int], RenderReport] = OrderedDict()
        # Strong references keep counter ids unique while counts keyed by them are cached.
        self._counters: dict[int, TokenCounter] = {}

    # -- caches ----------------------------------------------------------------------

    def _section(self, state: JsonObject, name: str, version: int) -> _SectionCache:
        cache = self._sections.get(name)
        if cache is None or cache.version != version:
            trim = _Trim(None, None)
            data = trim.value(state[name], _SECTION_SHAPES[name])
            block = _Block(f"## {name}\n{_dumps(data)}", 0, 0)
            cache = _SectionCache(
                version, trim.longest_collection, trim.longest_string, {(None, None): block}
            )
            self._sections[name] = cache
        return cache

    def _block(self, state: JsonObject, name: str, cache: _SectionCache, caps: _Caps) -> _Block:
        item_cap, string_cap = caps
        if item_cap is not None and item_cap >= cache.longest_collection:
            item_cap = None
        if string_cap is not None and string_cap >= cache.longest_string:
            string_cap = None
        key = (item_cap, string_cap)
        block = cache.blocks.get(key)
        if block is None:
            if len(cache.blocks) >= self._MAX_BLOCKS_PER_SECTION:
                full = cache.blocks[(None, None)]
                cache.blocks.clear()
                cache.blocks[(None, None)] = full
            trim = _Trim(item_cap, string_cap)
            data = trim.value(state[name], _SECTION_SHAPES[name])
            block = _Block(f"## {name}\n{_dumps(data)}", trim.elided, trim.shortened)
            cache.blocks[key] = block
        return block

    def _counter_id(self, counter: TokenCounter) -> int:
        key = id(counter)
        if self._counters.get(key) is not counter:
            if len(self._counters) >= 8:
                self._counters.clear()
                for cache in self._sections.values():
                    for block in cache.blocks.values():
                        block.counts.clear()
                self._reports.clear()
            self._counters[key] = counter
        return key

    # -- rendering -------------------------------------------------------------------

    def render(
        self,
        state: JsonObject,
        versions: Mapping[str, int],
        max_tokens: int,
        counter: TokenCounter,
    ) -> RenderReport:
        counter_id = self._counter_id(counter)
        report_key = (max(versions.values()), max_tokens, counter_id)
        cached = self._reports.get(report_key)
        if cached is not None:
            self._reports.move_to_end(report_key)
            return cached
        present: list[str] = [n for n in RENDER_ORDER if state[n] != _DEFAULT_STATE[n]]
        caches: dict[str, _SectionCache] = {
            name: self._section(state, name, versions[name]) for name in present
        }
        report = _Fit(self, state, caches, max(max_tokens, 0), counter, counter_id).run(present)
        self._reports[report_key] = report
        if len(self._reports) > self._MAX_REPORTS:
            self._reports.popitem(last=False)
        return report


def _dumps(data: JsonValue) -> str:
    return json.dumps(data, ensure_ascii=False, separators=(",", ":"))


class _Fit:
    """One render: searches the caps that fit the budget, then drops sections if needed."""

    def __init__(
        self,
        renderer: _Renderer,
        state: JsonObject,
        caches: dict[str, _SectionCache],
        budget: int,
        counter: TokenCounter,
        counter_id: int,
    ) -> None:
        self.renderer = renderer
        self.state = state
        self.caches = caches
        self.budget = budget
        self.counter = counter
        self.counter_id = counter_id
        self.separator = counter.count(_SEPARATOR)
        self.marker_counts: dict[str, int] = {}

    def count_block(self, block: _Block, limit: int) -> int:
        """Return the block's tokens, or some number above `limit` when it is far above."""
        cached = block.counts.get(self.counter_id)
        if cached is not None and (cached[1] or cached[0] > limit):
            return cached[0]
        text = block.text
        # Counting a text far longer than the limit is wasted work: count growing prefixes
        # first. A cut splits at most a few tokens, so a prefix well over the limit means
        # the whole is over it too. A wrong guess (a strange counter) only degrades more;
        # the final text is always counted exactly.
        for chars_per_token in _PREFIX_CHARS_PER_TOKEN:
            cut = (max(limit, 0) + 1) * chars_per_token + 64
            if len(text) <= cut:
                break
            head = self.counter.count(text[:cut])
            if head > limit + 8:
                block.counts[self.counter_id] = (head, False)
                return head
        count = self.counter.count(text)
        block.counts[self.counter_id] = (count, True)
        return count

    def marker(self, name: str) -> str:
        return f"## {name}{_DROPPED_SUFFIX}"

    def marker_count(self, name: str) -> int:
        if name not in self.marker_counts:
            self.marker_counts[name] = self.counter.count(self.marker(name))
        return self.marker_counts[name]

    def estimate(self, kept: list[str], markers: list[str], caps: _Caps, limit: int) -> int:
        total = sum(self.marker_count(name) for name in markers)
        total += self.separator * max(len(kept) + len(markers) - 1, 0)
        for name in kept:
            if total > limit:
                break
            block = self.renderer._block(self.state, name, self.caches[name], caps)
            total += self.count_block(block, limit - total)
        return total

    def largest(self, low: int, high: int, measure: Callable[[int], int], limit: int) -> int:
        """Return the largest x in [low, high) whose measure fits `limit`.

        Given: measure(low) fits, measure(high) does not. Gallops up from `low` (doubling
        the step) so that probes stay within twice the answer, as each probe costs about as
        much as the text it renders; then narrows the bracket by interpolating the measure,
        alternating with bisection so that it never takes more than twice log2 probes.
        """
        low_cost = measure(low)
        high_cost = limit + 1
        step = 1
        while low + step < high:
            cost = measure(low + step)
            if cost > limit:
                high, high_cost = low + step, cost
                break
            low, low_cost = low + step, cost
            step *= 2
        bisect = False
        while high - low > 1:
            if bisect or high_cost <= low_cost:
                probe = (low + high) // 2
            else:
                share = (limit - low_cost) / (high_cost - low_cost)
                probe = min(max(low + int(share * (high - low)), low + 1), high - 1)
            cost = measure(probe)
            if cost <= limit:
                low, low_cost = probe, cost
            else:
                high, high_cost = probe, cost
            bisect = not bisect
        return low

    def search(self, kept: list[str], markers: list[str], limit: int) -> _Caps | None:
        """Return the caps (stages 1 and 2) that fit `limit` by estimate, or None."""

        def measure(caps: _Caps) -> int:
            return self.estimate(kept, markers, caps, limit)

        if measure((None, None)) <= limit:
            return (None, None)
        longest = max((self.caches[name].longest_collection for name in kept), default=0)
        if longest > 1 and measure((1, None)) <= limit:
            item_cap = self.largest(1, longest, lambda k: measure((k, None)), limit)
            return (item_cap, None)
        item_cap_or_none = 1 if longest > 1 else None
        longest_string = max((self.caches[name].longest_string for name in kept), default=0)
        if longest_string > 0 and measure((item_cap_or_none, 0)) <= limit:
            string_cap = self.largest(
                0, longest_string, lambda n: measure((item_cap_or_none, n)), limit
            )
            return (item_cap_or_none, string_cap)
        return None

    def assemble(self, kept: list[str], markers: list[str], caps: _Caps) -> RenderReport:
        parts: list[str] = []
        sections: list[SectionRender] = []
        any_elided = any_shortened = False
        for name in RENDER_ORDER:
            if name in kept:
                block = self.renderer._block(self.state, name, self.caches[name], caps)
                parts.append(block.text)
                any_elided = any_elided or block.elided > 0
                any_shortened = any_shortened or block.shortened > 0
                tokens = self.count_block(block, self.budget)
                sections.append(
                    SectionRender(
                        name=name,
                        tokens=tokens,
                        elided_items=block.elided,
                        shortened_strings=block.shortened,
                    )
                )
            elif name in self.caches:
                with_marker = name in markers
                if with_marker:
                    parts.append(self.marker(name))
                tokens = self.marker_count(name) if with_marker else 0
                sections.append(SectionRender(name=name, tokens=tokens, dropped=True))
        text = _SEPARATOR.join(parts)
        return RenderReport(
            text=text,
            tokens=self.counter.count(text) if text else 0,
            max_tokens=self.budget,
            sections=tuple(sections),
            item_cap=caps[0] if any_elided else None,
            string_cap=caps[1] if any_shortened else None,
        )

    def attempt(self, kept: list[str], markers: list[str]) -> RenderReport | None:
        limit = self.budget
        while limit >= 0:
            caps = self.search(kept, markers, limit)
            if caps is None:
                return None
            report = self.assemble(kept, markers, caps)
            if report.tokens <= self.budget:
                return report
            # The parts were estimated to fit but the whole counts more (tokens merge
            # differently across block seams): aim lower by the overshoot.
            limit -= report.tokens - self.budget
        return None

    def run(self, present: list[str]) -> RenderReport:
        kept = list(present)
        dropped: list[str] = []
        if self.budget > 0:
            # The parts' counts need not add up to the whole's (tokens merge across the
            # seams), so when the full text may fit, count it whole: what fits is never
            # degraded.
            near = 2 * self.budget + 16
            if self.estimate(kept, [], (None, None), near) <= near:
                whole = self.assemble(kept, [], (None, None))
                if whole.tokens <= self.budget:
                    return whole
            while True:
                for markers in [dropped, []] if dropped else [[]]:
                    report = self.attempt(kept, markers)
                    if report is not None:
                        return report
                if not kept:
                    break
                victim = next(name for name in DROP_ORDER if name in kept)
                kept.remove(victim)
                dropped.append(victim)
        return RenderReport(
            text="",
            tokens=0,
            max_tokens=self.budget,
            sections=tuple(SectionRender(name=n, tokens=0, dropped=True) for n in present),
        )
