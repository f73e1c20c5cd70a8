"""The replay: every recorded step's prompt rebuilt under every candidate, offline.

For each candidate and session, a fresh `History` (counted with the candidate's counter) grows
entry by entry exactly as the run grew it. Before each step after the first the candidate's
`ContextManager.prune_if_needed` runs (where the agent loop runs it: after a step's tool
results), then `ContextManager.build_prompt` builds the step's prompt from the environment as
it was at that step. Nothing is imitated: the prompt is the one agent_flow would have sent.

Two things are not in a session and are stood in for: the tool schemas (their recorded token
cost is kept free, like a larger output reserve, and added to each prompt's count) and, for a
summarizing strategy, the model that wrote summaries (the `ExtractiveSummarizer` writes them:
summaries an LLM writes keep other things). The report's notes say both.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Sequence

from agent_flow._defaults import default_reserve_output_tokens
from agent_flow.config import Pricing
from agent_flow.context import ContextManager
from agent_flow.environment import Environment
from agent_flow.errors import ContextBudgetError
from agent_flow.history import (
    AgentMessage,
    History,
    HistoryEntry,
    PruneReport,
    Summary,
    ToolCallEntry,
    ToolResultEntry,
    UserMessage,
)
from agent_flow.lab.candidates import Candidate, check_names
from agent_flow.lab.recording import RecordedSession, RecordedStep
from agent_flow.lab.report import (
    CandidateResult,
    Fact,
    LabReport,
    ProbeResult,
    ReaskedAnswer,
    SessionResult,
    StepResult,
)
from agent_flow.llm.base import LLMClient, Usage
from agent_flow.messages import ChatMessage
from agent_flow.pricing import price_usage
from agent_flow.prompt import Prompt
from agent_flow.tokens import TokenCounter

__all__ = ["replay_session", "run_lab"]

# Large enough that the environment renders whole (the reference the prompt is checked against).
_WHOLE = 1 << 40
_LABEL_CHARS = 60


def _flat(text: str) -> str:
    return " ".join(text.split())


def _short(text: str, limit: int = _LABEL_CHARS) -> str:
    flat = _flat(text)
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def _entry_text(entry: HistoryEntry) -> str:
    if isinstance(entry, ToolCallEntry):
        return f"{entry.call.name} {entry.call.arguments}"
    if isinstance(entry, UserMessage | AgentMessage | ToolResultEntry | Summary):
        return entry.content
    return ""  # thinking is never sent


class _Facts:
    """The facts of one session, registered as they appear, and which a prompt holds.

    A tool answer is available from the step after its result; an environment fact while the
    step's environment holds it; a probe once the history so far or the step's whole
    environment holds it. Visible: the prompt holds the text. A tool answer is looked for
    among the prompt's tool messages (whole) and in the rest of its text (the environment, a
    summary); facts and probes in all of it.
    """

    def __init__(self, probes: Sequence[str]) -> None:
        self.facts: dict[str, Fact] = {}
        # The fact as a JSON string shows it (the environment renders as JSON).
        self.escaped: dict[str, str] = {}
        self.environment_ids: dict[str, str] = {}  # by the fact's text
        self.tools: set[str] = set()
        self.probes = [f"probe:{n}" for n in range(1, len(probes) + 1)]
        self.probes_in_history: set[str] = set()
        self.calls: dict[str, ToolCallEntry] = {}
        for id, probe in zip(self.probes, probes, strict=True):
            self._add(id, "probe", probe, probe)

    def _add(self, id: str, kind: str, label: str, text: str) -> None:
        flat = _flat(text)
        if flat and id not in self.facts:
            self.facts[id] = Fact.model_validate(
                {"id": id, "kind": kind, "label": _short(label), "text": flat}
            )
            self.escaped[id] = _flat(json.dumps(text, ensure_ascii=False)[1:-1])

    def see_entries(self, entries: Sequence[HistoryEntry]) -> None:
        """Register what the entries newly added to the history bring."""
        for entry in entries:
            if isinstance(entry, ToolCallEntry):
                self.calls[entry.call_id] = entry
            elif isinstance(entry, ToolResultEntry):
                call = self.calls.get(entry.call_id)
                arguments = _short(call.call.arguments, 40) if call is not None else ""
                id = f"tool:{len(self.tools) + 1}"
                self._add(id, "tool_result", f"{entry.tool_name}({arguments})", entry.content)
                if id in self.facts:
                    self.tools.add(id)
            text = _flat(_entry_text(entry))
            self.probes_in_history.update(
                i for i in self.probes if i in self.facts and self._in(i, text)
            )

    def check(
        self,
        environment: Environment | None,
        counter: TokenCounter,
        messages: Sequence[ChatMessage],
    ) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """The ids of the facts available at this step, and of those the prompt holds."""
        present = set(self.tools) | self.probes_in_history
        if environment is not None:
            for fact in environment.knowledge.discovered_facts:
                flat = _flat(fact)
                if flat and flat not in self.environment_ids:
                    self.environment_ids[flat] = f"env:{len(self.environment_ids) + 1}"
                    self._add(self.environment_ids[flat], "environment", fact, fact)
                if flat:
                    present.add(self.environment_ids[flat])
        pending = [i for i in self.probes if i in self.facts and i not in present]
        if pending:
            whole = _flat((environment or Environment()).render(_WHOLE, counter))
            present.update(i for i in pending if self._in(i, whole))
        available = tuple(i for i in self.facts if i in present)
        answers = {_flat(m.content) for m in messages if m.role == "tool"}
        rest = _flat(
            "\n".join(
                part
                for m in messages
                for part in (
                    "" if m.role == "tool" else m.content,
                    *(f"{c.name} {c.arguments}" for c in m.tool_calls),
                )
            )
        )
        everything = _flat("\n".join([rest, *answers]))
        visible = tuple(
            i
            for i in available
            if (
                (self.facts[i].text in answers or self._in(i, rest))
                if i in self.tools
                else self._in(i, everything)
            )
        )
        return available, visible

    def _in(self, id: str, text: str) -> bool:
        return self.facts[id].text in text or self.escaped[id] in text


@functools.lru_cache(maxsize=4096)
def _price(
    model: str | None,
    base_url: str | None,
    prompt: int,
    completion: int,
    pricing: Pricing | None,
    cached: int | None = None,
) -> float | None:
    usage = Usage(prompt_tokens=prompt, completion_tokens=completion, cached_tokens=cached)
    return price_usage(model, usage, pricing=pricing, base_url=base_url)


def _repeated_tokens(
    previous: Sequence[ChatMessage] | None,
    messages: Sequence[ChatMessage],
    counter: TokenCounter,
    tool_tokens: int,
) -> int:
    """Tokens at the start of `messages` that repeat `previous`: what a prefix cache serves.

    The tool schemas (the recorded ones, the same every step) and each whole message sent
    again unchanged, in order, from the first; a message that differs ends it (whatever of it
    matches is not counted). Nothing before the first step.
    """
    if previous is None:
        return 0
    repeated = tool_tokens
    for before, now in zip(previous, messages, strict=False):
        if before != now:
            break
        repeated += counter.count_message(now)
    return repeated


def _count(report: PruneReport | None) -> tuple[bool, bool, int, int, int]:
    if report is None or not report.changed:
        return False, False, 0, 0, 0
    return (
        True,
        report.summary_id is not None or bool(report.summarized),
        len(report.dropped),
        len(report.elided),
        len(report.summarized),
    )


async def replay_session(
    session: RecordedSession,
    candidate: Candidate,
    *,
    probes: Sequence[str] = (),
    model: str | None = None,
    pricing: Pricing | None = None,
    on_prompt: Callable[[RecordedStep, Prompt], None] | None = None,
) -> SessionResult:
    """Replay one session under one candidate (see the module doc).

    Args:
        session: The session.
        candidate: The budget and strategy.
        probes: Strings to look for in each prompt.
        model: Price with this model instead of the session's.
        pricing: Prices that override genai-prices' data.
        on_prompt: Called with each step and the prompt built for it.

    Returns:
        Each step's tokens, pruning, cost and retention. A step whose fixed costs alone do not
        fit the budget ends the replay of the session there, with a note.
    """
    counter = candidate.make_counter()
    reserve = (
        candidate.reserve_output_tokens
        if candidate.reserve_output_tokens is not None
        else default_reserve_output_tokens(candidate.max_tokens)
    )
    history = History(counter=counter)
    facts = _Facts(probes)
    priced_model = model or session.model
    steps: list[StepResult] = []
    notes = list(session.notes)
    added = 0
    previous: Sequence[ChatMessage] | None = None
    fits = reserve + session.tool_tokens < candidate.max_tokens
    if not fits:
        notes.append(
            f"no step fits {candidate.name!r}: its reserve ({reserve}) and the recorded tool "
            f"schemas ({session.tool_tokens} tokens) take all of max_tokens "
            f"{candidate.max_tokens}; raise it"
        )
    for step in session.steps if fits else ():
        new = session.entries[added : step.history_length]
        history.extend(new)
        facts.see_entries(new)
        added = step.history_length
        environment = step.environment if step.environment is not None else Environment()
        try:
            context = ContextManager(
                environment,
                history,
                candidate.max_tokens,
                environment_allocation=candidate.environment_allocation,
                system_prompt_template=candidate.system_prompt_template,
                reserve_output_tokens=reserve + session.tool_tokens,
                strategy=candidate.strategy,
                prune_target=candidate.prune_target,
                environment_placement=candidate.environment_placement,
            )
            report = await context.prune_if_needed() if step.index > 1 else None
            prompt = context.build_prompt()
        except ContextBudgetError as err:
            notes.append(f"step {step.index} does not fit {candidate.name!r}: {err}")
            break
        if on_prompt is not None:
            on_prompt(step, prompt)
        pruned, summarized, dropped, elided, folded = _count(report)
        breakdown = prompt.breakdown.model_copy(
            update={
                "reserve": reserve,
                "tools": session.tool_tokens,
                "total": prompt.total_tokens + session.tool_tokens,
            }
        )
        available, visible = facts.check(step.environment, counter, prompt.messages)
        cached = _repeated_tokens(previous, prompt.messages, counter, session.tool_tokens)
        previous = prompt.messages
        steps.append(
            StepResult(
                step=step.index,
                tokens=breakdown.total,
                recorded_tokens=step.recorded_tokens,
                breakdown=breakdown,
                pruned=pruned,
                summarized=summarized,
                dropped=dropped,
                elided=elided,
                folded=folded,
                units_omitted=breakdown.history_units_omitted,
                cost_usd=_price(
                    priced_model,
                    session.base_url,
                    breakdown.total,
                    step.completion_tokens,
                    pricing,
                ),
                cached_tokens=cached,
                cost_cached_usd=_price(
                    priced_model,
                    session.base_url,
                    breakdown.total,
                    step.completion_tokens,
                    pricing,
                    cached,
                ),
                available=available,
                visible=visible,
            )
        )
    return SessionResult(
        session=session.id,
        title=session.title,
        source=session.source,
        model=priced_model,
        steps=tuple(steps),
        facts=tuple(facts.facts.values()),
        notes=tuple(notes),
    )


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def _probe_result(number: int, probe: str, sessions: Sequence[SessionResult]) -> ProbeResult:
    """How the probe numbered `number` (1-based, as `_Facts` names it) fared in `sessions`."""
    id = f"probe:{number}"
    steps = [s for session in sessions for s in session.steps]
    lasts = [session.steps[-1] for session in sessions if session.steps]
    return ProbeResult(
        probe=probe,
        steps_available=sum(id in s.available for s in steps),
        steps_visible=sum(id in s.visible for s in steps),
        sessions=sum(id in last.available for last in lasts),
        visible_at_end=sum(id in last.visible for last in lasts),
    )


def _candidate_result(
    candidate: Candidate, sessions: Sequence[SessionResult], probes: Sequence[str] = ()
) -> CandidateResult:
    steps = [s for session in sessions for s in session.steps]
    costs = [session.cost_usd for session in sessions]
    return CandidateResult(
        name=candidate.name,
        strategy=candidate.strategy.name,
        max_tokens=candidate.max_tokens,
        reserve_output_tokens=(
            candidate.reserve_output_tokens
            if candidate.reserve_output_tokens is not None
            else default_reserve_output_tokens(candidate.max_tokens)
        ),
        summarizer=candidate.summarizer,
        sessions=tuple(sessions),
        tokens=sum(s.tokens for s in steps),
        steps=len(steps),
        max_step_tokens=max((s.tokens for s in steps), default=0),
        cost_usd=(
            None
            if not steps or any(c is None for c in costs)
            else sum(c for c in costs if c is not None)
        ),
        prunes=sum(s.pruned for s in steps),
        cached_tokens=sum(s.cached_tokens for s in steps),
        environment_placement=candidate.environment_placement,
        cost_cached_known_usd=sum(
            s.cost_cached_usd for s in steps if s.cost_cached_usd is not None
        ),
        summaries=sum(s.summarized for s in steps),
        units_omitted=sum(s.units_omitted for s in steps),
        retention_final=_mean([s.final_retention for s in sessions]),
        retention_mean=_mean([s.retention for s in steps]),
        cost_known_usd=sum(session.cost_known_usd for session in sessions),
        unpriced_steps=sum(session.unpriced_steps for session in sessions),
        probes=tuple(
            _probe_result(number, probe, sessions) for number, probe in enumerate(probes, 1)
        ),
    )


async def run_lab(
    sessions: Sequence[RecordedSession],
    candidates: Sequence[Candidate],
    *,
    probes: Sequence[str] = (),
    model: str | None = None,
    pricing: Pricing | None = None,
    llm: LLMClient | None = None,
) -> LabReport:
    """Replay every session under every candidate and report (see `agent_flow.lab`).

    Args:
        sessions: Recorded sessions (`load_session`, `load_export`, `RecordedSession`).
        candidates: Budgets and strategies, with distinct names.
        probes: Strings to look for in each prompt (retention of what matters to you).
        model: Price with this model instead of each session's own.
        pricing: Prices that override genai-prices' data (a model it does not know).
        llm: A live model to re-ask each session's final question from each candidate's
            last prompt (`agent_flow.lab.ask`; model-dependent, and it costs model calls).

    Raises:
        UserError: No candidates, two with the same name, or no sessions.
    """
    from agent_flow.errors import UserError

    check_names(candidates)
    if not sessions:
        raise UserError("the lab needs at least one recorded session to replay")
    results = []
    for candidate in candidates:
        replayed = [
            await replay_session(s, candidate, probes=probes, model=model, pricing=pricing)
            for s in sessions
        ]
        results.append(_candidate_result(candidate, replayed, probes))
    notes = [
        "tokens are counted as agent_flow sends them; the tool schemas are not stored, so "
        "their recorded cost is added to each prompt (and kept free in its budget)",
        "cost: the candidate's prompt tokens plus the completion tokens each step recorded, "
        "priced from genai-prices' data (or --pricing); unknown means the model has no price, "
        "and '≥ $x + unknown' that some sessions' model has none ($x is the priced part)",
        "cacheable: the share of the tokens sent that repeat the start of the step before (the "
        "tool schemas and whole messages sent again unchanged), which a provider's prefix "
        "cache could serve; 'cost if cached' bills them at the cache-read price (a provider's "
        "minimum cacheable size aside). With the environment in the system message, a step "
        'that changed it repeats only the tool schemas; environment_placement = "last" keeps '
        "the history before the newest step",
    ]
    if any(c.summarizes for c in candidates):
        names = sorted({c.summarizer or "" for c in candidates if c.summarizes})
        notes.append(
            f"summaries were written offline by {', '.join(names)} (extracts of the entries), "
            "not by a model: a model's summaries keep other things"
        )
    answers: list[ReaskedAnswer] = []
    if llm is not None:
        from agent_flow.lab.ask import reask  # it replays with this module

        answers = [await reask(s, c, llm) for c in candidates for s in sessions]
        notes.append(
            "the re-asked answers depend on the model (and on sampling): their scores are word "
            "overlap with the recorded final answer, a hint, not a measure of the strategy"
        )
    return LabReport(
        candidates=tuple(results), probes=tuple(probes), notes=tuple(notes), answers=tuple(answers)
    )
