"""`agent-flow sessions`: list, show, export, import and delete stored sessions."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from agent_flow.cli._exit import EXIT_OK, EXIT_USAGE, _Failure, _Streams
from agent_flow.cli.render import format_cost
from agent_flow.config import load_store_config
from agent_flow.errors import SessionExistsError, SessionNotFoundError
from agent_flow.sessions import SessionInfo, SessionStore, open_store, store_location


def _check_db(db: str | None) -> None:
    """Refuse a ``--db`` that names a directory (a usage mistake, not a store failure)."""
    if db is not None and "://" not in db and Path(db).is_dir():
        raise _Failure(
            EXIT_USAGE,
            f"--db {db} is a directory; give the store's file, e.g. --db "
            f"{Path(db) / 'sessions.db'}",
        )


def _store_target(args: argparse.Namespace) -> str | None:
    """The store to open: ``--db``, else ``[store] url`` of ``--config``, else the default."""
    if args.db is not None:
        _check_db(args.db)
        return str(args.db)
    config = getattr(args, "config", None)
    return load_store_config(config).url if config else None


def _store(args: argparse.Namespace) -> SessionStore:
    """The session store the command's ``--db`` or ``--config`` selects (not yet opened)."""
    return open_store(_store_target(args))


def _stored(args: argparse.Namespace, *ids: str) -> SessionStore:
    """`_store` for a command that reads stored sessions (or deletes one): never made by it.

    A SQLite file that does not exist holds no session: asking it for one is the usage error
    of an unknown id (exit 2), not a store to create (with its folders) on the way.

    Raises:
        SessionNotFoundError: The store's file does not exist (naming the first of `ids`).
    """
    store = _store(args)
    missing = _missing_file(store)
    if missing is not None:
        name = f"session {ids[0]!r}" if ids else "session"
        raise SessionNotFoundError(f"no {name}: the store {missing} does not exist")
    return store


def _missing_file(store: SessionStore) -> Path | None:
    """The file of a SQLite `store` that does not exist (nothing was ever saved there)."""
    path = getattr(store, "path", None)
    return path if isinstance(path, Path) and not path.exists() else None


async def _sessions_list(args: argparse.Namespace, streams: _Streams) -> int:
    store = _store(args)
    missing = _missing_file(store)
    if missing is not None:
        if not args.json:
            streams.stdout.write(f"no sessions in {missing}\n")
        return EXIT_OK
    async with store:
        infos = await store.list(limit=args.limit)
    out = streams.stdout
    if args.json:
        for info in infos:
            out.write(info.model_dump_json() + "\n")
        return EXIT_OK
    if not infos:
        out.write(f"no sessions in {store_location(store)}\n")
        return EXIT_OK
    rows = [
        (
            info.id,
            info.status,
            str(info.steps),
            info.updated_at.astimezone().strftime("%Y-%m-%d %H:%M"),
            _tokens(info),
            "unknown" if info.cost_usd is None else format_cost(info.cost_usd),
            info.agent,
            _one_line(info.title, 60),
        )
        for info in infos
    ]
    header = ("ID", "STATUS", "STEPS", "UPDATED", "TOKENS", "COST", "AGENT", "TITLE")
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header) - 1)]
    for row in [header, *rows]:
        cells = [cell.ljust(width) for cell, width in zip(row, widths, strict=False)]
        out.write("  ".join([*cells, row[-1]]).rstrip() + "\n")
    out.write(f"{len(infos)} session(s) in {store_location(store)}\n")
    return EXIT_OK


def _tokens(info: SessionInfo) -> str:
    """Prompt plus completion tokens over all runs; ``~`` marks counts agent_flow estimated."""
    mark = "~" if info.estimated_calls else ""
    return f"{mark}{info.prompt_tokens + info.completion_tokens:,}"


def _usage_line(info: SessionInfo) -> str:
    """The session's model calls, tokens and cost, the summarizer's included."""
    notes = []
    if info.unpriced_calls:
        notes.append(f"{info.unpriced_calls} call(s) with no known price")
    if info.estimated_calls:
        notes.append(f"{info.estimated_calls} call(s) with usage estimated by agent_flow")
    return (
        f"{info.model_calls} model call(s), {info.prompt_tokens:,} prompt + "
        f"{info.completion_tokens:,} completion tokens, {format_cost(info.cost_usd)}"
        + (f" ({'; '.join(notes)})" if notes else "")
    )


def _one_line(text: str, limit: int) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


