"""Type aliases shared across agent_flow."""

from __future__ import annotations

from typing import TypeAlias

from pydantic import JsonValue

__all__ = ["JsonObject", "JsonValue"]

#: A JSON object (``JsonValue`` is pydantic's recursive alias for any JSON value).
JsonObject: TypeAlias = dict[str, JsonValue]
