"""Handoff: transfer the conversation to another agent, with a declared view of the history.

A `Handoff` is a `Delegate` whose child takes the conversation over instead of answering a
sub-task. For routing and triage: a router hands a billing question to the billing agent,
which sees what the router let it see of the conversation and answers in its place.

```python
billing = Handoff(
    "billing",
    "Questions about invoices, refunds and payments.",
    llm=billing_llm,
    tools=[lookup_invoice],
    history=LastUnits(2),                        # the conversation's last two units
    projection=["/knowledge/discovered_facts"],  # and this of the router's Environment
)
billing.add_to(router)                           # the router is offered ``transfer_to_billing``
```

- **The tool.** ``transfer_to_<name>`` takes the router's instruction to the target
  (``task``). The target's run starts from that instruction, after its history view.
- **What the target sees.** Its Environment is the declared projection of the router's (see
  `agent_flow.delegation.project_environment`). Its history is the view (`HistoryView`) of the
  router's conversation up to the turn that hands over, never that turn itself:
  `LastUnits` (the last N complete units), `SummaryView` (one summary of the whole
  conversation, written by a summarizer; a model's summary is admitted by the router's limits
  and counted in its usage) or `WholeConversation`.
- **The target takes over.** When the target finishes (``completed`` or ``answered``), the
  router's run ends ``completed`` with the target's answer as its final text (and its typed
  output, with an ``output_type``): the call's result carries a ``task_completion`` signal.
  A target that does not finish gives the router an error result saying why, and the router
  goes on (it may answer itself or hand over elsewhere). The handoff's record
  (`HandoffRecord`: to whom, the target's run id, its stop reason, answer and usage) is the
  call's result data, in ``outcome.tool_uses``; `handoff_of` reads it from the router's
  outcome. Result handlers do not run on it (the router's run is ending, as after
  ``task_completion``).
- **One run, one tree.** As for any delegation: the target's events reach the router's bus
  with ``path`` (and are stored with its session), the router's limits admit its model calls,
  its usage rolls up, cancelling the router cancels it, and the router's approver answers it.
- **A handoff is its turn's only call.** A turn that calls a handoff tool beside any other
  call (another handoff included) gets an error result for each of its handoff calls saying
  so, and no target runs; its other calls run as usual. The model hands over in a turn of
  its own, once it has the other results (the target would not see them otherwise).
- **Chains, bounded.** A target can itself hand over (give it a `Handoff` in ``tools``). A
  run makes at most ``max_handoffs`` handoffs, those of the agents it handed over to
  included: the one beyond gets an error result naming the chain, and the agent that called
  it stays in charge (so two agents handing the conversation back and forth stop there).
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from pydantic import ValidationError

from agent_flow._defaults import DEFAULT_MAX_HANDOFFS
from agent_flow._types import JsonObject
from agent_flow.agent._cost import _admit
from agent_flow.agent._model_call import _count_model_call
from agent_flow.agent.executor import AgentExecutor
from agent_flow.agent.outcome import ExecutionOutcome, StopReason
from agent_flow.delegation import Delegate, DelegationResult
from agent_flow.environment import Environment
from agent_flow.errors import CostLimitError, UserError
from agent_flow.history import (
    ExtractiveSummarizer,
    History,
    HistoryEntry,
    Summarizer,
    Summary,
    build_units,
)
from agent_flow.llm.metering import listen_for_model_calls
from agent_flow.tokens import ApproxCounter
from agent_flow.tools.base import ToolContext
from agent_flow.tools.results import TaskCompletion, ToolResult

if TYPE_CHECKING:
    from agent_flow.agent._loop import _Run

__all__ = [
    "Handoff",
    "HandoffRecord",
    "HistoryView",
    "LastUnits",
    "SummaryView",
    "WholeConversation",
    "handoff_of",
]

#: The history view of the handoff under way in this context (`Handoff.run` to `Handoff.child`).
_VIEW: ContextVar[tuple[HistoryEntry, ...]] = ContextVar("agent_flow_handoff_view", default=())

#: The prefix of a handoff's tool name: ``transfer_to_<name>``.
TOOL_PREFIX = "transfer_to_"


class HistoryView(Protocol):
    """Which part of the router's conversation the target of a handoff sees."""

    async def entries(self, conversation: Sequence[HistoryEntry]) -> list[HistoryEntry]:
        """The target's history, from the router's complete units (`conversation`)."""
        ...


