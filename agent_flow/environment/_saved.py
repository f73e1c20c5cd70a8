"""The text `Environment.to_json` writes and `Environment.from_json` reads back.

One JSON object: ``format`` (1), ``version``, ``state``, ``schema``, ``extension_schemas``,
``max_changes`` and ``changes`` (the change log, oldest first). `dump` writes it; `load` checks
its shape and returns it as a `_Snapshot`, which `Environment.from_json` builds from.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from agent_flow._types import JsonObject
from agent_flow.environment._pointer import _brief
from agent_flow.environment._schemas import _model_schema
from agent_flow.environment.sections import EnvironmentChange
from agent_flow.errors import UserError

if TYPE_CHECKING:
    from agent_flow.environment.environment import Environment

#: How many changes an Environment keeps by default; older ones are dropped first.
DEFAULT_MAX_CHANGES: Final = 10_000


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


def dump(
    *,
    version: int,
    state: JsonObject,
    schema: JsonObject | None,
    extension_schemas: Mapping[str, JsonObject],
    changes: Iterable[EnvironmentChange] | None,
    max_changes: int | None,
) -> str:
    """The saved form of an environment, as compact JSON text.

    With `changes` None the ``changes`` key is left out: the snapshot a session store keeps
    beside its change rows (`change_json`).
    """
    payload: dict[str, object] = {
        "format": 1,
        "version": version,
        "state": state,
        "schema": schema,
        "extension_schemas": dict(extension_schemas),
        "max_changes": max_changes,
    }
    if changes is not None:
        payload["changes"] = [_change(c) for c in changes]
    return json.dumps(payload, separators=(",", ":"))


def dump_of(env: Environment, changes: Iterable[EnvironmentChange] | None) -> str:
    """`env`'s saved form (`dump`); a registered extension model is saved as its JSON schema."""
    models = env._extension_models
    schemas = {name: _model_schema(model) for name, model in models.items()}
    return dump(
        version=env._version,
        state=env._state,
        schema=env._schema,
        extension_schemas={**schemas, **env._extension_schemas},
        changes=changes,
        max_changes=env._log.maxlen,
    )


def change_json(change: EnvironmentChange) -> str:
    """One change of the log as compact JSON text, as `dump` writes it in ``changes``."""
    return json.dumps(_change(change), separators=(",", ":"))


def _change(c: EnvironmentChange) -> dict[str, object]:
    return {"version": c.version, "op": c.op, "pointer": c.pointer, "old": c.old, "new": c.new}


def load(text: str) -> _Snapshot:
    """Read `dump` output back.

    Raises:
        UserError: `text` is not an environment written by `Environment.to_json`.
    """
    try:
        return _Snapshot.model_validate(json.loads(text))
    except (ValueError, ValidationError) as err:
        raise UserError(
            f"the text {_brief(text)} is not an environment saved by Environment.to_json "
            f"({err}); pass to_json output unchanged"
        ) from err
