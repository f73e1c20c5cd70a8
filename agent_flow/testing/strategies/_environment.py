"""Hypothesis strategies for environments: JSON values, typed sections, extensions, writes.

Sizes are capped by `max_items` (list and dict entries) and `max_text` (characters), so that
failing examples shrink to a few short values. Keys and texts include the awkward ones a
JSON pointer must escape (``~``, ``/``, ``-``) and the renderer's own marker (``…``).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Mapping
from typing import Any

from hypothesis import reject
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError

from agent_flow._types import JsonValue
from agent_flow.environment import (
    ArtifactInfo,
    Environment,
    FileInfo,
    KnowledgeBase,
    PlanStep,
    SystemState,
    TaskState,
    TaskStatus,
    WorkspaceState,
)
from agent_flow.errors import PointerError
from agent_flow.testing.strategies._text import texts

__all__ = [
    "artifact_infos",
    "environments",
    "extension_values",
    "file_infos",
    "json_keys",
    "json_values",
    "knowledge_bases",
    "plan_steps",
    "pointer_writes",
    "system_states",
    "task_states",
    "workspace_states",
]

#: Keys that exercise pointer escaping ("~", "/"), the elision marker key and the "-" token.
json_keys = st.one_of(
    texts(max_size=12),
    st.sampled_from(["~", "/", "~1", "a/b", "~0~1", "-", "…", "0", ""]),
)


@functools.cache  # strategies are built once per parameter set, not per draw
def _texts(max_size: int) -> st.SearchStrategy[str]:
    return texts(max_size=max_size)


@functools.cache  # strategies are built once per parameter set, not per draw
def json_values(*, max_leaves: int = 12, max_text: int = 20) -> st.SearchStrategy[JsonValue]:
    """Any JSON value: finite floats, big integers, unicode strings, nested lists and dicts."""
    scalars: st.SearchStrategy[JsonValue] = st.one_of(
        st.none(),
        st.booleans(),
        st.integers(),
        st.floats(allow_nan=False, allow_infinity=False),
        _texts(max_text),
    )
    return st.recursive(
        scalars,
        lambda children: st.one_of(
            st.lists(children, max_size=4),
            st.dictionaries(json_keys, children, max_size=4),
        ),
        max_leaves=max_leaves,
    )


@functools.cache  # strategies are built once per parameter set, not per draw
def system_states(*, max_items: int = 4, max_text: int = 20) -> st.SearchStrategy[SystemState]:
    """The ``system`` section: working directory, permissions, resources."""
    return st.builds(
        SystemState,
        working_directory=_texts(max_text),
        permissions=st.lists(_texts(max_text), max_size=max_items),
        resources=st.dictionaries(json_keys, _texts(max_text), max_size=max_items),
    )


@functools.cache  # strategies are built once per parameter set, not per draw
def plan_steps(*, max_text: int = 20) -> st.SearchStrategy[PlanStep]:
    """One step of a task's plan, done or not, with or without a result."""
    return st.builds(
        PlanStep,
        description=_texts(max_text),
        completed=st.booleans(),
        result=st.none() | _texts(max_text),
    )


@functools.cache  # strategies are built once per parameter set, not per draw
def task_states(*, max_items: int = 4, max_text: int = 20) -> st.SearchStrategy[TaskState]:
    """The ``task`` section: objective, status, step counts, current step and plan."""
    return st.builds(
        TaskState,
        objective=_texts(max_text),
        status=st.sampled_from(TaskStatus),
        steps_completed=st.integers(0, 50),
        steps_total=st.integers(0, 50),
        current_step=st.none() | _texts(max_text),
        plan=st.lists(plan_steps(max_text=max_text), max_size=max_items),
    )


@functools.cache  # strategies are built once per parameter set, not per draw
def knowledge_bases(*, max_items: int = 4, max_text: int = 20) -> st.SearchStrategy[KnowledgeBase]:
    """The ``knowledge`` section: facts, sources, key concepts and free-form extras."""
    return st.builds(
        KnowledgeBase,
        discovered_facts=st.lists(_texts(max_text), max_size=max_items),
        sources=st.dictionaries(json_keys, _texts(max_text), max_size=max_items),
        key_concepts=st.lists(_texts(max_text), max_size=max_items),
        extra=st.dictionaries(json_keys, json_values(max_text=max_text), max_size=3),
    )


@functools.cache  # strategies are built once per parameter set, not per draw
def file_infos(*, max_text: int = 20) -> st.SearchStrategy[FileInfo]:
    """A file or directory the workspace knows of."""
    return st.builds(
        FileInfo,
        kind=st.sampled_from(["file", "directory"]),
        size=st.none() | st.integers(0, 10**9),
        summary=st.none() | _texts(max_text),
    )


@functools.cache  # strategies are built once per parameter set, not per draw
def artifact_infos(*, max_text: int = 20) -> st.SearchStrategy[ArtifactInfo]:
    """An artifact the agent produced."""
    return st.builds(
        ArtifactInfo,
        name=_texts(max_text),
        path=st.none() | _texts(max_text),
        description=_texts(max_text),
    )