@dataclass(frozen=True)
class LastUnits:
    """The conversation's last `n` complete units (a tool call never without its result)."""

    n: int

    def __post_init__(self) -> None:
        if self.n < 1:
            raise UserError(f"LastUnits(n={self.n}): pass 1 or more")

    async def entries(self, conversation: Sequence[HistoryEntry]) -> list[HistoryEntry]:
        """The entries of the last `n` units of `conversation`."""
        units = build_units(conversation, ApproxCounter())
        return [entry for unit in units[-self.n :] for entry in unit.entries]


@dataclass(frozen=True)
class WholeConversation:
    """The whole conversation up to the handoff."""

    async def entries(self, conversation: Sequence[HistoryEntry]) -> list[HistoryEntry]:
        """`conversation` as it is."""
        return list(conversation)


@dataclass(frozen=True)
class SummaryView:
    """One summary of the whole conversation, at most `max_tokens` tokens.

    Attributes:
        summarizer: Writes it (an `agent_flow.llm.LLMSummarizer` asks a model, whose call the
            router's limits admit and its usage counts; the default, `ExtractiveSummarizer`,
            picks sentences offline).
        max_tokens: The summary's budget.
    """

    summarizer: Summarizer | None = None
    max_tokens: int = 500

    async def entries(self, conversation: Sequence[HistoryEntry]) -> list[HistoryEntry]:
        """One `Summary` entry standing in for `conversation` (nothing for an empty one)."""
        if not conversation:
            return []
        summarizer = self.summarizer if self.summarizer is not None else ExtractiveSummarizer()
        text = await summarizer.summarize(conversation, max_tokens=self.max_tokens)
        return [Summary(content=text, replaced_ids=tuple(e.id for e in conversation))]


class HandoffRecord(DelegationResult):
    """A handoff's record: to whom, and what its target did (a `DelegationResult`).

    The inherited fields say what the target did: its run id, stop reason, answer and usage.

    Attributes:
        target: The `Handoff`'s name (its tool is ``transfer_to_<target>``).
    """

    target: str


def handoff_of(outcome: ExecutionOutcome) -> HandoffRecord | None:
    """The record of the handoff whose target ended `outcome`'s run, if one did.

    ``None`` when the run ended otherwise: it handed nothing over, or its handoffs failed and
    it went on (their records are in ``outcome.tool_uses``, each use's ``data``).
    """
    if outcome.stop_reason != StopReason.COMPLETED or not outcome.tool_uses:
        return None
    last = outcome.tool_uses[-1]
    if last.is_error or last.iteration != outcome.iterations or not isinstance(last.data, dict):
        return None
    try:
        return HandoffRecord.model_validate(last.data)
    except ValidationError:
        return None  # the last call was some other tool's


def complete_units(history: History) -> list[HistoryEntry]:
    """`history`'s entries without its last unit while that unit waits for tool results."""
    units = list(history.units())
    if units and units[-1].pending:
        units.pop()  # the turn that is handing over: its calls have no results yet
    return [entry for unit in units for entry in unit.entries]


@dataclass(eq=False)
class _Chain:
    """The handoffs made in one run and in the runs it handed over to, in order."""

    targets: list[str] = field(default_factory=list)


#: The chain a target's run belongs to (set in the handoff's call, inherited by the target).
_CHAIN: ContextVar[_Chain | None] = ContextVar("agent_flow_handoff_chain", default=None)
#: The chain of each run that handed over first (a router's handoffs run one call at a time).
_CHAINS: weakref.WeakKeyDictionary[_Run, _Chain] = weakref.WeakKeyDictionary()


