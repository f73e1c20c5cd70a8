"""The fields every `agent_flow.events` event carries (a base shared by the event modules)."""

from __future__ import annotations

from datetime import UTC, datetime

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["_Event"]


def _now() -> datetime:
    return datetime.now(UTC)


class _Event(BaseModel):
    """Fields every event carries."""

    # JSON has no infinity or NaN: refuse them rather than write a line that cannot be read.
    model_config = ConfigDict(frozen=True, allow_inf_nan=False)

    run_id: str
    seq: int
    timestamp: datetime = Field(default_factory=_now)
