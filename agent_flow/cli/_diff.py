"""`agent-flow sessions diff A B`: two sessions' environments and prompt budgets side by side.

The comparison itself is `agent_flow.sessions.diff.diff_sessions`; this module prints it: a
line per session (status, runs, prompts, tokens), every environment pointer that differs
(``+`` only in B, ``-`` only in A, ``~`` changed), and a table of the prompts step by step
(total tokens, the environment's and the history's share, units left out, B minus A; a delegated
child's prompt is marked by one ``>`` per level). A and B are session ids or export files
"""

from __future__ import annotations

import argparse
import json
from typing import IO

from agent_flow._types import JsonValue
from agent_flow.cli._exit import EXIT_OK, _Streams
from agent_flow.cli._source import _load_session
from agent_flow.sessions.diff import (
    PointerDiff,
    SessionDiff,
    SessionTotals,
    StepBudget,
    diff_sessions,
)

_VALUE_CHARS = 70
_SIGNS = {"added": "+", "removed": "-", "changed": "~"}


def _value(value: JsonValue) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= _VALUE_CHARS else text[: _VALUE_CHARS - 1] + "…"


def _change_line(change: PointerDiff) -> str:
    pointer = change.pointer or "(the whole environment)"
    if change.op == "added":
        return f"  + {pointer}: {_value(change.b)}"
    if change.op == "removed":
        return f"  - {pointer}: {_value(change.a)}"
    return f"  ~ {pointer}: {_value(change.a)} -> {_value(change.b)}"


def _totals_line(label: str, origin: str, totals: SessionTotals) -> str:
    stops = ", ".join(totals.stop_reasons) or "-"
    cost = f", ${totals.cost_usd:.4f}" if totals.cost_usd is not None else ""
    children = f" (+{totals.child_runs} delegated)" if totals.child_runs else ""
    return (
        f"{label}  {origin} ({totals.status}): {totals.runs} run(s){children} [{stops}], "
        f"{totals.prompts} prompt(s), {totals.tokens_sent} tokens sent, "
        f"{totals.units_omitted} unit(s) left out; model usage {totals.prompt_tokens} prompt + "
        f"{totals.completion_tokens} completion tokens{cost}"
    )


def _cells(budget: StepBudget | None) -> list[str]:
    if budget is None:
        return ["-", "-", "-", "-"]
    b = budget.breakdown
    return [str(b.total), str(b.environment), str(b.history), str(b.history_units_omitted)]


def _percent(a: int, b: int) -> str:
    return f" ({(b - a) / a:+.1%})" if a else ""


def _write_diff(out: IO[str], diff: SessionDiff, origins: tuple[str, str]) -> None:
    out.write(_totals_line("A", origins[0], diff.a) + "\n")
    out.write(_totals_line("B", origins[1], diff.b) + "\n")
    if diff.environment:
        out.write(f"\nenvironment: {len(diff.environment)} difference(s) from A to B\n")
        for change in diff.environment:
            out.write(_change_line(change) + "\n")
    else:
        out.write("\nenvironment: the same in A and B\n")
    if not diff.steps:
        out.write("\nprompts: none recorded in either session\n")
        return
    out.write("\nprompts step by step (tokens; env and hist are shares of the total)\n")
    header = ["STEP", "A TOTAL", "ENV", "HIST", "OMITTED", "B TOTAL", "ENV", "HIST", "OMITTED"]
    rows = [[*header, "B-A"]]
    for step in diff.steps:
        delta = step.delta
        depth = max(s.depth for s in (step.a, step.b) if s is not None)
        rows.append(
            [
                # A delegated child's prompt: marked by one ">" per level of delegation.
                ">" * depth + str(step.step),
                *_cells(step.a),
                *_cells(step.b),
                "-" if delta is None else f"{delta:+d}",
            ]
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        out.write("  ".join(cell.rjust(width) for cell, width in zip(row, widths, strict=True)))
        out.write("\n")
    a, b = diff.a.tokens_sent, diff.b.tokens_sent
    out.write(f"tokens sent: A {a}, B {b}, B-A {b - a:+d}{_percent(a, b)}\n")


async def _sessions_diff(args: argparse.Namespace, streams: _Streams) -> int:
    first = await _load_session(args.a, args)
    second = await _load_session(args.b, args)
    diff = diff_sessions(first.state, first.events, second.state, second.events)
    if args.json:
        streams.stdout.write(diff.model_dump_json() + "\n")
        return EXIT_OK
    _write_diff(streams.stdout, diff, (first.origin, second.origin))
    return EXIT_OK
