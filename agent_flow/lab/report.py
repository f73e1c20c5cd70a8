"""What a lab run found: `LabReport` and its parts, as JSON and as a terminal table.

The report is plain data (frozen pydantic models): ``report.model_dump_json()`` is the JSON
``agent-flow lab --json`` prints, `render_table` the table it prints otherwise (one row per
candidate, then one row per probe), and `agent_flow.lab.html.render_html` the HTML page with
plots.

Retention counts **facts**: the environment's discovered facts, the answer of every earlier
tool call, and the probe strings the user gave. A fact is *available* at a step when the full
context (the whole history so far and the whole environment) holds it, and *visible* when the
prompt the candidate built holds it, both compared on whitespace-collapsed text. Retention is
visible / available. Each probe is also followed on its own (`ProbeResult`): at how many steps
the prompt still held it, and whether it did at the end.

Cost is what is known: a step whose model has no price adds nothing to ``cost_known_usd`` and
one to ``unpriced_steps``; ``cost_usd`` is the total only when every step was priced, and the
table shows a partial total as ``≥ $x + unknown``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, computed_field

from agent_flow._defaults import DEFAULT_ENVIRONMENT_PLACEMENT
from agent_flow._prompt_environment import EnvironmentPlacement
from agent_flow.prompt import PromptBreakdown

__all__ = [
    "CandidateResult",
    "Fact",
    "LabReport",
    "ProbeResult",
    "ReaskedAnswer",
    "SessionResult",
    "StepResult",
    "format_cost",
    "render_table",
]

FactKind = Literal["environment", "tool_result", "probe"]


class Fact(BaseModel):
    """Something the model should be able to see once it exists.

    Attributes:
        id: Unique within its session (``env:N``, ``tool:CALL_ID``, ``probe:N``).
        kind: Where it comes from.
        label: A short human name (the fact, the call, the probe).
        text: The text looked for in the prompt (whitespace-collapsed).
    """

    model_config = ConfigDict(frozen=True)

    id: str
    kind: FactKind
    label: str
    text: str


class StepResult(BaseModel):
    """One step of one session replayed under one candidate.

    Attributes:
        step: 1-based.
        tokens: What the prompt sent (``breakdown.total``; the recorded tool schemas included).
        recorded_tokens: What the recorded run's prompt at this step counted, if recorded.
        breakdown: Where its tokens went.
        pruned: Whether the history was pruned just before this step.
        summarized: Whether that pruning wrote a summary.
        dropped: Entries dropped by that pruning.
        elided: Tool results elided by it.
        folded: Entries folded into a summary by it.
        units_omitted: History units the prompt left out to fit.
        cost_usd: The step's estimated price (None: the model's price is unknown).
        cached_tokens: Tokens at the start of the prompt that repeat the previous step's
            prompt (the tool schemas and whole messages sent again unchanged): what a
            provider's prefix cache could serve (its minimum sizes aside).
        cost_cached_usd: The price with `cached_tokens` billed at the cache-read price.
        available: Ids of the facts the full context held.
        visible: Ids of the facts the prompt held.
    """

    model_config = ConfigDict(frozen=True)

    step: int
    tokens: int
    recorded_tokens: int | None
    breakdown: PromptBreakdown
    pruned: bool
    summarized: bool
    dropped: int
    elided: int
    folded: int
    units_omitted: int
    cost_usd: float | None
    available: tuple[str, ...]
    visible: tuple[str, ...]
    cached_tokens: int = 0
    cost_cached_usd: float | None = None

    @computed_field  # type: ignore[prop-decorator]  # in the JSON too
    @property
    def retention(self) -> float:
        """Visible facts over available facts (1.0 when none are available)."""
        return len(self.visible) / len(self.available) if self.available else 1.0


class SessionResult(BaseModel):
    """One session replayed under one candidate.

    Attributes:
        session: The session's id.
        title: Its title.
        source: ``history`` or ``events`` (see `agent_flow.lab.recording`).
        model: The model that priced it (None: unknown).
        steps: Each step.
        facts: Every fact that appeared in the session.
        notes: What the replay could not know exactly.
    """

    model_config = ConfigDict(frozen=True)

    session: str
    title: str
    source: str
    model: str | None
    steps: tuple[StepResult, ...]
    facts: tuple[Fact, ...]
    notes: tuple[str, ...] = ()

    @computed_field  # type: ignore[prop-decorator]  # in the JSON too
    @property
    def tokens(self) -> int:
        """Tokens sent over all steps."""
        return sum(s.tokens for s in self.steps)

    @computed_field  # type: ignore[prop-decorator]  # in the JSON too
    @property
    def cost_usd(self) -> float | None:
        """Estimated price of all steps (None when any step's price is unknown)."""
        costs = [s.cost_usd for s in self.steps]
        return None if any(c is None for c in costs) else sum(c for c in costs if c is not None)

    @computed_field  # type: ignore[prop-decorator]  # in the JSON too
    @property
    def cost_known_usd(self) -> float:
        """Estimated price of the steps whose price is known."""
        return sum(s.cost_usd for s in self.steps if s.cost_usd is not None)

    @computed_field  # type: ignore[prop-decorator]  # in the JSON too
    @property
    def unpriced_steps(self) -> int:
        """Steps whose price is unknown (their model has no price)."""
        return sum(s.cost_usd is None for s in self.steps)

    @computed_field  # type: ignore[prop-decorator]  # in the JSON too
    @property
    def final_retention(self) -> float:
        """Retention at the last step (0.0 when no step fit the budget: nothing was sent)."""
        return self.steps[-1].retention if self.steps else 0.0


class ProbeResult(BaseModel):
    """How one probe string fared under one candidate, over every session.

    Attributes:
        probe: The probe string.
        steps_available: Steps whose full context held it (the session had it by then).
        steps_visible: Of those, the steps whose prompt held it.
        sessions: Sessions whose last step's full context held it.
        visible_at_end: Of those, the sessions whose last prompt held it.
    """

    model_config = ConfigDict(frozen=True)

    probe: str
    steps_available: int
    steps_visible: int
    sessions: int
    visible_at_end: int


class CandidateResult(BaseModel):
    """Every session replayed under one candidate, and the totals.

    Attributes:
        name: The candidate's name.
        strategy: The strategy's name.
        max_tokens: Its budget.
        reserve_output_tokens: Tokens kept for the answer.
        summarizer: The summarizer it used offline, when it summarizes (``ExtractiveSummarizer``).
        sessions: Each session.
        tokens: Tokens sent over all steps of all sessions.
        steps: Steps replayed.
        max_step_tokens: The largest prompt.
        cost_usd: Estimated price of all steps (None: a price is unknown, never 0; or no step
            fit the budget).
        cost_known_usd: Estimated price of the steps whose price is known.
        unpriced_steps: Steps whose price is unknown.
        prunes: Steps before which the history was pruned.
        summaries: Prunings that wrote a summary.
        units_omitted: History units left out of prompts, summed over steps.
        retention_final: Mean over sessions of the last step's retention (a session no step
            of which fit counts 0).
        retention_mean: Mean over all steps of their retention (0.0 with no step).
        probes: Each probe of the run, in order.
        cached_tokens: Of `tokens`, those a prefix cache could serve (see `StepResult`).
        cost_cached_known_usd: The priced steps' cost with those tokens billed at the
            cache-read price.
        environment_placement: Where its prompts put the environment (``system``, ``last``).
    """

    model_config = ConfigDict(frozen=True)

    name: str
    strategy: str
    max_tokens: int
    reserve_output_tokens: int
    summarizer: str | None
    sessions: tuple[SessionResult, ...]
    tokens: int
    steps: int
    max_step_tokens: int
    cost_usd: float | None
    prunes: int
    summaries: int
    units_omitted: int
    retention_final: float
    retention_mean: float
    cost_known_usd: float = 0.0
    unpriced_steps: int = 0
    probes: tuple[ProbeResult, ...] = ()
    cached_tokens: int = 0
    cost_cached_known_usd: float = 0.0
    environment_placement: EnvironmentPlacement = DEFAULT_ENVIRONMENT_PLACEMENT


class ReaskedAnswer(BaseModel):
    """A live model's answer from a candidate's last prompt (model-dependent, see `lab.ask`).

    Attributes:
        candidate: The candidate's name.
        session: The session's id.
        step: The step re-asked (the session's last), if it was.
        answer: What the model answered (its tool calls, if it only called tools).
        recorded: The session's recorded final answer.
        score: Word-overlap F1 of `answer` against `recorded` (None: nothing to compare).
        model: The model that answered, as the server named it.
        error: Why there is no answer (a failed call, a prompt that does not fit).
    """

    model_config = ConfigDict(frozen=True)

    candidate: str
    session: str
    step: int | None = None
    answer: str | None = None
    recorded: str | None = None
    score: float | None = None
    model: str | None = None
    error: str | None = None


class LabReport(BaseModel):
    """A lab run: every candidate's results, in the order given.

    Attributes:
        candidates: One result per candidate.
        probes: The probe strings looked for.
        notes: What the whole run assumed (offline summarizer, tool schema costs, prices).
        answers: The re-asked final questions, when a model was given (model-dependent).
    """

    model_config = ConfigDict(frozen=True)

    candidates: tuple[CandidateResult, ...]
    probes: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    answers: tuple[ReaskedAnswer, ...] = ()


def _dollars(value: float) -> str:
    return f"${value:.4f}" if value >= 0.01 else f"${value:.6f}"


def format_cost(known_usd: float, unpriced_steps: int, steps: int) -> str:
    """A cost as the table shows it: what is known, and whether some of it is not.

    ``$x`` when every step was priced, ``≥ $x + unknown`` when some were not, ``unknown`` when
    none was, and ``-`` when no step was replayed (nothing was sent).
    """
    if steps == 0:
        return "-"
    if unpriced_steps == 0:
        return _dollars(known_usd)
    if unpriced_steps >= steps:
        return "unknown"
    return f"≥ {_dollars(known_usd)} + unknown"


def probe_cell(probe: ProbeResult) -> str:
    """One probe under one candidate, in a few words: steps it was visible, and at the end."""
    if probe.steps_available == 0:
        return "never present"
    seen = f"{probe.steps_visible}/{probe.steps_available} steps"
    if probe.sessions == 0:
        return seen
    if probe.visible_at_end == probe.sessions:
        return f"{seen}, kept at end"
    if probe.visible_at_end == 0:
        return f"{seen}, lost at end"
    return f"{seen}, kept at end in {probe.visible_at_end}/{probe.sessions}"


def _table(rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]


def render_table(report: LabReport) -> str:
    """The report as a fixed-width table, one row per candidate, then the notes."""
    header = (
        "CANDIDATE",
        "STRATEGY",
        "BUDGET",
        "STEPS",
        "TOKENS",
        "MAX/STEP",
        "COST",
        "PRUNES",
        "SUMMARIES",
        "OMITTED",
        "RETAINED@END",
        "RETAINED(MEAN)",
    )
    rows = [
        (
            c.name,
            c.strategy,
            f"{c.max_tokens:,}",
            str(c.steps),
            f"{c.tokens:,}",
            f"{c.max_step_tokens:,}",
            format_cost(c.cost_known_usd, c.unpriced_steps, c.steps),
            str(c.prunes),
            str(c.summaries),
            str(c.units_omitted),
            f"{c.retention_final:.0%}",
            f"{c.retention_mean:.0%}",
        )
        for c in report.candidates
    ]
    lines = _table([header, *rows])
    # Below the table, whose columns scripts may read by position.
    lines.extend(
        f"{c.name}: cacheable {c.cached_tokens / c.tokens:.0%} of the tokens sent; cost if "
        f"cached {format_cost(c.cost_cached_known_usd, c.unpriced_steps, c.steps)}"
        for c in report.candidates
        if c.tokens
    )
    if report.probes and report.candidates:
        # One row per probe: is it still in the prompt under each candidate?
        probe_rows: list[tuple[str, ...]] = [("PROBE", *(c.name for c in report.candidates))]
        for index, probe in enumerate(report.probes):
            cells = [
                probe_cell(c.probes[index]) if index < len(c.probes) else "-"
                for c in report.candidates
            ]
            probe_rows.append((f'"{probe}"', *cells))
        lines.extend(["", *_table(probe_rows), ""])
    for candidate in report.candidates:
        for session in candidate.sessions:
            last = session.steps[-1] if session.steps else None
            if last is None:
                continue
            lost = [
                f.label
                for f in session.facts
                if f.id in last.available and f.id not in last.visible
            ]
            if lost:
                shown = "; ".join(lost[:4]) + (f"; +{len(lost) - 4} more" if len(lost) > 4 else "")
                lines.append(
                    f"{candidate.name} / {session.session}: not visible at the end: {shown}"
                )
    if report.answers:
        lines.append("re-asked final question (MODEL-DEPENDENT: another model or run may differ):")
        for answer in report.answers:
            score = "-" if answer.score is None else f"{answer.score:.2f}"
            said = answer.error or " ".join((answer.answer or "").split())[:80]
            lines.append(f"  {answer.candidate} / {answer.session}: score {score}: {said}")
    session_notes = dict.fromkeys(
        f"{s.session}: {note}" for c in report.candidates for s in c.sessions for note in s.notes
    )
    lines.extend(f"note: {note}" for note in [*session_notes, *report.notes])
    return "\n".join(lines) + "\n"
