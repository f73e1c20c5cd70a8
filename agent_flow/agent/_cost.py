"""What a run's model calls cost, and the cost limit (``max_cost_usd``) checked before each one.

Every model call of a run, the agent's own and the summarizer's while pruning, is admitted by
`_admit` before it is made. Its worst case is the prompt as counted with the whole output
allowance the request sends (``max_tokens``), priced as the model asked for; if what the run
has spent plus that worst case would pass the limit, the call is not made and the run stops
with stop reason ``cost_limit``. A model with no known price (neither genai-prices' data nor
the config's `pricing` prices it) cannot be held to a limit: asking it is refused with a
`ConfigError`, which ends the run with an error; without a limit it runs, its cost unknown.

When the call is done, `_price_call` prices what the server reported, as the model that
answered, and `_settle` compares that with the worst case the call was admitted with. A
server can bill more than it was asked for: a prompt counted larger than agent_flow counts
it, a pricier model answering, an answer longer than its ``max_tokens``. Such a call passes
its worst case, and it can pass the limit, by at most its own excess: the next call is checked
against what the run really spent. It is reported (a ``WarningRaised`` with source
``"cost"``; an overrun limit ends the run with a ``cost_limit`` text saying by how much),
and `_Billing` remembers it: later worst cases of calls to that model count the prompt as the
server counts it (the largest ratio seen) and price it as the priciest model that answered.
"""

from __future__ import annotations

import contextvars
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from agent_flow.agent.outcome import Finish, StopReason
from agent_flow.errors import ConfigError, CostLimitError
from agent_flow.events import WarningRaised
from agent_flow.llm.base import Usage
from agent_flow.llm.metering import ModelCallPlan, ModelCallReport
from agent_flow.pricing import Pricing, price_usage

if TYPE_CHECKING:
    from agent_flow.agent._loop import _Run


class ParentBudget(Protocol):
    """The budget of the run a child was delegated from (`agent_flow.delegation`).

    Set in `PARENT_BUDGET` while the child runs: every model call of the child is admitted by
    it before `_admit` checks the child's own limits, and counted into it once made, so the
    parent's (and its ancestors') limits cover the child and its usage rolls up.
    """

    async def admit(self, child: _Run, plan: ModelCallPlan) -> None:
        """Refuse the child's planned call (raise `CostLimitError`) if the parent cannot pay."""
        ...

    async def count(self, child: _Run, report: ModelCallReport, cost: float | None) -> None:
        """Add the child's finished call to the parent's usage and cost."""
        ...


#: The budget a delegated child's calls are also admitted by and counted into (None: a
#: top-level run).
PARENT_BUDGET: contextvars.ContextVar[ParentBudget | None] = contextvars.ContextVar(
    "agent_flow_parent_budget", default=None
)


def _model_name(client: object) -> str:
    return str(getattr(client, "model", "") or type(client).__name__)


def _base_url(client: object) -> str | None:
    url = getattr(client, "base_url", None)
    return url if isinstance(url, str) and url else None


@dataclass(slots=True)
class _Billed:
    """What servers billed for calls to one model at one URL, beyond what was asked.

    Attributes:
        prompt_ratio: The most prompt tokens billed per counted token (never below 1).
        answered_as: Models other than the one asked for that answered.
    """

    prompt_ratio: float = 1.0
    answered_as: set[str] = field(default_factory=set)


