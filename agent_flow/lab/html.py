"""The lab's HTML report: one self-contained page with inline SVG plots, for offline reading.

`render_html` writes the whole page as one string: a summary table, then for each session two
line charts (tokens per step with each candidate's budget, and retention per step) drawn as
SVG here, and each candidate's step-by-step detail. No script, no stylesheet or font from a
network: the file opens the same on a machine without internet.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

from agent_flow.lab.report import CandidateResult, LabReport, SessionResult

__all__ = ["render_html"]

# Distinguishable colours (Okabe-Ito), reused in order when there are more candidates.
_COLOURS = ("#0072b2", "#d55e00", "#009e73", "#cc79a7", "#e69f00", "#56b4e9", "#000000")
_WIDTH, _HEIGHT = 540, 260
_LEFT, _RIGHT, _TOP, _BOTTOM = 64, 16, 28, 40

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
.charts{display:flex;flex-wrap:wrap;gap:1rem}
.note{color:#555;font-size:.9rem}
.legend span{display:inline-block;margin-right:1rem}
.swatch{display:inline-block;width:.8rem;height:.8rem;margin-right:.3rem;vertical-align:middle}
svg text{font-size:11px;fill:#333}
details{margin:.5rem 0}
"""


@dataclass(frozen=True, slots=True)
class _Series:
    name: str
    colour: str
    points: tuple[tuple[float, float], ...]
    limit: float | None = None  # drawn as a dashed horizontal line


def _cost(value: float | None) -> str:
    return "unknown" if value is None else f"${value:.6f}"


def _ticks(top: float, count: int = 4) -> list[float]:
    return [top * i / count for i in range(count + 1)]


