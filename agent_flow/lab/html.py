"""The lab's HTML report: one self-contained page with inline SVG plots, for offline reading.

`render_html` writes the whole page as one string: a summary table (the cost shows its known
part, ``≥ $x + unknown``, when a session's model has no price; beside it, the share of the
tokens a prefix cache could serve and the cost with them cached) and a probe table (one row per
probe: at how many steps each candidate's prompt still held it); then for each session two line
charts (tokens per step with each candidate's budget, and retention per step), one lane chart
per probe (each candidate's lane is high where its prompt held the probe, low where it was left
out), and each candidate's step-by-step detail. Each candidate has its own colour *and* dash
pattern, and a chart's legend says when one candidate's line is the same as another's (it is
drawn on top of it, so it would otherwise look like one candidate). No script, no stylesheet or
font from a network: the file opens the same on a machine without internet.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

from agent_flow.lab.report import (
    CandidateResult,
    LabReport,
    SessionResult,
    format_cost,
    probe_cell,
)

__all__ = ["render_html"]

# Distinguishable colours (Okabe-Ito), reused in order when there are more candidates.
_COLOURS = ("#0072b2", "#d55e00", "#009e73", "#cc79a7", "#e69f00", "#56b4e9", "#000000")
# Dash patterns, cycled with a period prime to the colours' (7), so that no two of the first
# 42 candidates look alike; the budget lines use "4 4", which none of these is.
_DASHES = ("", "10 4", "3 3", "12 4 3 4", "7 2", "2 6")
_WIDTH, _HEIGHT = 540, 260
_LEFT, _RIGHT, _TOP, _BOTTOM = 64, 16, 28, 40
_LANE, _LANE_LEFT, _LANE_LABEL = 24, 150, 22

_SOURCES = {
    "history": "history as stored",
    "events": "history rebuilt from the events (it was pruned while it ran)",
}

_STYLE = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:2rem auto;max-width:72rem;
color:#222;padding:0 1rem}
table{border-collapse:collapse;margin:1rem 0;font-size:.9rem}
th,td{border:1px solid #ccc;padding:.25rem .5rem;text-align:right}
th:nth-child(-n+2),td:nth-child(-n+2){text-align:left}
table.probes td,table.probes th{text-align:left}
table.summary td:nth-child(7){white-space:nowrap}
.charts{display:flex;flex-wrap:wrap;gap:1rem}
figure{margin:0}
.note{color:#555;font-size:.9rem}
.legend{font-size:.85rem;margin:.25rem 0 0 0;max-width:540px}
.legend span{display:inline-block;margin-right:1rem}
.legend svg{vertical-align:middle;margin-right:.3rem}
.same{color:#555;font-style:italic}
svg text{font-size:11px;fill:#333}
details{margin:.5rem 0}
"""


@dataclass(frozen=True, slots=True)
class _Look:
    """How a candidate is drawn: its colour and dash pattern."""

    colour: str
    dash: str

    def stroke(self) -> str:
        dash = f' stroke-dasharray="{self.dash}"' if self.dash else ""
        return f'stroke="{self.colour}"{dash}'


def _look(index: int) -> _Look:
    return _Look(_COLOURS[index % len(_COLOURS)], _DASHES[index % len(_DASHES)])


@dataclass(frozen=True, slots=True)
class _Series:
    name: str
    look: _Look
    points: tuple[tuple[float, float], ...]
    limit: float | None = None  # drawn as a dashed horizontal line


def _nice(value: float) -> float:
    """The smallest of 1, 2, 2.5 or 5 times a power of ten that is at least `value`."""
    if value <= 0:
        return 1.0
    power = 10.0 ** math.floor(math.log10(value))
    return next(power * f for f in (1, 2, 2.5, 5, 10) if power * f >= value)


def _ticks(top: float, count: int = 4) -> list[float]:
    return [top * i / count for i in range(count + 1)]


