"""What ties a delegated child run to its parent: the events' path and the parent's budget.

A child (`agent_flow.delegation.Delegate`) runs inside its parent's tool call, in the tool's
task. Two things connect it to the parent run there:

- `ChildEvents`, the child's event bus: every event the child publishes goes on to the
  parent run (`_Run.forward`) with the parent's run id prepended to its ``path`` and the
  parent's next ``seq``, so the parent's subscribers see the whole tree, numbered in one
  sequence, and the parent's recorder stores it in the parent's session (a grandchild's events
  pass through its parent's `ChildEvents` too and arrive with the full path, outermost run
  first, numbered by the top-level run);
- `ParentMeter`, set as `agent_flow.agent._cost.PARENT_BUDGET` while the child runs: each
  model call of the child is admitted by the parent's limits before the child's own (the
  parent's ``max_total_tokens`` is spent: refused as ``token_limit``; its ``max_cost_usd``
  could be passed by what it spent, what its running children's calls may still cost, and this
  call's worst case: refused as ``cost_limit``), and counted into the parent's usage and cost
  once made. A meter forwards both to the grandparent's meter, if any, so every ancestor's
  limits cover its whole subtree. Siblings running in parallel share one meter: their calls'
  worst cases are held until counted, so together they cannot pass the parent's cost limit.
  A durable run recovered after a crash replays a finished child's recorded result instead of
  running it; `ParentMeter.recount` adds that child's recorded calls as `count` did.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable
from typing import TYPE_CHECKING

from agent_flow.agent._cost import PARENT_BUDGET, ParentBudget, _estimate
from agent_flow.agent.outcome import StopReason
from agent_flow.errors import ConfigError, CostLimitError
from agent_flow.events import AgentEvent, EventBus

if TYPE_CHECKING:
    from agent_flow.agent._loop import _Run
    from agent_flow.llm.base import Usage
    from agent_flow.llm.metering import ModelCallPlan, ModelCallReport

__all__ = ["ChildEvents", "ParentMeter", "meter_for"]


class ChildEvents(EventBus):
    """A child run's bus: its events go to the parent run, under the parent's run id.

    Args:
        run: The parent run, which numbers, records and publishes the child's events
            (`_Run.forward`), its run id first in each event's ``path``.
    """

    def __init__(self, run: _Run) -> None:
        super().__init__()
        self._run = run
        self._prefix = (run.run_id,)

    async def publish(self, event: AgentEvent) -> None:
        """Hand `event` to the parent run with the parent run first in its path."""
        if self._subscriptions or self._hooks:  # someone subscribed to the child itself
            await super().publish(event)
        await self._run.forward(event, self._prefix + event.path)


class _ParentTokensSpent(CostLimitError):
    """The parent run has used its ``max_total_tokens``: its child may call no model."""

    stop_reason = StopReason.TOKEN_LIMIT


class ParentMeter:
    """The parent run's limits and totals, as its children's model calls see them.

    Args:
        parent: The parent run.
        outer: The meter of the parent's own parent, if the parent is a child too.
    """

    def __init__(self, parent: _Run, outer: ParentBudget | None) -> None:
        self.parent = parent
        self.outer = outer
        # The worst case of each child's call in flight, held against the cost limit.
        self._held: dict[_Run, float] = {}

    @property
    def held(self) -> float:
        """What the children's calls in flight may still cost, at most."""
        return sum(self._held.values())

    async def admit(self, child: _Run, plan: ModelCallPlan) -> None:
        """Refuse the child's call if the parent's limits cannot cover it; else hold its cost.

        Raises:
            CostLimitError: The parent's token limit is spent (stop reason ``token_limit``),
                or the call could pass its cost limit.
            ConfigError: The parent has a cost limit and the child's model has no known price.
        """
        self._held.pop(child, None)  # a previous call of this child that failed, uncounted
        parent = self.parent
        config = parent.agent.config
        tokens = config.max_total_tokens
        if tokens is not None and parent.usage.total_tokens >= tokens:
            raise _ParentTokensSpent(
                f"the parent run {parent.run_id} has used {parent.usage.total_tokens} tokens "
                f"of its max_total_tokens ({tokens}), which covers its delegated children",
                limit=float(tokens),
                spent=float(parent.usage.total_tokens),
                estimate=0.0,
            )
        limit = config.max_cost_usd
        worst = None
        if limit is not None:
            worst = _estimate(child, plan)
            if worst is None:
                raise ConfigError(
                    f"the parent run's max_cost_usd is {limit}, which covers its children, but "
                    f"the child's model {plan.requested_model or _child_model(child)!r} has no "
                    "known price; set pricing in the child's config, or run without a limit"
                )
            held = self.held
            if parent.cost_usd + held + worst.cost > limit:
                raise CostLimitError(
                    f"stopped before a delegated child's model call that could cost "
                    f"${worst.cost:.6f}: with the ${parent.cost_usd:.6f} the parent run spent "
                    f"and ${held:.6f} its other children's calls may cost, it would pass the "
                    f"parent's max_cost_usd (${limit})",
                    limit=limit,
                    spent=parent.cost_usd,
                    estimate=worst.cost,
                )
        if self.outer is not None:
            await self.outer.admit(child, plan)
        if worst is not None:
            self._held[child] = worst.cost

    async def count(self, child: _Run, report: ModelCallReport, cost: float | None) -> None:
        """Add the child's finished call to the parent's usage and cost (and its ancestors')."""
        self._held.pop(child, None)
        self._add(report.usage, cost)
        if self.outer is not None:
            await self.outer.count(child, report, cost)

    def recount(self, calls: Iterable[tuple[Usage, float | None]]) -> None:
        """Add calls a child made before a crash (replayed, not made again) as `count` did.

        A durable run recovered after its delegation's result was recorded replays that
        result instead of running the child: the child's calls, in the order it made them,
        go into the parent's totals (and its ancestors') exactly as they did in the process
        that crashed, so its outcome and its limits are the same.
        """
        calls = tuple(calls)
        for usage, cost in calls:
            self._add(usage, cost)
        if isinstance(self.outer, ParentMeter):
            self.outer.recount(calls)

    def _add(self, usage: Usage, cost: float | None) -> None:
        parent = self.parent
        parent.usage = parent.usage + usage
        parent.usage_per_call.append(usage)
        parent.cost_per_call.append(cost)
        if cost is not None:
            parent.cost_usd += cost

    def release(self, child: _Run) -> None:
        """Stop holding anything for `child` (it ended), here and in the ancestors' meters."""
        self._held.pop(child, None)
        if isinstance(self.outer, ParentMeter):
            self.outer.release(child)


def _child_model(child: _Run) -> str:
    return str(getattr(child.agent.llm, "model", "") or type(child.agent.llm).__name__)


# One meter per parent run, shared by its children (their held costs add up).
_METERS: weakref.WeakKeyDictionary[_Run, ParentMeter] = weakref.WeakKeyDictionary()


def meter_for(parent: _Run) -> ParentMeter:
    """The meter of `parent`'s children (made on the first delegation of the run)."""
    meter = _METERS.get(parent)
    if meter is None:
        meter = _METERS[parent] = ParentMeter(parent, PARENT_BUDGET.get())
    return meter
