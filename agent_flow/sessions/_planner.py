"""What one `save_step` writes: the append planner over what a store last saved.

Plain synchronous functions over a `_Tracked` record (see "Cost of a step" in the
`agent_flow.sessions` package doc): `_kept_entries` finds how many stored entries still hold,
`_environment_write` the snapshot and changes to write.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

from agent_flow.environment import Environment
from agent_flow.history import History, HistoryEntry
from agent_flow.sessions._backend import _EnvironmentWrite


@dataclass(slots=True)
class _Tracked:
    """What this store last saved of one session (touched on the event-loop thread only)."""

    revision: str
    entries: list[HistoryEntry]
    history: weakref.ref[History] | None = None
    history_version: int = -1
    environment: weakref.ref[Environment] | None = None
    environment_version: int = -1


def _kept_entries(tracked: _Tracked, history: History) -> int:
    """How many leading entries of `history` are stored already (O(1) when it only grew)."""
    saved = tracked.entries
    entries = history.entries
    grown = len(entries) - len(saved)
    # The same history, with nothing replaced since the last save, only had entries appended.
    # (Version arithmetic alone is not proof: a pruning that rewrites an old entry and adds
    # one more unit than it drops looks like an append of the same length.)
    if (
        tracked.history is not None
        and tracked.history() is history
        and history.replaced_version <= tracked.history_version
        and grown >= 0
        and history.version - tracked.history_version == grown
        and (not saved or entries[len(saved) - 1] is saved[-1])
    ):
        return len(saved)
    # Pruned, summarized, or another history: entries are frozen, so a kept one is the same
    # object (or, after a load, an equal one).
    for index, (mine, stored) in enumerate(zip(entries, saved, strict=False)):
        if mine is not stored and mine != stored:
            return index
    return min(len(entries), len(saved))


def _environment_write(tracked: _Tracked, environment: Environment) -> _EnvironmentWrite | None:
    """The snapshot and changes to write, or None when the environment did not change."""
    version = environment.version
    same = tracked.environment is not None and tracked.environment() is environment
    if same and version == tracked.environment_version:
        return None
    # The same object only moved forward, so its log continues what is stored; otherwise
    # (another object, e.g. after a reload elsewhere) the stored log is replaced by its log.
    reset = not (same and version > tracked.environment_version)
    since = -1 if reset else tracked.environment_version
    base, fresh = environment._saved_parts(since)
    return _EnvironmentWrite(
        base=base,
        version=version,
        changes=tuple(fresh),
        reset=reset,
        trim_through=version - environment.max_changes,
    )