def _x_scale(x_max: int, left: int, width: int) -> tuple[float, float]:
    """Where step 1 is drawn, and the width of one step."""
    plot_w = width - left - _RIGHT
    if x_max > 1:
        return left, plot_w / (x_max - 1)
    return left + plot_w / 2, 0.0


def _step_labels(x_max: int, left: int, baseline: float) -> str:
    first, per_step = _x_scale(x_max, left, _WIDTH)
    every = max(1, x_max // 10)
    return "".join(
        f'<text x="{first + per_step * (step - 1):.1f}" y="{baseline:.1f}" '
        f'text-anchor="middle">{step}</text>'
        for step in range(1, x_max + 1, every)
    )


def _chart(
    title: str, series: Sequence[_Series], *, x_max: int, y_max: float, percent: bool
) -> str:
    """A line chart of `series` (x: steps 1..x_max, y: 0..y_max) as an SVG element."""
    plot_w = _WIDTH - _LEFT - _RIGHT
    plot_h = _HEIGHT - _TOP - _BOTTOM
    y_max = y_max or 1.0
    first, per_step = _x_scale(x_max, _LEFT, _WIDTH)

    def x(step: float) -> float:
        return first + per_step * (step - 1)

    def y(value: float) -> float:
        return _TOP + plot_h * (1 - value / y_max)

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{_WIDTH}" height="{_HEIGHT}" '
        f'viewBox="0 0 {_WIDTH} {_HEIGHT}" role="img" aria-label="{escape(title)}">',
        f'<text x="{_LEFT}" y="16" style="font-weight:bold;font-size:13px">{escape(title)}</text>',
        f'<rect x="{_LEFT}" y="{_TOP}" width="{plot_w}" height="{plot_h}" fill="none" '
        'stroke="#999"/>',
    ]
    for tick in _ticks(y_max):
        label = f"{tick:.0%}" if percent else f"{tick:,.0f}"
        parts.append(
            f'<line x1="{_LEFT}" x2="{_LEFT + plot_w}" y1="{y(tick):.1f}" y2="{y(tick):.1f}" '
            'stroke="#eee"/>'
            f'<text x="{_LEFT - 6}" y="{y(tick) + 4:.1f}" text-anchor="end">{label}</text>'
        )
    parts.append(_step_labels(x_max, _LEFT, _TOP + plot_h + 16))
    parts.append(
        f'<text x="{_LEFT + plot_w / 2:.1f}" y="{_HEIGHT - 6}" text-anchor="middle">step</text>'
    )
    for index, line in enumerate(series):
        # Earlier lines are drawn wider, so that a line another one covers still shows.
        width = 2 + 2 * (len(series) - 1 - index)
        if line.limit is not None and line.limit <= y_max:
            parts.append(
                f'<line class="budget" x1="{_LEFT}" x2="{_LEFT + plot_w}" '
                f'y1="{y(line.limit):.1f}" y2="{y(line.limit):.1f}" stroke="{line.look.colour}" '
                'stroke-dasharray="4 4" stroke-opacity=".6"/>'
            )
        coords = " ".join(f"{x(px):.1f},{y(py):.1f}" for px, py in line.points)
        parts.append(
            f'<polyline fill="none" {line.look.stroke()} stroke-width="{width}" '
            f'stroke-opacity=".8" data-candidate="{escape(line.name)}" points="{coords}">'
            f"<title>{escape(line.name)}</title></polyline>"
        )
        parts.extend(
            f'<circle cx="{x(px):.1f}" cy="{y(py):.1f}" r="2.5" fill="{line.look.colour}">'
            f"<title>{escape(line.name)}, step {px:.0f}: "
            f"{f'{py:.0%}' if percent else f'{py:,.0f} tokens'}</title></circle>"
            for px, py in line.points
        )
    parts.append("</svg>")
    return "".join(parts)


def _swatch(look: _Look) -> str:
    return (
        '<svg width="28" height="10" aria-hidden="true">'
        f'<line x1="0" x2="28" y1="5" y2="5" {look.stroke()} stroke-width="3"/></svg>'
    )