@functools.cache  # strategies are built once per parameter set, not per draw
def workspace_states(
    *, max_items: int = 4, max_text: int = 20
) -> st.SearchStrategy[WorkspaceState]:
    """The ``workspace`` section: files, artifacts and free-form extras."""
    return st.builds(
        WorkspaceState,
        files=st.dictionaries(json_keys, file_infos(max_text=max_text), max_size=max_items),
        artifacts=st.lists(artifact_infos(max_text=max_text), max_size=max_items),
        extra=st.dictionaries(json_keys, json_values(max_text=max_text), max_size=3),
    )


def _escape(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


@st.composite
def pointer_writes(draw: st.DrawFn) -> tuple[str, JsonValue]:
    """A pointer and a value that `Environment.set` accepts and `get` returns unchanged.

    Typed values are drawn already normalized (models dumped with their defaults).
    """
    choice = draw(st.integers(0, 7))
    if choice == 0:
        path = draw(st.lists(json_keys, min_size=1, max_size=3))
        return "/extensions/" + "/".join(_escape(p) for p in path), draw(json_values())
    if choice == 1:
        return "/task/objective", draw(_texts(30))
    if choice == 2:
        return "/task/status", draw(st.sampled_from([s.value for s in TaskStatus]))
    if choice == 3:
        return "/task/steps_completed", draw(st.integers(-5, 10**12))
    if choice == 4:
        return "/knowledge/discovered_facts/-", draw(_texts(30))
    if choice == 5:
        key = draw(json_keys)
        info = draw(file_infos())
        return f"/workspace/files/{_escape(key)}", info.model_dump(mode="json")
    if choice == 6:
        key = draw(json_keys)
        return f"/knowledge/extra/{_escape(key)}", draw(json_values())
    key = draw(json_keys)
    return f"/system/resources/{_escape(key)}", draw(_texts(30))


@st.composite
def extension_values(draw: st.DrawFn, model: type[BaseModel]) -> BaseModel:
    """Instances of your own extension model, built from its field types.

    Required fields are drawn from their annotations (`hypothesis.strategies.builds`);
    fields with defaults keep them. Drawn values the model's own validators refuse are
    discarded (hypothesis draws again). Register a strategy for a field type hypothesis
    cannot infer with `hypothesis.strategies.register_type_strategy`, or pass your own
    strategy to `environments` instead of the model.
    """
    try:
        return draw(st.builds(model))
    except ValidationError:
        reject()  # a value the model's validators refuse is not one a run could hold


#: What `environments` accepts per extension: a pydantic model, or a strategy of values.
ExtensionSpec = type[BaseModel] | st.SearchStrategy[Any]


@st.composite
def environments(
    draw: st.DrawFn,
    *,
    max_items: int = 4,
    max_text: int = 20,
    writes: int = 3,
    extensions: Mapping[str, ExtensionSpec] | None = None,
    free_extensions: bool = True,
) -> Environment:
    """An Environment with any subset of sections filled, extensions, and a few writes.

    Args:
        draw: Supplied by hypothesis.
        max_items: The most entries of each list and dict.
        max_text: The longest string.
        writes: The most pointer writes applied after building (recorded as changes).
        extensions: Your own extensions, always present: name → pydantic model (drawn with
            `extension_values`, and registered with `Environment.register_extension`, so a
            handler that writes a value of the wrong type raises as it would in a run), or a
            strategy of values (a model or JSON, not registered).
        free_extensions: Also add up to three untyped extensions of any JSON (off when
            your code expects only its own).
    """
    builder = Environment.builder()
    kw: dict[str, Any] = {"max_items": max_items, "max_text": max_text}
    if draw(st.booleans()):
        builder.system(draw(system_states(**kw)))
    if draw(st.booleans()):
        builder.task(draw(task_states(**kw)))
    if draw(st.booleans()):
        builder.knowledge(draw(knowledge_bases(**kw)))
    if draw(st.booleans()):
        builder.workspace(draw(workspace_states(**kw)))
    if free_extensions:
        for name, value in draw(
            st.dictionaries(json_keys, json_values(max_text=max_text), max_size=3)
        ).items():
            builder.extension(name, value)
    for name, spec in (extensions or {}).items():
        if isinstance(spec, st.SearchStrategy):
            builder.extension(name, draw(spec, label=f"extension {name}"))
        else:
            builder.extension(name, draw(extension_values(spec), label=f"extension {name}"))
            # Registered as an agent's would be: a wrong write raises, as it would in a run.
            builder.extension_model(name, spec)
    env = builder.build()
    typed = {_escape(name) for name in extensions or {}}
    for pointer, value in draw(st.lists(pointer_writes(), max_size=writes)):
        if pointer.startswith("/extensions/") and pointer.split("/")[2] in typed:
            continue  # keep your own extensions valid for your model
        # A drawn extension path may run into an existing scalar or array: skip that write.
        with contextlib.suppress(PointerError):
            env.set(pointer, value)
    return env
