"""Type aliases and the frozen model base shared across agent_flow."""

from __future__ import annotations

from typing import Any, TypeAlias

from pydantic import BaseModel, ConfigDict, JsonValue

__all__ = ["FrozenModel", "JsonObject", "JsonValue"]

#: A JSON object (``JsonValue`` is pydantic's recursive alias for any JSON value).
JsonObject: TypeAlias = dict[str, JsonValue]

# One set object per combination of explicitly set field names, shared by every instance.
_FIELDS_SETS: dict[frozenset[str], set[str]] = {}


class FrozenModel(BaseModel):
    """A frozen model for values a run keeps by the dozen (messages, entries, changes).

    pydantic gives every instance its own set of the fields it was given
    (``model_fields_set``): 216 bytes for up to four names, 728 from five, more than the
    instance's own values. A frozen instance never changes that set (``model_copy``
    copies it first), so instances given the same fields share one set here; the values
    and ``model_fields_set`` are as before.
    """

    model_config = ConfigDict(frozen=True)

    def model_post_init(self, context: Any, /) -> None:
        given = self.__pydantic_fields_set__
        shared = _FIELDS_SETS.setdefault(frozenset(given), given)
        object.__setattr__(self, "__pydantic_fields_set__", shared)