def _chart(
    title: str, series: Sequence[_Series], *, x_max: int, y_max: float, percent: bool
) -> str:
    """A line chart of `series` (x: steps 1..x_max, y: 0..y_max) as an SVG element."""
    plot_w = _WIDTH - _LEFT - _RIGHT
    plot_h = _HEIGHT - _TOP - _BOTTOM
    y_max = y_max or 1.0

    def x(step: float) -> float:
        return _LEFT + (plot_w * (step - 1) / (x_max - 1) if x_max > 1 else plot_w / 2)

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
    step_every = max(1, x_max // 10)
    for step in range(1, x_max + 1, step_every):
        parts.append(
            f'<text x="{x(step):.1f}" y="{_TOP + plot_h + 16}" text-anchor="middle">{step}</text>'
        )
    parts.append(
        f'<text x="{_LEFT + plot_w / 2:.1f}" y="{_HEIGHT - 6}" text-anchor="middle">step</text>'
    )
    for index, line in enumerate(series):
        # Earlier lines are drawn wider, so that a line another one covers still shows.
        width = 2 + 2 * (len(series) - 1 - index)
        if line.limit is not None:
            parts.append(
                f'<line x1="{_LEFT}" x2="{_LEFT + plot_w}" y1="{y(line.limit):.1f}" '
                f'y2="{y(line.limit):.1f}" stroke="{line.colour}" stroke-dasharray="4 4" '
                'stroke-opacity=".6"/>'
            )
        coords = " ".join(f"{x(px):.1f},{y(py):.1f}" for px, py in line.points)
        parts.append(
            f'<polyline fill="none" stroke="{line.colour}" stroke-width="{width}" '
            f'stroke-opacity=".8" points="{coords}">'
            f"<title>{escape(line.name)}</title></polyline>"
        )
        parts.extend(
            f'<circle cx="{x(px):.1f}" cy="{y(py):.1f}" r="2.5" fill="{line.colour}">'
            f"<title>{escape(line.name)}, step {px:.0f}: "
            f"{f'{py:.0%}' if percent else f'{py:,.0f} tokens'}</title></circle>"
            for px, py in line.points
        )
    parts.append("</svg>")
    return "".join(parts)


def _summary_table(report: LabReport) -> str:
    head = (
        "candidate",
        "strategy",
        "budget",
        "steps",
        "tokens",
        "max/step",
        "cost",
        "prunes",
        "summaries",
        "units omitted",
        "retained at end",
        "retained (mean)",
    )
    rows = []
    for c in report.candidates:
        cells = (
            c.name, c.strategy, f"{c.max_tokens:,}", str(c.steps), f"{c.tokens:,}",
            f"{c.max_step_tokens:,}", _cost(c.cost_usd), str(c.prunes), str(c.summaries),
            str(c.units_omitted), f"{c.retention_final:.0%}", f"{c.retention_mean:.0%}",
        )  # fmt: skip
        rows.append("<tr>" + "".join(f"<td>{escape(cell)}</td>" for cell in cells) + "</tr>")
    header = "<tr>" + "".join(f"<th>{escape(h)}</th>" for h in head) + "</tr>"
    return f"<table>{header}{''.join(rows)}</table>"


def _legend(candidates: Sequence[CandidateResult]) -> str:
    spans = "".join(
        f'<span><i class="swatch" style="background:{_COLOURS[i % len(_COLOURS)]}"></i>'
        f"{escape(c.name)}</span>"
        for i, c in enumerate(candidates)
    )
    return f'<p class="legend">{spans}</p>'


def _session_section(report: LabReport, index: int) -> str:
    results: list[tuple[int, CandidateResult, SessionResult]] = [
        (i, c, c.sessions[index]) for i, c in enumerate(report.candidates)
    ]
    first = results[0][2]
    x_max = max((len(s.steps) for _, _, s in results), default=1) or 1
    y_max = max(
        [c.max_tokens for _, c, _ in results] + [t.tokens for _, _, s in results for t in s.steps]
    )
    tokens = [
        _Series(
            c.name,
            _COLOURS[i % len(_COLOURS)],
            tuple((t.step, t.tokens) for t in s.steps),
            limit=c.max_tokens - c.reserve_output_tokens,
        )
        for i, c, s in results
    ]
    retention = [
        _Series(c.name, _COLOURS[i % len(_COLOURS)], tuple((t.step, t.retention) for t in s.steps))
        for i, c, s in results
    ]
    notes = "".join(f'<p class="note">{escape(n)}</p>' for n in first.notes)
    details = "".join(_candidate_details(c, s) for _, c, s in results)
    return (
        f"<h2>Session {escape(first.session)}: {escape(first.title)}</h2>"
        f'<p class="note">{_SOURCES.get(first.source, first.source)}; priced as '
        f"{escape(first.model or 'unknown model')}; {len(first.facts)} facts tracked</p>{notes}"
        + _legend(report.candidates)
        + '<div class="charts">'
        + _chart("Prompt tokens per step (dashed: budget less reserve)", tokens,
                 x_max=x_max, y_max=y_max, percent=False)
        + _chart("Retention: visible / available facts", retention,
                 x_max=x_max, y_max=1.0, percent=True)
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
            f"{step.breakdown.environment:,}",
            f"{step.breakdown.history:,}",
            action or "-",
            str(step.units_omitted),
            f"{len(step.visible)}/{len(step.available)}",
            "; ".join(lost) or "-",
        )
        rows.append("<tr>" + "".join(f"<td>{escape(c)}</td>" for c in cells) + "</tr>")
    head = ("step", "tokens", "environment", "history", "pruned", "omitted", "facts", "not visible")
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
    probes = (
        "<p>Probes: " + ", ".join(f"<code>{escape(p)}</code>" for p in report.probes) + "</p>"
        if report.probes
        else ""
    )
    notes = "".join(f'<p class="note">{escape(n)}</p>' for n in report.notes)
    body = "".join(_session_section(report, i) for i in range(sessions))
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        "<title>agent_flow pruning lab</title>"
        f"<style>{_STYLE}</style></head><body>"
        "<h1>Pruning lab</h1>"
        f"{_summary_table(report)}{probes}{notes}{_answers_table(report)}{body}"
        "</body></html>\n"
    )
