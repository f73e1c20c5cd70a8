"""What a run produces: its `StopReason`, the loop's typed steps and the `ExecutionOutcome`.

A step of the loop returns `Continue`, `RunTools` or `Finish` (the `Step` union); a run ends
with an `ExecutionOutcome` that records every `ToolUse` and `RunErrorInfo` along the way, and
each `DeferredCall` it handed to its caller (`agent_flow.agent._deferred`).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Literal, TypeAlias, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from agent_flow._types import FrozenModel, JsonValue
from agent_flow.errors import OutputValidationError
from agent_flow.llm.base import Usage
from agent_flow.messages import ToolCall

__all__ = [
    "Continue",
    "DeferredCall",
    "ExecutionOutcome",
    "Finish",
    "RunErrorInfo",
    "RunTools",
    "Step",
    "StopReason",
    "ToolUse",
]

M = TypeVar("M", bound=BaseModel)


class StopReason(StrEnum):
    """Why a run ended."""

    COMPLETED = "completed"
    """The model called ``task_completion``, or gave a valid final answer."""
    ANSWERED = "answered"
    """The model answered without calling a tool (and re-prompting was off or used up)."""
    WAITING_FOR_USER = "waiting_for_user"
    """The model called ``ask_question``; continue with `AgentExecutor.send`."""
    CONVERSE = "converse"
    """The model called ``converse`` to talk to the user."""
    MAX_ITERATIONS = "max_iterations"
    """The run made ``max_iterations`` model calls."""
    TOKEN_LIMIT = "token_limit"
    """The run used ``max_total_tokens``."""
    COST_LIMIT = "cost_limit"
    """The next model call (the agent's or the summarizer's) could have passed
    ``max_cost_usd``, so it was not made; or a server billed more than it was asked and the
    run reached the limit (see `agent_flow.config.AgentConfig.max_cost_usd`)."""
    CONTEXT_BUDGET = "context_budget"
    """The fixed parts of the prompt no longer fit the budget."""
    STUCK = "stuck"
    """The model kept repeating identical calls with identical results."""
    OUTPUT_INVALID = "output_invalid"
    """The final answer never matched the output schema."""
    CANCELLED = "cancelled"
    """The run was cancelled."""
    ERROR = "error"
    """A fatal error: bad credentials, an unreachable model, a refused request."""
    INTERRUPTED = "interrupted"
    """The process running it died (killed, crashed, lost its lease) before it ended; stored
    by whoever next claims the session, never published by the run itself."""
    DEFERRED = "deferred"
    """The run handed tool calls to its caller: calls of external tools (a front end's), or
    approvals the run was asked to defer. `ExecutionOutcome.deferred` lists them; continue
    with `AgentExecutor.send` and their `DeferredResults`."""


class DeferredCall(FrozenModel):
    """A tool call a run handed to its caller instead of executing it.

    Attributes:
        call_id: The call's id; its answer is keyed by it (`DeferredResults`).
        name: The tool the model called.
        arguments: The arguments as the model wrote them (JSON text).
        kind: ``"external"``: an `ExternalTool`'s call, for the caller to run and answer with
            its result; ``"approval"``: a call the policy holds for approval, for the caller to
            approve or deny (the agent then runs it, or tells the model it was refused).
        reason: Why approval is needed (the policy's reason; empty for external calls).
    """

    call_id: str
    name: str
    arguments: str
    kind: Literal["external", "approval"]
    reason: str = ""


# -- steps ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Continue:
    """Go on with the next iteration."""


@dataclass(frozen=True, slots=True)
class RunTools:
    """The model asked for tool calls; execute them."""

    calls: tuple[ToolCall, ...]


@dataclass(frozen=True, slots=True)
class Finish:
    """End the run."""

    reason: StopReason
    text: str = ""
    output: JsonValue = None
    #: The calls handed to the caller (`StopReason.DEFERRED` only).
    deferred: tuple[DeferredCall, ...] = ()


Step: TypeAlias = Continue | RunTools | Finish


# -- results -------------------------------------------------------------------------------


class ToolUse(FrozenModel):
    """One tool call of a run and what came of it."""

    iteration: int
    call_id: str
    name: str
    arguments: str
    content: str
    is_error: bool
    error_kind: str | None
    duration_ms: float


class RunErrorInfo(BaseModel):
    """An error that occurred during a run (the run may have survived it)."""

    model_config = ConfigDict(frozen=True)

    type: str
    message: str
    fatal: bool
    iteration: int


class ExecutionOutcome(BaseModel):
    """What a run produced, why it stopped, and what it cost.

    Attributes:
        run_id: The run's id (also on every event).
        final_text: The final answer, completion summary, question or message.
        output: The validated structured output (with an output schema), or the result
            ``task_completion`` returned.
        stop_reason: Why the run ended.
        tool_uses: Every tool call, in order, with its result.
        usage: Token usage summed over model calls (the summarizer's included).
        usage_per_call: Usage of each model call, in the order they finished (the
            summarizer's included; ``ModelResponded`` events say whose each was).
        cost_usd: What the run's model calls cost in US dollars (the summarizer's
            included), priced as `agent_flow.pricing.price_usage` prices them; ``None``
            when any call's price is unknown (never a misleading 0).
        cost_per_call: Each call's cost, in the order of `usage_per_call` (``None``:
            unknown).
        errors: Errors that occurred, fatal or survived.
        iterations: Model calls made.
        started_at: When the run began.
        duration_ms: How long it took.
        environment_version: The environment's version at the end.
        deferred: The calls handed to the caller, in call order (`StopReason.DEFERRED`).
    """

    model_config = ConfigDict(frozen=True)

    run_id: str
    final_text: str
    output: JsonValue = None
    stop_reason: StopReason
    tool_uses: tuple[ToolUse, ...] = ()
    usage: Usage = Usage()
    usage_per_call: tuple[Usage, ...] = ()
    cost_usd: float | None = None
    cost_per_call: tuple[float | None, ...] = ()
    errors: tuple[RunErrorInfo, ...] = ()
    iterations: int
    started_at: datetime
    duration_ms: float
    environment_version: int
    deferred: tuple[DeferredCall, ...] = ()

    def output_as(self, model: type[M]) -> M:
        """Return `output` validated as `model`.

        Raises:
            OutputValidationError: There is no output, or it does not fit `model`.
        """
        try:
            return model.model_validate(self.output)
        except ValidationError as err:
            raise OutputValidationError(
                f"the run's output does not fit {model.__name__}: {err}",
                last_answer=self.final_text,
                problems=str(err),
            ) from err
