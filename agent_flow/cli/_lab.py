"""`agent-flow lab`: replay recorded sessions under candidate budgets and strategies.

The sessions are store ids or JSON-lines exports (a path to an existing file); the candidates
come from ``--candidates FILE`` (a lab file or an agent.toml, see `agent_flow.lab.candidates`)
and from every ``--strategy`` crossed with every ``--budget``. It prints the table, or the
report as JSON with ``--json``, and writes the HTML report with ``--html FILE``.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from agent_flow.cli._build import _check_base_url
from agent_flow.cli._exit import EXIT_OK, EXIT_USAGE, _Failure, _Streams
from agent_flow.cli._sessions import _stored
from agent_flow.config import StrategyName
from agent_flow.lab import (
    Candidate,
    RecordedSession,
    load_candidates,
    load_export,
    load_session,
    render_html,
    render_table,
    run_lab,
)
from agent_flow.lab.candidates import STRATEGY_NAMES, strategy_from_name
from agent_flow.llm.base import LLMClient

__all__ = ["_lab_command"]


def _candidates(args: argparse.Namespace) -> tuple[list[Candidate], list[str]]:
    candidates: list[Candidate] = []
    probes: list[str] = []
    if args.candidates is not None:
        candidates, probes = load_candidates(args.candidates)
    if args.budget:
        strategies: list[StrategyName] = args.strategy or list(STRATEGY_NAMES)
        if args.reserve is not None and any(args.reserve >= b for b in args.budget):
            raise _Failure(
                EXIT_USAGE, f"--reserve {args.reserve} must be smaller than every --budget"
            )
        candidates.extend(
            Candidate(
                name=f"{name}@{budget}",
                max_tokens=budget,
                strategy=strategy_from_name(name, window_turns=args.window_turns),
                reserve_output_tokens=args.reserve,
            )
            for budget in args.budget
            for name in strategies
        )
    elif args.strategy:
        raise _Failure(EXIT_USAGE, "--strategy needs at least one --budget to try it with")
    if not candidates:
        raise _Failure(
            EXIT_USAGE,
            "nothing to compare: give --budget TOKENS (with --strategy NAME, or all four), or "
            "--candidates FILE",
        )
    return candidates, probes


def _exports(names: list[str]) -> list[RecordedSession | None]:
    """Each name that is a file, read as an export; None for the others (store ids)."""
    return [load_export(name) if Path(name).is_file() else None for name in names]


def _write_html(path: str, text: str) -> None:
    try:
        Path(path).write_text(text, encoding="utf-8")
    except OSError as err:
        raise _Failure(EXIT_USAGE, f"--html {path} cannot be written: {err}") from err


async def _sessions(args: argparse.Namespace) -> list[RecordedSession]:
    sessions = _exports(args.sessions)
    ids = [name for name, session in zip(args.sessions, sessions, strict=True) if session is None]
    if ids:
        async with _stored(args, *ids) as store:
            stored = {sid: await load_session(store, sid) for sid in ids}
        sessions = [
            session if session is not None else stored[name]
            for name, session in zip(args.sessions, sessions, strict=True)
        ]
    found = [s for s in sessions if s is not None]
    if args.delegated:
        found = [replayed for s in found for replayed in (s, *s.delegated)]
    return found


def _model(args: argparse.Namespace, sessions: list[RecordedSession]) -> LLMClient | None:
    """The live model ``--ask`` re-asks: ``--model``, else the first session's."""
    if not args.ask:
        return None
    model = args.model or next((s.model for s in sessions if s.model), None)
    if model is None:
        raise _Failure(EXIT_USAGE, "--ask needs --model: the sessions do not name their model")
    from agent_flow.llm import OpenAIClient

    return OpenAIClient(
        model,
        base_url=args.base_url,
        api_key_env=args.api_key_env,
        max_retries=0,
        timeout=args.timeout,
    )


async def _lab_command(args: argparse.Namespace, streams: _Streams) -> int:
    candidates, probes = _candidates(args)
    if args.ask:  # a usage error before any session is read
        url = args.base_url or os.environ.get("OPENAI_BASE_URL") or None
        _check_base_url(url, flag=args.base_url, config_url=None)
    sessions = await _sessions(args)
    llm = _model(args, sessions)
    report = await run_lab(
        sessions,
        candidates,
        probes=[*probes, *args.probe],
        model=args.model,
        pricing=args.pricing,
        llm=llm,
    )
    if args.html is not None:
        _write_html(args.html, render_html(report))
    if args.json:
        streams.stdout.write(report.model_dump_json(indent=2) + "\n")
    else:
        streams.stdout.write(render_table(report))
        if args.html is not None:
            streams.stdout.write(f"HTML report: {args.html}\n")
    return EXIT_OK