def _same_lines(series: Sequence[_Series]) -> dict[int, str]:
    """For each series drawn exactly over an earlier one, that one's name."""
    same: dict[int, str] = {}
    for index, line in enumerate(series):
        for earlier in series[:index]:
            if earlier.points == line.points:
                same[index] = earlier.name
                break
    return same


def _legend(series: Sequence[_Series], y_max: float) -> str:
    same = _same_lines(series)
    spans = []
    for index, line in enumerate(series):
        notes = []
        if index in same:
            notes.append(f"same line as {escape(same[index])}")
        if line.limit is not None and line.limit > y_max:
            notes.append(f"its budget, {line.limit:,.0f}, is above the chart")
        note = f' <span class="same">({"; ".join(notes)})</span>' if notes else ""
        spans.append(
            f'<span data-candidate="{escape(line.name)}">{_swatch(line.look)}'
            f"{escape(line.name)}{note}</span>"
        )
    return f'<figcaption class="legend">{"".join(spans)}</figcaption>'


def _figure(
    title: str, series: Sequence[_Series], *, x_max: int, y_max: float, percent: bool
) -> str:
    """A chart with its legend underneath (which says which lines coincide)."""
    chart = _chart(title, series, x_max=x_max, y_max=y_max, percent=percent)
    return f'<figure class="chart">{chart}{_legend(series, y_max or 1.0)}</figure>'


def _probe_chart(
    probe: str, number: int, results: Sequence[tuple[int, CandidateResult, SessionResult]]
) -> str:
    """One lane per candidate: high where its prompt held the probe, low where it left it out.

    Steps before the session held the probe have no mark.
    """
    id = f"probe:{number}"
    x_max = max((len(s.steps) for _, _, s in results), default=1) or 1
    first, per_step = _x_scale(x_max, _LANE_LEFT, _WIDTH)
    height = _TOP + _LANE * len(results) + _BOTTOM - 10
    title = f"Probe \u201c{probe}\u201d: in the prompt at each step?"
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{_WIDTH}" height="{height}" '
        f'viewBox="0 0 {_WIDTH} {height}" role="img" class="probe" '
        f'data-probe="{escape(probe)}" aria-label="{escape(title)}">',
        f'<text x="{_LEFT}" y="16" style="font-weight:bold;font-size:13px">{escape(title)}</text>',
    ]
    for lane, (index, candidate, session) in enumerate(results):
        look = _look(index)
        top = _TOP + lane * _LANE
        high, low = top + 5, top + _LANE - 7
        name = candidate.name
        label = name if len(name) <= _LANE_LABEL else name[: _LANE_LABEL - 1] + "\u2026"
        parts.append(
            f'<g class="lane" data-candidate="{escape(name)}">'
            f'<line x1="{_LANE_LEFT}" x2="{_WIDTH - _RIGHT}" y1="{low}" y2="{low}" '
            'stroke="#eee"/>'
            f'<text x="{_LANE_LEFT - 8}" y="{top + _LANE / 2 + 3:.1f}" text-anchor="end">'
            f"{escape(label)}<title>{escape(name)}</title></text>"
        )
        segment: list[str] = []
        marks: list[str] = []
        for step in session.steps:
            px = first + per_step * (step.step - 1)
            if id not in step.available:
                if len(segment) > 1:
                    parts.append(_segment(segment, look))
                segment = []
                continue
            shown = id in step.visible
            py = high if shown else low
            segment.append(f"{px:.1f},{py}")
            what = "in the prompt" if shown else "left out"
            fill = look.colour if shown else "#fff"
            marks.append(
                f'<circle class="{"in" if shown else "out"}" cx="{px:.1f}" cy="{py}" r="3.5" '
                f'fill="{fill}" stroke="{look.colour}" stroke-width="1.5">'
                f"<title>{escape(name)}, step {step.step}: {what}</title></circle>"
            )
        if len(segment) > 1:
            parts.append(_segment(segment, look))
        parts.extend(marks)
        parts.append("</g>")
    bottom = _TOP + _LANE * len(results)
    parts.append(_step_labels(x_max, _LANE_LEFT, bottom + 12))
    parts.append("</svg>")
    caption = (
        '<figcaption class="legend">each lane is high (filled) where that candidate\'s prompt '
        "held the probe, low (hollow) where it was left out; no mark: the session did not hold "
        "it yet</figcaption>"
    )
    return f'<figure class="chart">{"".join(parts)}{caption}</figure>'


