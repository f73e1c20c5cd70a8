"""Read-only snapshots: the typed section views `Environment` hands out, frozen all the way down.

A validated section model is frozen by pydantic, but its lists and dicts are not; `_freeze`
replaces them, at any depth, with `_SnapshotList` and `_SnapshotDict`, which read like the
built-ins and refuse in-place changes. Copies and pickles of them are plain, mutable
containers.
"""

from __future__ import annotations

import copy
import functools
from typing import Any, Final, NoReturn

from pydantic import BaseModel

from agent_flow.environment._pointer import _SCALAR, _children

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
