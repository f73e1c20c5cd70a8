"""`Environment`: the agent's typed, versioned working memory.

This module owns `Environment` (reads, writes, the change log, persistence with `to_json` and
`from_json`); the section models are in `sections`, the budgeted rendering in `render`, and
`EnvironmentBuilder` in `builder`.

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
the workspace. An extension registered with a pydantic model (`register_extension`) is typed
the same way below ``/extensions/<name>``, and after each write that touches it the whole
extension is validated against its model too. Optional JSON schemas (one for the whole state,
one per extension) are checked after the write; a write that fails any check is undone, and
the state, the version and the change log stay exactly as they were.

Errors. A malformed pointer, or one that names nothing, raises `PointerError`; a value that is
not JSON, deleting a typed field or a section, or a negative limit raises `UserError`; a value
that does not fit a typed section, a schema, or the model given to `get_extension`, or a text
UTF-8 cannot encode (a lone surrogate) raises `EnvironmentValidationError`.

Persistence. `to_json` keeps the state, the change log and the JSON schemas (a registered
extension model as its JSON schema: a copy read back still refuses a wrong write).

An Environment is not thread-safe: use it from one thread at a time (an agent renders one
holding a long text on a tool thread while its run waits for the prompt).
"""

from __future__ import annotations

import functools
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, TypeVar, cast, overload

from pydantic import BaseModel, ValidationError

from agent_flow._types import JsonObject, JsonValue
from agent_flow.environment import _saved
from agent_flow.environment._pointer import (
    _adapter,
    _brief,
    _copy,
    _describe,
    _json_copy,
    _locate,
    _parse,
    _pointer,
    _validate_typed,
    _validation_problem,
)
from agent_flow.environment._renderer import _Renderer, present
from agent_flow.environment._saved import DEFAULT_MAX_CHANGES
from agent_flow.environment._schemas import (
    _check_model,
    _check_models,
    _check_schemas,
    _make_validator,
    _model_schema,
)
from agent_flow.environment._snapshots import _freeze
from agent_flow.environment._writes import _Applied, _apply_delete, _set_at
from agent_flow.environment.render import RenderReport
from agent_flow.environment.sections import (
    _SECTION_MODELS,
    RENDER_ORDER,
    EnvironmentChange,
    KnowledgeBase,
    SystemState,
    TaskState,
    TypedSectionName,
    WorkspaceState,
    _State,
)
from agent_flow.errors import EnvironmentValidationError, PointerError, UserError
from agent_flow.tokens import TokenCounter

if TYPE_CHECKING:
    from agent_flow.environment.builder import EnvironmentBuilder

__all__ = ["DEFAULT_MAX_CHANGES", "Environment"]


_M = TypeVar("_M")
_S = TypeVar("_S", bound=BaseModel)