def _segment(points: Sequence[str], look: _Look) -> str:
    return (
        f'<polyline fill="none" {look.stroke()} stroke-width="2" stroke-opacity=".7" '
        f'points="{" ".join(points)}"/>'
    )


def _summary_table(report: LabReport) -> str:
    head = (
        "candidate",
        "strategy",
        "budget",
        "steps",
        "tokens",
        "max/step",
        "cost",
        "cacheable",
        "cost if cached",
        "prunes",
        "summaries",
        "units omitted",
        "retained at end",
        "retained (mean)",
    )
    rows = []
    for c in report.candidates:
        cost = format_cost(c.cost_known_usd, c.unpriced_steps, c.steps)
        cached = format_cost(c.cost_cached_known_usd, c.unpriced_steps, c.steps)
        cacheable = f"{c.cached_tokens / c.tokens:.0%}" if c.tokens else "-"
        cells = (
            c.name, c.strategy, f"{c.max_tokens:,}", str(c.steps), f"{c.tokens:,}",
            f"{c.max_step_tokens:,}", cost, cacheable, cached, str(c.prunes), str(c.summaries),
            str(c.units_omitted), f"{c.retention_final:.0%}", f"{c.retention_mean:.0%}",
        )  # fmt: skip
        rows.append("<tr>" + "".join(f"<td>{escape(cell)}</td>" for cell in cells) + "</tr>")
    header = "<tr>" + "".join(f"<th>{escape(h)}</th>" for h in head) + "</tr>"
    return f'<table class="summary">{header}{"".join(rows)}</table>'


def _probe_table(report: LabReport) -> str:
    """One row per probe, one column per candidate: is it still in the prompt?"""
    if not report.probes or not report.candidates:
        return ""
    header = "<tr><th>probe</th>" + "".join(f"<th>{escape(c.name)}</th>" for c in report.candidates)
    rows = []
    for index, probe in enumerate(report.probes):
        cells = "".join(
            f"<td>{escape(probe_cell(c.probes[index]) if index < len(c.probes) else '-')}</td>"
            for c in report.candidates
        )
        rows.append(
            f'<tr data-probe="{escape(probe)}"><td><code>{escape(probe)}</code></td>{cells}</tr>'
        )
    return (
        "<h2>Probes</h2>"
        '<p class="note">Steps at which the prompt held the probe, of the steps at which the '
        "session held it, and whether the last prompt held it.</p>"
        f'<table class="probes">{header}</tr>{"".join(rows)}</table>'
    )


def _session_section(report: LabReport, index: int) -> str:
    results: list[tuple[int, CandidateResult, SessionResult]] = [
        (i, c, c.sessions[index]) for i, c in enumerate(report.candidates)
    ]
    first = results[0][2]
    x_max = max((len(s.steps) for _, _, s in results), default=1) or 1
    # The axis follows the prompts; a budget far above them (more than twice the largest
    # prompt) would flatten every line, so it is left off the chart and its legend says so.
    largest = max((t.tokens for _, _, s in results for t in s.steps), default=0)
    limits = [c.max_tokens - c.reserve_output_tokens for _, c, _ in results]
    near = [limit for limit in limits if largest == 0 or limit <= 2 * largest]
    y_max = _nice(max([largest, *near]) * 1.05)
    tokens = [
        _Series(
            c.name,
            _look(i),
            tuple((t.step, t.tokens) for t in s.steps),
            limit=c.max_tokens - c.reserve_output_tokens,
        )
        for i, c, s in results
    ]
    retention = [
        _Series(c.name, _look(i), tuple((t.step, t.retention) for t in s.steps))
        for i, c, s in results
    ]
    probes = "".join(
        _probe_chart(probe, number, results)
        for number, probe in enumerate(report.probes, 1)
        if any(f"probe:{number}" in t.available for _, _, s in results for t in s.steps)
    )
    notes = "".join(f'<p class="note">{escape(n)}</p>' for n in first.notes)
    details = "".join(_candidate_details(c, s) for _, c, s in results)
    return (
        f"<h2>Session {escape(first.session)}: {escape(first.title)}</h2>"
        f'<p class="note">{_SOURCES.get(first.source, first.source)}; priced as '
        f"{escape(first.model or 'unknown model')}; {len(first.facts)} facts tracked</p>{notes}"
        + '<div class="charts">'
        + _figure("Prompt tokens per step (dashed: budget less reserve)", tokens,
                  x_max=x_max, y_max=y_max, percent=False)
        + _figure("Retention: visible / available facts", retention,
                  x_max=x_max, y_max=1.0, percent=True)
        + probes
        + f"</div>{details}"
    )  # fmt: skip


