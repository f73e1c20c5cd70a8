"""The JSON-lines export format of a session, written by `SessionStore.export`.

Export format (`SessionStore.export`, read back by `SessionStore.import_`): UTF-8 JSON lines,
each an object tagged by ``kind`` (`ExportLine`): one ``session`` line (format and
`SessionInfo`), then one ``entry`` line per history entry in order, one ``environment`` line
(the `Environment.to_json` object, change log included) if the session has one, one ``event``
line per event in order, and a closing ``end`` line with the counts, so a truncated file is
refused rather than imported in part.

The format stays version 1 while `SessionInfo` only gains fields with defaults (``task``, the
usage totals, ``owner``, the event ids and lease): an export written before a field existed
imports with its default (usage totals are recomputed from the events in any case).

Event ids are not exported: an import is a new session to the store that stores it, written
without a lease. Its events get the ids 0, 1, ... in order (`SessionInfo.last_event_id` is the
count less one), it holds no lease and its fence is 0, whatever the header says; the first
claim after it gets fence 1, whose ids are above all of those.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import IO, Annotated, Final, Literal, TypeAlias
from uuid import uuid4

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from agent_flow._types import JsonObject
from agent_flow.environment import Environment
from agent_flow.errors import (
    EnvironmentValidationError,
    ExportFormatError,
    StoreError,
    UserError,
)
from agent_flow.events import AgentEvent, event_to_json
from agent_flow.history import HISTORY_ENTRY_ADAPTER, History, HistoryEntry
from agent_flow.sessions._backend import (
    _EntryRow,
    _environment_text,
    _EventRow,
    _Import,
    _problem,
    _Stored,
)
from agent_flow.sessions._usage import _Totals
from agent_flow.sessions.models import SessionInfo, _check_id
from agent_flow.tokens import ApproxCounter

__all__ = [
    "EXPORT_FORMAT",
    "EXPORT_LINE_ADAPTER",
    "EndLine",
    "EntryLine",
    "EnvironmentLine",
    "EventLine",
    "ExportLine",
    "SessionHeaderLine",
    "read_export_lines",
]

#: The version of the format `SessionStore.export` writes.
EXPORT_FORMAT: Final = 1


class SessionHeaderLine(BaseModel):
    """The first line of an export: the format and the session's description."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["session"] = "session"
    format: Literal[1] = EXPORT_FORMAT
    session: SessionInfo


class EntryLine(BaseModel):
    """One history entry of an export, in history order."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["entry"] = "entry"
    entry: HistoryEntry


class EnvironmentLine(BaseModel):
    """The environment of an export: the `Environment.to_json` object, change log included."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["environment"] = "environment"
    environment: JsonObject


class EventLine(BaseModel):
    """One event of an export, in the order they were saved."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["event"] = "event"
    event: AgentEvent


class EndLine(BaseModel):
    """The last line of an export: how many entries and events came before it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["end"] = "end"
    entries: int = Field(ge=0)
    events: int = Field(ge=0)


ExportLine: TypeAlias = Annotated[
    SessionHeaderLine | EntryLine | EnvironmentLine | EventLine | EndLine,
    Field(discriminator="kind"),
]
#: Validates one line of an export (JSON tag: ``kind``).
EXPORT_LINE_ADAPTER: TypeAdapter[ExportLine] = TypeAdapter(ExportLine)


def _export_lines(stored: _Stored) -> Iterator[str]:
    # Stored rows are already compact JSON: splice them in rather than parse and re-dump.
    yield SessionHeaderLine(session=stored.info).model_dump_json()
    for data in stored.entries:
        yield f'{{"kind":"entry","entry":{data}}}'
    if stored.environment is not None:
        environment = _environment_text(stored.environment, stored.changes)
        yield f'{{"kind":"environment","environment":{environment}}}'
    for data in stored.events:
        yield f'{{"kind":"event","event":{data}}}'
    yield EndLine(entries=len(stored.entries), events=len(stored.events)).model_dump_json()