class Environment:
    """The agent's working memory: typed sections plus free extensions, versioned.

    Build one with `Environment.builder()` or the constructor (every argument optional).

    Reading: ``env.get("/task/status")`` returns a copy of the JSON at a pointer;
    ``env.task`` (and ``system``, ``knowledge``, ``workspace``) return frozen, validated
    models, cached until that section changes: read-only all the way down (their lists and
    dicts raise `TypeError` on in-place changes, which would be lost). To change something,
    write; for a mutable copy, ``copy.deepcopy`` or ``model_copy(deep=True)``.

    Writing (each recorded as one `EnvironmentChange`, bumping `version` by one):
    ``env.set(pointer, value)`` (``-`` appends to an array; missing parent objects are
    created), ``env.delete(pointer)``, ``env.update_section("task", status=...)`` (several
    fields at once, all or nothing), ``env.task = TaskState(...)`` (a property setter is a
    set of ``/task``), ``env.set_extension(name, value)``.

    Typed extensions: ``env.register_extension("dataset", Dataset)`` holds extension
    ``dataset`` to the model ``Dataset``: every write to it is validated (a wrong one raises
    `EnvironmentValidationError`), and ``env.get_extension("dataset")`` returns a ``Dataset``.

    Args:
        system: The system section (model or JSON object); defaults to an empty one.
        task: The task section.
        knowledge: The knowledge section.
        workspace: The workspace section.
        extensions: Initial extensions by name (models are stored as their JSON).
        schema: A JSON schema the whole state (the five section keys) must satisfy after
            every write, checked in time proportional to the state: prefer `extension_schemas`.
        extension_schemas: JSON schemas by extension name; an extension, when present, must
            satisfy its schema after every write.
        extension_models: Pydantic models by extension name, as `register_extension`
            registers them.
        max_changes: How many changes `changes` keeps; the oldest are dropped first.

    Raises:
        UserError: A section does not fit its model, a schema is invalid, or `max_changes`
            is negative.
        EnvironmentValidationError: The initial state breaks a schema or an extension model.
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
        extension_models: Mapping[str, type[BaseModel]] | None = None,
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
        for name, model in (extension_models or {}).items():
            self.register_extension(name, model)

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
        self._extension_models: dict[str, type[BaseModel]] = {}
        self._views: dict[str, tuple[int, BaseModel]] = {}
        self._renderer = _Renderer()
        _check_schemas(
            self._state,
            self._validator,
            self._extension_validators,
            [_Applied("set", (), None, None, lambda: None)],
        )

    # -- construction and persistence ---------------------------------------------------

    @classmethod
    def builder(cls) -> EnvironmentBuilder:
        """Return a builder: ``Environment.builder().task(...).extension(...).build()``."""
        # Imported here: the builder module imports this one to build.
        from agent_flow.environment.builder import EnvironmentBuilder

        return EnvironmentBuilder()

    def to_json(self) -> str:
        """Return the state, version, schemas, change limit and change log as JSON text.

        A registered extension model is saved as its JSON schema (see the module doc).
        """
        return _saved.dump_of(self, self._log)

    @property
    def max_changes(self) -> int:
        """How many changes the log keeps (`changes`); the oldest are dropped first."""
        return self._log.maxlen or 0

    def _saved_parts(self, since_version: int) -> tuple[str, list[tuple[int, str]]]:
        """`to_json` as a store keeps it: without the log, and the changes after `since_version`.

        Each change is ``(version, JSON)``, oldest first: the work is the state's size plus the
        new changes, not the whole log.
        """
        return _saved.dump_of(self, None), [
            (c.version, _saved.change_json(c)) for c in self.changes(since_version)
        ]

    @classmethod
    def from_json(cls, text: str) -> Environment:
        """Rebuild an Environment from `to_json` output, exactly as it was.

        Raises:
            UserError: `text` is not an environment written by `to_json`.
            EnvironmentValidationError: The stored state breaks its stored schemas.
        """
        snapshot = _saved.load(text)
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
        """Copies of the per-extension JSON schemas (see `extension_models` for the models)."""
        return {name: cast(JsonObject, _copy(s)) for name, s in self._extension_schemas.items()}

    @property
    def extension_models(self) -> dict[str, type[BaseModel]]:
        """The registered extension models, by extension name."""
        return dict(self._extension_models)

    def get(self, pointer: str) -> JsonValue:
        """Return a copy of the value at `pointer` (``""`` is the whole state).

        Raises:
            PointerError: The pointer is malformed or names nothing.
        """
        return _copy(_locate(self._state, pointer))

    def has(self, pointer: str) -> bool:
        """Return whether `pointer` names a value (a malformed pointer still raises).

        Raises:
            PointerError: The pointer is malformed.
        """
        try:
            _locate(self._state, pointer)
        except PointerError:
            _parse(pointer)
            return False
        return True

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

    @overload
    def get_extension(self, name: str) -> BaseModel: ...

    @overload
    def get_extension(self, name: str, model: type[_M]) -> _M: ...

    def get_extension(self, name: str, model: type[_M] | None = None) -> _M | BaseModel:
        """Return extension `name` validated as `model` (a pydantic model or any type).

        Without `model`, the extension's registered model is used (`register_extension`).

        Raises:
            PointerError: There is no extension `name`.
            UserError: No `model` is given and none is registered for `name`.
            EnvironmentValidationError: The stored data does not fit `model`.
        """
        if model is None:
            registered = self._extension_models.get(name)
            if registered is None:
                raise UserError(
                    f"extension {name!r} has no registered model; pass one "
                    f"(get_extension({name!r}, Model)) or register it first "
                    f"(register_extension({name!r}, Model))"
                )
            return self.get_extension(name, registered)
        pointer = _pointer(["extensions", name])
        data = _locate(self._state, pointer)
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
            EnvironmentValidationError: The value does not fit the typed section or a schema,
                or a text in it holds a lone surrogate (UTF-8 cannot encode it).
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
        return self._transact(
            [functools.partial(_apply_delete, self._state, pointer, self._extension_models)]
        )[0]

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
            EnvironmentValidationError: The value breaks the extension's registered model, its
                schema or the state's schema.
        """
        return self.set(_pointer(["extensions", name]), value)

    def register_extension(self, name: str, model: type[BaseModel]) -> None:
        """Hold extension `name` to the pydantic `model`, for every write from now on.

        Every write that touches ``/extensions/<name>`` (the whole value or a field inside it,
        by `set`, `set_extension`, `delete`, or a write of ``/extensions`` or the whole state)
        is validated against `model` in strict JSON mode, as a typed section is: a value of the
        wrong type (``"12"`` for an ``int``), a missing required field or a failing validator
        of the model raises `EnvironmentValidationError` and the write is undone. A field
        inside the extension is written by pointer as in a typed section
        (``env.set("/extensions/dataset/rows", 12)``), and ``get_extension(name)`` returns the
        model. Registering is not a change: the version and the change log stay as they are.
        Registering the same name again replaces its model.

        Cost: each write that touches the extension validates all of it (the writes to other
        parts of the environment cost nothing more).

        Raises:
            UserError: `model` is not a pydantic model class.
            EnvironmentValidationError: The extension exists and does not fit `model`.
        """
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            raise UserError(
                f"register_extension({name!r}, ...) needs a pydantic model class, got "
                f"{_brief(model)}; for other types read with get_extension({name!r}, type)"
            )
        extensions = cast(JsonObject, self._state["extensions"])
        if name in extensions:
            _check_model(name, extensions[name], model)
        self._extension_models[name] = model
        if self._extension_schemas.get(name) == _model_schema(model):
            # The model's own schema, saved by to_json: the model checks more, and alone.
            del self._extension_schemas[name]
            del self._extension_validators[name]

    def _transact(self, actions: Sequence[Callable[[], _Applied]]) -> list[EnvironmentChange]:
        applied: list[_Applied] = []
        try:
            for action in actions:
                applied.append(action())
            _check_schemas(self._state, self._validator, self._extension_validators, applied)
            _check_models(self._state, self._extension_models, applied)
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
        return _set_at(self._state, parts, data, pointer, self._extension_models)

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
           its first L characters, L as large as fits or within 1/256 of the budget of it
           (down to 0), followed by ``"… [+1234 chars]"``. Keys are never shortened.
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
        renders and counts per section version: an unchanged environment costs a lookup, a
        change re-renders the sections it touched. Shrinking renders only the newest N items
        of each list while it searches (10,000 files fit 2,000 tokens in tens of ms); a
        string shortened to fit is counted once per probe (`longest_string`).
        """
        return self.render_report(max_tokens, counter).text

    def render_report(self, max_tokens: int, counter: TokenCounter) -> RenderReport:
        """Render as `render` does and say what it cost per section and what was degraded."""
        return self._renderer.render(self._state, self._section_versions, max_tokens, counter)

    def longest_string(self) -> int:
        """Characters of the longest string value (cached per section version).

        A render that shortens it counts about that much text per probe of its search.
        """
        return self._renderer.longest_string(self._state, self._section_versions)

    def __repr__(self) -> str:
        return f"<Environment version={self._version} sections={present(self._state)}>"