def _candidate_details(candidate: CandidateResult, session: SessionResult) -> str:
    labels = {f.id: f.label for f in session.facts}
    rows = []
    for step in session.steps:
        lost = [labels[i] for i in step.available if i not in step.visible]
        action = ", ".join(
            part
            for part, count in (
                ("dropped", step.dropped),
                ("elided", step.elided),
                ("summarized", step.folded),
            )
            if count
        )
        cells = (
            str(step.step),
            f"{step.tokens:,}",
            f"{step.cached_tokens:,}",
            f"{step.breakdown.environment:,}",
            f"{step.breakdown.history:,}",
            action or "-",
            str(step.units_omitted),
            f"{len(step.visible)}/{len(step.available)}",
            "; ".join(lost) or "-",
        )
        rows.append("<tr>" + "".join(f"<td>{escape(c)}</td>" for c in cells) + "</tr>")
    head = (
        "step", "tokens", "cacheable", "environment", "history", "pruned", "omitted", "facts",
        "not visible",
    )  # fmt: skip
    header = "<tr>" + "".join(f"<th>{h}</th>" for h in head) + "</tr>"
    return (
        f"<details><summary>{escape(candidate.name)}: step by step</summary>"
        f"<table>{header}{''.join(rows)}</table></details>"
    )


def _answers_table(report: LabReport) -> str:
    if not report.answers:
        return ""
    rows = []
    for answer in report.answers:
        score = "-" if answer.score is None else f"{answer.score:.2f}"
        cells = (answer.candidate, answer.session, score, answer.error or answer.answer or "")
        rows.append("<tr>" + "".join(f"<td>{escape(c)}</td>" for c in cells) + "</tr>")
    answers = {a.session: a.recorded or "" for a in report.answers}
    recorded = "".join(
        f'<p class="note">recorded answer of {escape(session)}: {escape(text)}</p>'
        for session, text in answers.items()
    )
    return (
        "<h2>Re-asked final question (model-dependent)</h2>"
        '<p class="note">Each candidate\'s last prompt sent to a live model; the score is word '
        "overlap with the recorded answer. Another model, or another run, may answer otherwise."
        f"</p>{recorded}<table><tr><th>candidate</th><th>session</th><th>score</th>"
        f"<th>answer</th></tr>{''.join(rows)}</table>"
    )


def render_html(report: LabReport) -> str:
    """The report as one self-contained HTML page (see the module doc)."""
    sessions = len(report.candidates[0].sessions) if report.candidates else 0
    notes = "".join(f'<p class="note">{escape(n)}</p>' for n in report.notes)
    body = "".join(_session_section(report, i) for i in range(sessions))
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        "<title>agent_flow pruning lab</title>"
        f"<style>{_STYLE}</style></head><body>"
        "<h1>Pruning lab</h1>"
        f"{_summary_table(report)}{notes}{_probe_table(report)}{_answers_table(report)}"
        f"{body}"
        "</body></html>\n"
    )