@dataclass(slots=True)
class _Billing:
    """What a run has learned about its servers' billing, per (requested model, base URL)."""

    seen: dict[tuple[str, str | None], _Billed] = field(default_factory=dict)

    def worst_usage(self, key: tuple[str, str | None], plan: ModelCallPlan) -> Usage:
        """The usage a call billed as `key`'s earlier calls were can reach: the whole allowance."""
        billed = self.seen.get(key)
        ratio = 1.0 if billed is None else billed.prompt_ratio
        return Usage(
            prompt_tokens=math.ceil(plan.prompt_tokens * ratio), completion_tokens=plan.max_tokens
        )

    def models(self, key: tuple[str, str | None]) -> list[str]:
        """The model asked for, then the others that answered for it (priced as the dearest)."""
        billed = self.seen.get(key)
        return [key[0], *sorted(billed.answered_as if billed is not None else ())]

    def learn(
        self, key: tuple[str, str | None], plan: ModelCallPlan, usage: Usage, model: str | None
    ) -> None:
        """Remember a call that was billed beyond its plan: a larger prompt, another model."""
        billed = self.seen.setdefault(key, _Billed())
        if not usage.estimated and plan.prompt_tokens > 0:
            ratio = usage.prompt_tokens / plan.prompt_tokens
            billed.prompt_ratio = max(billed.prompt_ratio, ratio)
        if model and model != key[0]:
            billed.answered_as.add(model)


def _key(run: _Run, requested: str | None, base_url: str | None) -> tuple[str, str | None]:
    """The (model, base URL) a call goes to: a summarizer's own, else the agent's."""
    return (requested or _model_name(run.agent.llm), base_url or _base_url(run.agent.llm))


def _pricing_for(run: _Run, model: str) -> Pricing | None:
    """The config's `pricing` when `model` is the agent's own (it prices only that model)."""
    return run.agent.config.pricing if model == _model_name(run.agent.llm) else None


def _price_call(run: _Run, report: ModelCallReport) -> float | None:
    """What one call cost, priced as the model that made it (``None``: unknown).

    The model that answered is the one billed (``gpt-4o-mini-2024-07-18``); a name the price
    data does not know (a proxy's alias) falls back to the model asked for. The agent's own
    calls ask for its model; a summarizer's ask for its own, on its own server, and the
    config's `pricing` (the agent model's prices) applies to them only if that is the same
    model.
    """
    requested, base_url = _key(run, report.requested_model, report.base_url)
    pricing = _pricing_for(run, requested)
    for model in dict.fromkeys([report.model, requested]):
        cost = price_usage(model, report.usage, pricing=pricing, base_url=base_url)
        if cost is not None:
            return cost
    return None


@dataclass(frozen=True, slots=True)
class _Worst:
    """A planned call's worst case: its cost, the usage and the model it is priced as."""

    cost: float
    usage: Usage
    model: str


def _estimate(run: _Run, plan: ModelCallPlan) -> _Worst | None:
    """The plan's worst case (``None``: the model asked for has no known price).

    The counted prompt (scaled by the largest ratio a server billed for this model) with the
    whole output allowance, priced as the model asked for, or as the dearest model that
    answered for it before.
    """
    key = _key(run, plan.requested_model, plan.base_url)
    usage = run.billing.worst_usage(key, plan)
    pricing = _pricing_for(run, key[0])
    worst: _Worst | None = None
    for model in run.billing.models(key):
        cost = price_usage(model, usage, pricing=pricing, base_url=key[1])
        if cost is None:
            if model == key[0]:
                return None  # the model asked for is the floor; it must be priced
            continue
        if worst is None or cost > worst.cost:
            worst = _Worst(cost, usage, model)
    return worst


async def _admit(run: _Run, plan: ModelCallPlan) -> None:
    """Let the planned call be made only if its worst case keeps the run within its limit.

    Raises:
        CostLimitError: What the run spent plus the call's worst case would pass the limit.
        ConfigError: There is a limit and the model asked for has no known price.
    """
    parent = PARENT_BUDGET.get()
    if parent is not None:
        await parent.admit(run, plan)
    limit = run.agent.config.max_cost_usd
    if limit is None:
        return
    worst = _estimate(run, plan)
    model = _key(run, plan.requested_model, plan.base_url)[0]
    if worst is None:
        fix = "set pricing (input/output dollars per million tokens) in the agent's config"
        if plan.source != "agent":
            fix = f"give the {plan.source} a model genai-prices knows, or the agent's own"
        raise ConfigError(
            f"max_cost_usd is {limit} but the model {model!r} has no known price; {fix}, or "
            "run without a cost limit"
        )
    if run.cost_usd + worst.cost > limit:
        whose = "a model call" if plan.source == "agent" else f"a model call of the {plan.source}"
        prompt = f"{plan.prompt_tokens} prompt tokens counted"
        if worst.usage.prompt_tokens > plan.prompt_tokens:
            prompt += f", {worst.usage.prompt_tokens} as its server counts them"
        priced = f"{model!r}" if worst.model == model else f"{worst.model!r}, which answered it"
        raise CostLimitError(
            f"stopped before {whose} that could cost ${worst.cost:.6f} ({prompt}, "
            f"{plan.max_tokens} allowed for the answer, priced as {priced}): with the "
            f"${run.cost_usd:.6f} spent it would pass max_cost_usd (${limit})",
            limit=limit,
            spent=run.cost_usd,
            estimate=worst.cost,
        )