async def _sessions_show(args: argparse.Namespace, streams: _Streams) -> int:
    async with _stored(args, args.id) as store:
        state = await store.load(args.id)
        events = await store.events(args.id)
    info, out = state.info, streams.stdout
    out.write(f"session {info.id}  ({info.status})\n")
    out.write(f"  title:    {_one_line(info.title, 100)}\n")
    out.write(f"  agent:    {info.agent}\n")
    out.write(
        f"  created:  {info.created_at.astimezone():%Y-%m-%d %H:%M:%S}   "
        f"updated: {info.updated_at.astimezone():%Y-%m-%d %H:%M:%S}\n"
    )
    out.write(
        f"  stored:   {info.steps} steps, {info.entry_count} history entries, "
        f"{info.event_count} events, environment version {info.environment_version}\n"
    )
    out.write(f"  usage:    {_usage_line(info)}\n")
    out.write(f"\nhistory ({len(state.entries)} entries)\n")
    for entry in state.entries:
        out.write(f"  {_entry_line(entry.model_dump(mode='json'))}\n")
    environment = state.environment
    if environment is not None:
        task = environment.task
        out.write("\nenvironment\n")
        out.write(f"  task:      {_one_line(task.objective, 90)} [{task.status.value}]\n")
        if task.plan:
            done = sum(step.completed for step in task.plan)
            out.write(f"  plan:      {done}/{len(task.plan)} steps done\n")
            for step in task.plan:
                out.write(f"    [{'x' if step.completed else ' '}] {step.description}\n")
        out.write(f"  files:     {len(environment.workspace.files)} known\n")
        out.write(f"  facts:     {len(environment.knowledge.discovered_facts)}\n")
        for fact in environment.knowledge.discovered_facts[-5:]:
            out.write(f"    - {_one_line(fact, 100)}\n")
        extensions = environment.get("/extensions")
        names = sorted(extensions) if isinstance(extensions, dict) else []
        out.write(f"  extensions: {', '.join(names) or '-'}\n")
        if args.environment:
            out.write(json.dumps(json.loads(environment.to_json()), indent=2) + "\n")
    # The session's runs, each followed by the runs it delegated (``path``), indented.
    runs: dict[str, list[str]] = {}
    depth: dict[str, int] = {}
    for event in events:
        if event.kind == "run_started":
            runs.setdefault(event.run_id, []).insert(0, _one_line(event.task, 70))
            depth[event.run_id] = len(event.path)
        elif event.kind == "run_finished":
            runs.setdefault(event.run_id, []).append(
                f"{event.stop_reason}, {event.iterations} iteration(s)"
            )
    own = sum(1 for run_id in runs if not depth.get(run_id))
    delegated = f", {len(runs) - own} delegated" if len(runs) > own else ""
    out.write(f"\nruns ({own}{delegated})\n")
    for run_id, parts in runs.items():
        lead = "  " * depth.get(run_id, 0) + ("↳ " if depth.get(run_id) else "")
        out.write(f"  {lead}{run_id[:8]}  {' -> '.join(parts)}\n")
    return EXIT_OK


def _entry_line(data: dict[str, object]) -> str:
    kind = str(data.get("kind", "?"))
    if kind == "tool_call":
        call = data.get("call")
        call = call if isinstance(call, dict) else {}
        return f"{kind:12} {call.get('name')} {_one_line(str(call.get('arguments', '')), 80)}"
    if kind == "tool_result":
        flag = " (error)" if data.get("is_error") else ""
        body = _one_line(str(data.get("content", "")), 80)
        return f"{kind:12} {data.get('tool_name')}{flag}: {body}"
    return f"{kind:12} {_one_line(str(data.get('content', '')), 100)}"


async def _sessions_export(args: argparse.Namespace, streams: _Streams) -> int:
    if args.output:
        _check_output_folder(args.output)
    async with _stored(args, args.id) as store:
        if args.output:
            await store.export(args.id, args.output)
            streams.stderr.write(f"exported session {args.id} to {args.output}\n")
        else:
            await store.export(args.id, streams.stdout)
    return EXIT_OK


def _check_output_folder(file: str) -> None:
    """Refuse an export path whose folder does not exist (a usage mistake, not the store's)."""
    folder = Path(file).expanduser().resolve().parent
    if not folder.is_dir():
        raise _Failure(
            EXIT_USAGE, f"-o {file}: the folder {folder} does not exist; create it first"
        )


def _check_export_file(file: str) -> None:
    """Refuse an import path that is not a file (a usage mistake, not a store failure)."""
    if not Path(file).is_file():
        what = "is a directory" if Path(file).is_dir() else "does not exist"
        raise _Failure(
            EXIT_USAGE,
            f"{file} {what}; give a file written by `agent-flow sessions export ID -o FILE`",
        )


async def _sessions_import(args: argparse.Namespace, streams: _Streams) -> int:
    _check_export_file(args.file)
    async with _store(args) as store:
        try:
            info = await store.import_(args.file, session_id=args.id)
        except SessionExistsError as err:
            raise _Failure(
                EXIT_USAGE, f"{err}; or import it under another id with --id NEW_ID"
            ) from None
    streams.stdout.write(
        f"imported session {info.id} ({info.entry_count} entries) into {store_location(store)}\n"
    )
    return EXIT_OK


async def _sessions_delete(args: argparse.Namespace, streams: _Streams) -> int:
    async with _stored(args, args.id) as store:
        await store.delete(args.id)
    streams.stdout.write(f"deleted session {args.id}\n")
    return EXIT_OK