def _write_lines(lines: Iterable[str], target: str | Path | IO[str]) -> None:
    if not isinstance(target, str | Path):
        for line in lines:
            target.write(line + "\n")
        target.flush()
        return
    path = Path(target)
    partial = path.with_name(f".{path.name}.{uuid4().hex[:8]}.partial")
    try:
        with partial.open("w", encoding="utf-8", newline="\n") as file:
            for line in lines:
                file.write(line + "\n")
        partial.replace(path)
    except OSError as err:
        partial.unlink(missing_ok=True)
        # The reason alone: the error names the temporary file the export is written to first.
        raise StoreError(
            f"cannot write the export to {str(path)!r}: {err.strerror or err}"
        ) from err


def read_export_lines(source: str | Path | IO[str], label: str) -> list[str]:
    """The lines of an export file or stream (`label` names it in the error).

    Raises:
        ExportFormatError: The file cannot be read, or is not UTF-8.
    """
    if not isinstance(source, str | Path):
        return source.read().splitlines()
    try:
        return Path(source).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as err:
        raise ExportFormatError(f"cannot read the export {label}: {err}") from err


def _parse_export(lines: Sequence[str], label: str, session_id: str | None) -> _Import:
    """Validate a whole export and return what to store."""
    header: SessionHeaderLine | None = None
    end: EndLine | None = None
    entries: list[HistoryEntry] = []
    environment: JsonObject | None = None
    events: list[AgentEvent] = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        if end is not None:
            raise ExportFormatError(f"line {number} of {label} follows the end line; remove it")
        try:
            item = EXPORT_LINE_ADAPTER.validate_json(line)
        except ValidationError as err:
            raise ExportFormatError(
                f"line {number} of {label} is not a session export line ({_problem(err)}); "
                "import only what SessionStore.export wrote"
            ) from err
        if header is None:
            if not isinstance(item, SessionHeaderLine):
                raise ExportFormatError(
                    f"{label} starts with a {item.kind!r} line, not a session line; import only "
                    "what SessionStore.export wrote"
                )
            header = item
        elif isinstance(item, EntryLine):
            entries.append(item.entry)
        elif isinstance(item, EnvironmentLine):
            if environment is not None:
                raise ExportFormatError(f"line {number} of {label} is a second environment line")
            environment = item.environment
        elif isinstance(item, EventLine):
            events.append(item.event)
        elif isinstance(item, EndLine):
            end = item
        else:
            raise ExportFormatError(f"line {number} of {label} is a second session line")
    if header is None:
        raise ExportFormatError(f"{label} is empty; import only what SessionStore.export wrote")
    if end is None:
        raise ExportFormatError(f"{label} has no end line: the export is incomplete (cut short?)")
    if (end.entries, end.events) != (len(entries), len(events)):
        raise ExportFormatError(
            f"{label} announces {end.entries} entries and {end.events} events but holds "
            f"{len(entries)} and {len(events)}; the export was altered"
        )
    try:
        # Any counter checks the unit rules; the cheapest will do.
        History(entries, counter=ApproxCounter())
    except UserError as err:
        raise ExportFormatError(f"the history in {label} is inconsistent: {err}") from err
    base: str | None = None
    changes: tuple[tuple[int, str], ...] = ()
    version = 0
    if environment is not None:
        try:
            env = Environment.from_json(json.dumps(environment))
        except (UserError, EnvironmentValidationError) as err:
            raise ExportFormatError(f"the environment in {label} is invalid: {err}") from err
        payload = json.loads(env.to_json())
        changes = tuple(
            (c["version"], json.dumps(c, separators=(",", ":"))) for c in payload.pop("changes")
        )
        base = json.dumps(payload, separators=(",", ":"))
        version = env.version
    event_rows = tuple(_EventRow(e.run_id, e.seq, e.kind, event_to_json(e)) for e in events)
    info = header.session.model_copy(
        update={
            "id": session_id if session_id is not None else _check_id(header.session.id),
            "entry_count": len(entries),
            "event_count": len(events),
            "environment_version": version,
            "last_event_id": len(events) - 1,
            "lease_run": None,
            "lease_fence": 0,
            # Recomputed from the events, as the counts are: an export of an older version
            # (without totals) or an edited header imports with the totals its events give.
            **_Totals.over((e.kind, e.data) for e in event_rows).fields(),
        }
    )
    return _Import(
        info=info,
        revision=uuid4().hex,
        entries=tuple(
            _EntryRow(e.id, e.kind, HISTORY_ENTRY_ADAPTER.dump_json(e).decode()) for e in entries
        ),
        environment=base,
        changes=changes,
        events=event_rows,
    )