async def _admit_or_stop(run: _Run, plan: ModelCallPlan) -> Finish | None:
    """`_admit` for the agent's own call: a refusal becomes the step's `Finish`."""
    try:
        await _admit(run, plan)
    except CostLimitError as err:
        # A parent's spent token limit refuses a child's call as TOKEN_LIMIT (`PARENT_BUDGET`).
        return Finish(getattr(err, "stop_reason", StopReason.COST_LIMIT), text=str(err))
    except ConfigError as err:
        await run._error(err, fatal=True)
        return Finish(StopReason.ERROR, text=str(err))
    return None


# A call is said to pass its worst case only beyond rounding.
_TOLERANCE = 1e-12


async def _settle(run: _Run, report: ModelCallReport, cost: float | None) -> None:
    """Compare a finished call's cost with the worst case it was admitted with.

    A call billed beyond it is reported, and its server's billing remembered for the worst
    cases of later calls. Runs only under a limit, for calls admitted with a plan. A delegated
    child's call is first counted into its parent (`PARENT_BUDGET`).
    """
    parent = PARENT_BUDGET.get()
    if parent is not None:
        await parent.count(run, report, cost)
    plan = report.plan
    if plan is None or run.agent.config.max_cost_usd is None:
        return
    worst = _estimate(run, plan)
    key = _key(run, plan.requested_model, plan.base_url)
    run.billing.learn(key, plan, report.usage, report.model)
    if cost is None or worst is None or cost <= worst.cost + _TOLERANCE:
        return
    how: list[str] = []
    if report.usage.prompt_tokens > plan.prompt_tokens:
        how.append(
            f"it counted {report.usage.prompt_tokens} prompt tokens where agent_flow counted "
            f"{plan.prompt_tokens}"
        )
    if report.model and report.model != key[0]:
        pricing = _pricing_for(run, key[0])
        answered = price_usage(report.model, report.usage, pricing=pricing, base_url=key[1])
        asked = price_usage(key[0], report.usage, pricing=pricing, base_url=key[1])
        if answered is not None and asked is not None and answered > asked:
            how.append(f"{report.model!r} answered for {key[0]!r}")
    if report.usage.completion_tokens > plan.max_tokens:
        how.append(
            f"it billed {report.usage.completion_tokens} completion tokens where "
            f"{plan.max_tokens} were allowed"
        )
    message = (
        f"the model server billed ${cost:.6f} for the {plan.source}'s call estimated at most "
        f"${worst.cost:.6f} ({'; '.join(how) or 'it priced the call higher'}); later calls to "
        f"{key[0]!r} are estimated as billed"
    )
    run.cost_overrun = message
    await run.emit(WarningRaised, message=message, source="cost")


def _past_limit(run: _Run) -> Finish | None:
    """The run's end once it has spent its whole limit (a server billed more than asked)."""
    limit = run.agent.config.max_cost_usd
    if limit is None or run.cost_usd < limit:
        return None
    over = run.cost_usd - limit
    text = f"the run has spent its max_cost_usd (${limit})"
    if over > 0:
        text = f"the run cost ${run.cost_usd:.6f}, ${over:.6f} past max_cost_usd (${limit})"
        if run.cost_overrun is not None:
            text += f": {run.cost_overrun}"
    return Finish(StopReason.COST_LIMIT, text=text)
