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
  conversation, written by a summarizer) or `WholeConversation`.
- **The target takes over.** When the target finishes (``completed`` or ``answered``), the
  router's run ends ``completed`` with the target's answer as its final text (and its typed
  output, with an ``output_type``): the call's result carries a ``task_completion`` signal.
  A target that does not finish gives the router an error result saying why, and the router
  goes on (it may answer itself or hand over elsewhere). The handoff's record (to whom, the
  target's run id, its stop reason and usage) is the result's `DelegationResult` data, in the
  router's ``tool_call_completed`` event and ``outcome.tool_uses``; result handlers do not run
  on it (the router's run is ending, as after ``task_completion``).
- **One run, one tree.** As for any delegation: the target's events reach the router's bus
  with ``path`` (and are stored with its session), the router's limits admit its model calls,
  its usage rolls up, cancelling the router cancels it, and the router's approver answers it.
- **One handoff per turn.** A model that calls two handoff tools in one turn is told, in each
  call's result, that a turn may hand over once; neither target runs.
- **Chains.** A target can itself hand over (give it a `Handoff` in ``tools``); each
  handoff is a level of delegation, bounded by its own limits (``max_iterations`` ...).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from agent_flow._types import JsonObject
from agent_flow.agent.executor import AgentExecutor
from agent_flow.delegation import Delegate
from agent_flow.environment import Environment
from agent_flow.errors import UserError
from agent_flow.history import (
    ExtractiveSummarizer,
    History,
    HistoryEntry,
    Summarizer,
    Summary,
    build_units,
)
from agent_flow.tokens import ApproxCounter
from agent_flow.tools.base import ToolContext
from agent_flow.tools.results import TaskCompletion, ToolResult

if TYPE_CHECKING:
    from agent_flow.agent._loop import _Run

__all__ = ["Handoff", "HistoryView", "LastUnits", "SummaryView", "WholeConversation"]

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
        summarizer: Writes it (an `agent_flow.llm.LLMSummarizer` asks a model; the default,
            `ExtractiveSummarizer`, picks sentences offline, counting with the router's
            counter in a `Handoff`).
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


def complete_units(history: History) -> list[HistoryEntry]:
    """`history`'s entries without its last unit while that unit waits for tool results."""
    units = list(history.units())
    if units and units[-1].pending:
        units.pop()  # the turn that is handing over: its calls have no results yet
    return [entry for unit in units for entry in unit.entries]


class Handoff(Delegate[Any]):
    """A delegation that hands the conversation over (see the module doc).

    Args:
        name: The target's name; the tool is ``transfer_to_<name>``.
        description: When to hand over (the model reads it).
        history: What the target sees of the conversation (default: the last 4 units).
        **delegate: `Delegate`'s arguments (``llm``, ``tools``, ``projection``,
            ``output_type``, ``budget``, ``config``, ``read_only``, ``timeout``, ...).
    """

    def __init__(
        self,
        name: str,
        description: str,
        *,
        history: HistoryView | None = None,
        **delegate: Any,
    ) -> None:
        super().__init__(TOOL_PREFIX + name, description, **delegate)
        self.target = name
        self.history_view: HistoryView = history if history is not None else LastUnits(4)

    def child(self, environment: Environment, parent: _Run | None) -> AgentExecutor:
        """The target agent, its history the view of the router's conversation."""
        agent = super().child(environment, parent)
        agent.history.extend(_VIEW.get())
        return agent

    async def run(self, arguments: JsonObject, context: ToolContext) -> ToolResult:
        """Hand the conversation over: run the target from the view, then end the router."""
        from agent_flow.agent._loop import CURRENT_RUN

        parent = CURRENT_RUN.get()
        if parent is not None:
            pending = {entry.call.name for entry in parent.agent.history.pending_calls()}
            handoffs = [name for name in pending if name.startswith(TOOL_PREFIX)]
            if len(handoffs) > 1:
                return ToolResult.error(
                    f"a turn may hand the conversation over once, and this one called "
                    f"{sorted(handoffs)}: call one of them alone"
                )
            conversation = complete_units(parent.agent.history)
        else:
            conversation = []
        history_view = self.history_view
        if (
            parent is not None
            and isinstance(history_view, SummaryView)
            and history_view.summarizer is None
        ):
            # The default summary counts with the router's counter: no other tokenizer.
            summarizer = ExtractiveSummarizer(counter=parent.agent.context.counter)
            history_view = dataclasses.replace(history_view, summarizer=summarizer)
        # A view that asks a model (`SummaryView` with an `LLMSummarizer`) does it for the
        # router's run: its calls are counted, and held to its cost limit, as the run's own.
        with parent.metered() if parent is not None else contextlib.nullcontext():
            view = tuple(await history_view.entries(conversation))
        # Read when the target is built (`child`), in this call's task and context.
        token = _VIEW.set(view)
        try:
            result = await super().run(arguments, context)
        finally:
            _VIEW.reset(token)
        if result.is_error or not isinstance(result.data, dict):
            return result
        output = result.data.get("output")
        summary = str(result.data.get("text") or result.content)
        return result.model_copy(update={"control": TaskCompletion(summary=summary, result=output)})