class Handoff(Delegate[Any]):
    """A delegation that hands the conversation over (see the module doc).

    Args:
        name: The target's name; the tool is ``transfer_to_<name>``.
        description: When to hand over (the model reads it).
        history: What the target sees of the conversation (default: the last 4 units).
        max_handoffs: Handoffs a run may make, its targets' included; this one is refused
            beyond them.
        **delegate: `Delegate`'s arguments (``llm``, ``tools``, ``projection``,
            ``output_type``, ``budget``, ``config``, ``read_only``, ``timeout``, ...).

    Raises:
        UserError: `max_handoffs` is below 1, or a `Delegate` argument is invalid.
    """

    def __init__(
        self,
        name: str,
        description: str,
        *,
        history: HistoryView | None = None,
        max_handoffs: int = DEFAULT_MAX_HANDOFFS,
        **delegate: Any,
    ) -> None:
        if max_handoffs < 1:
            raise UserError(f"max_handoffs must be at least 1, got {max_handoffs}")
        super().__init__(TOOL_PREFIX + name, description, **delegate)
        self.target = name
        self.history_view: HistoryView = history if history is not None else LastUnits(4)
        self.max_handoffs = max_handoffs

    def child(self, environment: Environment, parent: _Run | None) -> AgentExecutor:
        """The target agent, its history the view of the router's conversation."""
        agent = super().child(environment, parent)
        agent.history.extend(_VIEW.get())
        return agent

    async def run(self, arguments: JsonObject, context: ToolContext) -> ToolResult:
        """Hand the conversation over: run the target from the view, then end the router."""
        from agent_flow.agent._loop import CURRENT_RUN

        parent = CURRENT_RUN.get()
        conversation: list[HistoryEntry] = []
        if parent is not None:
            calls = [entry.call.name for entry in parent.agent.history.pending_calls()]
            if len(calls) > 1:
                return ToolResult.error(
                    f"{self.name} must be the only call of its turn, and this turn called "
                    f"{calls}: call {self.name} alone, in a turn of its own"
                )
            conversation = complete_units(parent.agent.history)
        chain = _CHAIN.get()
        if chain is None:
            chain = _Chain() if parent is None else _CHAINS.setdefault(parent, _Chain())
        if len(chain.targets) >= self.max_handoffs:
            return ToolResult.error(
                f"the conversation was handed over {len(chain.targets)} times in this run "
                f"already ({' -> '.join(chain.targets)}), the most max_handoffs="
                f"{self.max_handoffs} allows: answer yourself instead of calling {self.name}"
            )
        try:
            view = await self._view(conversation, parent)
        except CostLimitError as err:
            return ToolResult.error(f"the history for {self.target!r} was not summarized: {err}")
        chain.targets.append(self.target)
        # Read when the target is built (`child`), in this call's task and context.
        tokens = (_VIEW.set(tuple(view)), _CHAIN.set(chain))
        try:
            result = await super().run(arguments, context)
        finally:
            _CHAIN.reset(tokens[1])
            _VIEW.reset(tokens[0])
        if not isinstance(result.data, dict):
            return result
        record = {**result.data, "target": self.target}
        if result.is_error:
            return result.model_copy(update={"data": record})
        output = result.data.get("output")
        summary = str(result.data.get("text") or result.content)
        control = TaskCompletion(summary=summary, result=output)
        return result.model_copy(update={"data": record, "control": control})

    async def _view(
        self, conversation: Sequence[HistoryEntry], parent: _Run | None
    ) -> list[HistoryEntry]:
        """The target's history; a summarizer's model calls count as the router's."""
        if parent is None:
            return await self.history_view.entries(conversation)
        with listen_for_model_calls(
            functools.partial(_count_model_call, parent), gate=functools.partial(_admit, parent)
        ):
            return await self.history_view.entries(conversation)
