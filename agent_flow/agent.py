"""The agent loop: `AgentExecutor`, its stop conditions and its `ExecutionOutcome`.

One iteration is a `_model_step` (build the prompt, call the model, record its turn) that
returns a typed step — `RunTools`, `Continue` or `Finish` — and, for `RunTools`, a
`_tool_step` (execute, apply handlers, record results) that returns `Continue` or `Finish`.
Every step publishes typed events on the executor's `EventBus`; nothing in a tool, a
handler or a subscriber can end the loop except through a `Finish` with a `StopReason`.
"""

from __future__ import annotations

import asyncio
import fnmatch
import json
import textwrap
import time
import uuid
import warnings
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import TypeAlias, TypeVar

import jsonschema
from pydantic import BaseModel, ConfigDict, ValidationError

from agent_flow._types import JsonObject, JsonValue
from agent_flow.config import AgentConfig, Skill
from agent_flow.context import DEFAULT_SYSTEM_PROMPT_TEMPLATE, ContextManager
from agent_flow.environment import Environment, TaskStatus
from agent_flow.errors import (
    AgentFlowError,
    ConfigError,
    ContextBudgetError,
    ModelError,
    ModelResponseError,
    OutputValidationError,
    RunError,
    UserError,
)
from agent_flow.events import (
    AgentEvent,
    ApprovalRequired,
    ApprovalResolved,
    BackpressurePolicy,
    ContextBuilt,
    EnvironmentUpdated,
    EventBus,
    ExecutionError,
    HistoryPruned,
    IterationStarted,
    ModelResponded,
    PlanUpdated,
    RunFinished,
    RunStarted,
    Subscription,
    TextDelta,
    ThinkingDelta,
    ToolCallArgumentsDelta,
    ToolCallCompleted,
    ToolCallFailed,
    ToolCallStarted,
    WarningRaised,
)
from agent_flow.history import AgentMessage, AgentThinking, History, ToolCall, UserMessage
from agent_flow.history import ToolResult as ToolResultEntry
from agent_flow.llm.base import (
    Completion,
    LLMClient,
    LLMRequest,
    StreamEvent,
    StreamWarning,
    TextChunk,
    ThinkingChunk,
    ToolCallArgumentsChunk,
    ToolCallChunk,
    ToolCallPart,
    Usage,
)
from agent_flow.messages import ToolCallRequest, ToolDefinition
from agent_flow.pruning import (
    Chain,
    DropOldest,
    ElideToolResults,
    PruningStrategy,
    SlidingWindow,
    SummarizeOldest,
)
from agent_flow.store import SessionStatus, SessionStore
from agent_flow.tokens import (
    ApproxCounter,
    TiktokenCounter,
    TokenCounter,
    TokenizerFallbackWarning,
)
from agent_flow.tools import (
    CONTROL_TOOL_NAMES,
    ApprovalCallback,
    ApprovalRequest,
    ApprovalResponse,
    ControlSignal,
    ConverseMessage,
    PlanUpdate,
    PolicyEngine,
    TaskCompletion,
    ToolExecutor,
    ToolHooks,
    ToolOutcome,
    ToolResult,
    UserQuestion,
    Workspace,
    control_tools,
    update_plan,
    workspace_tools,
)

__all__ = [
    "AgentExecutor",
    "Continue",
    "ExecutionOutcome",
    "Finish",
    "RunTools",
    "StopReason",
    "ToolUse",
    "tool_executor_from_config",
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
    """The run cost ``max_cost_usd``."""
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


# -- steps ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Continue:
    """Go on with the next iteration."""


@dataclass(frozen=True, slots=True)
class RunTools:
    """The model asked for tool calls; execute them."""

    calls: tuple[ToolCallPart, ...]


@dataclass(frozen=True, slots=True)
class Finish:
    """End the run."""

    reason: StopReason
    text: str = ""
    output: JsonValue = None


Step: TypeAlias = Continue | RunTools | Finish


# -- results -------------------------------------------------------------------------------


class ToolUse(BaseModel):
    """One tool call of a run and what came of it."""

    model_config = ConfigDict(frozen=True)

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
        usage: Token usage summed over model calls.
        usage_per_call: Usage of each model call.
        errors: Errors that occurred, fatal or survived.
        iterations: Model calls made.
        started_at: When the run began.
        duration_ms: How long it took.
        environment_version: The environment's version at the end.
    """

    model_config = ConfigDict(frozen=True)

    run_id: str
    final_text: str
    output: JsonValue = None
    stop_reason: StopReason
    tool_uses: tuple[ToolUse, ...] = ()
    usage: Usage = Usage()
    usage_per_call: tuple[Usage, ...] = ()
    errors: tuple[RunErrorInfo, ...] = ()
    iterations: int
    started_at: datetime
    duration_ms: float
    environment_version: int

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


# -- the executor --------------------------------------------------------------------------


@dataclass
class _Run:
    run_id: str
    iteration: int = 0
    seq: int = 0
    started: float = field(default_factory=time.perf_counter)
    started_at: datetime = field(default_factory=lambda: datetime.now(UTC))
    usage: Usage = field(default_factory=Usage)
    usage_per_call: list[Usage] = field(default_factory=list)
    tool_uses: list[ToolUse] = field(default_factory=list)
    errors: list[RunErrorInfo] = field(default_factory=list)
    pending_events: list[AgentEvent] = field(default_factory=list)
    reprompts: int = 0
    output_retries: int = 0
    last_signature: tuple[tuple[str, str, str], ...] | None = None
    repeats: int = 0
    cancel_requested: bool = False
    finishing: bool = False


class _EventHooks(ToolHooks):
    """Publishes the tool executor's progress as events of the current run."""

    def __init__(self, executor: AgentExecutor) -> None:
        self._executor = executor

    async def call_started(self, call: ToolCallRequest) -> None:
        await self._executor._emit(
            ToolCallStarted, call_id=call.id, name=call.name, arguments=call.arguments
        )

    async def approval_required(self, call: ToolCallRequest, request: ApprovalRequest) -> None:
        await self._executor._emit(
            ApprovalRequired,
            call_id=call.id,
            name=call.name,
            arguments=call.arguments,
            reason=request.reason,
        )

    async def approval_resolved(self, call: ToolCallRequest, response: ApprovalResponse) -> None:
        await self._executor._emit(
            ApprovalResolved,
            call_id=call.id,
            name=call.name,
            approved=response.approved,
            reason=response.reason,
        )

    async def call_finished(self, call: ToolCallRequest, result: ToolResult) -> None:
        duration_ms = result.duration_seconds * 1000
        if result.failed:
            await self._executor._emit(
                ToolCallFailed,
                call_id=call.id,
                name=call.name,
                error=result.content,
                duration_ms=duration_ms,
            )
        else:
            await self._executor._emit(
                ToolCallCompleted,
                call_id=call.id,
                name=call.name,
                content=result.content,
                is_error=result.is_error,
                truncated=result.truncated,
                duration_ms=duration_ms,
            )


_REPROMPT = (
    "You answered without calling a tool. If the task is done, call task_completion with a "
    "summary; if you need the user, call ask_question; otherwise continue with your tools."
)


class AgentExecutor:
    """Runs an agent: the loop of prompt, model call, tools and environment updates.

    One run, step by step:

    1. check the stop limits (iterations, tokens, cost, cancellation);
    2. build the prompt with the ContextManager (environment + history within the budget);
    3. call the model, streaming its deltas as events when configured;
    4. record the assistant turn (thinking, text, tool calls) in the history;
    5. without tool calls: validate the final answer (output schema) or re-prompt, or finish;
    6. execute the tool calls concurrently (validated, policy-checked, timed out);
    7. apply result handlers: tool results update the Environment (events say what changed);
    8. record the results in the history; honour loop-control tools; detect a stuck model;
    9. prune the history if needed, save the step, and repeat.

    Args:
        llm: The model client.
        config: The agent's settings (defaults when omitted).
        tools: The tool executor; `tool_executor_from_config` builds one when omitted.
            Loop-control tools are registered into it when ``config.control_tools`` is on.
            MCP servers need a running connection, so ``config.mcp_servers`` are started by
            the caller (``MCPServers(...).register(agent.tools)``; the CLI does it).
        environment: The working memory (a fresh one when omitted).
        history: The transcript (a fresh one when omitted).
        context: The budgeted prompt builder; built from `config.context` when omitted.
        approval: Answers approval requests of tools that need one.
        store: Saves every completed step, so a killed process loses at most the step in
            flight (see `agent_flow.store`).
        session_id: The stored session to write to; a new one is created on the first run
            when omitted. `resume` fills both from a stored session.
        bus: The event bus (a fresh one when omitted).
        output_type: A pydantic model the final answer must match (JSON); overrides
            ``config.output_schema``. The outcome's ``output`` holds it as JSON data
            (`ExecutionOutcome.output_as` returns the model).
        stream: Stream model answers (deltas become events); default from the LLM config,
            else on.
    """

    def __init__(
        self,
        llm: LLMClient,
        *,
        config: AgentConfig | None = None,
        tools: ToolExecutor | None = None,
        environment: Environment | None = None,
        history: History | None = None,
        context: ContextManager | None = None,
        approval: ApprovalCallback | None = None,
        store: SessionStore | None = None,
        session_id: str | None = None,
        bus: EventBus | None = None,
        output_type: type[BaseModel] | None = None,
        stream: bool | None = None,
    ) -> None:
        self.config = config if config is not None else AgentConfig()
        self.llm = llm
        self.output_type = output_type
        self.stream = stream if stream is not None else _config_streams(self.config)
        self.events = bus if bus is not None else EventBus()
        counter, self._counter_note = _make_counter(self.config)
        if history is not None:
            # Every count must come from one counter, or the budget invariant breaks.
            counter, self._counter_note = history.counter, None
        if context is not None:
            self.context = context
        else:
            self.context = ContextManager(
                environment if environment is not None else Environment(),
                history if history is not None else History(counter=counter),
                self.config.context.max_tokens,
                environment_allocation=self.config.context.environment_allocation,
                system_prompt_template=self.config.system_prompt or DEFAULT_SYSTEM_PROMPT_TEMPLATE,
                counter=counter,
                reserve_output_tokens=self.config.context.reserve_output_tokens,
                strategy=self._strategy(counter),
                prune_target=self.config.context.prune_target,
            )
        self._base_template = self.context.system_prompt_template
        self.tools = tools if tools is not None else tool_executor_from_config(self.config)
        self._hooks = _EventHooks(self)
        if approval is not None:
            self.tools.approval = approval
        if self.config.control_tools:
            for control in control_tools():
                if control.name not in self.tools:
                    self.tools.register(control)
        self.store = store
        self.session_id = session_id
        self.skill: Skill | None = None
        self._run: _Run | None = None
        self._emit_lock = asyncio.Lock()
        self._task: asyncio.Task[object] | None = None

    @classmethod
    async def resume(
        cls,
        store: SessionStore,
        session_id: str,
        llm: LLMClient,
        *,
        config: AgentConfig | None = None,
        tools: ToolExecutor | None = None,
        approval: ApprovalCallback | None = None,
        bus: EventBus | None = None,
        output_type: type[BaseModel] | None = None,
        stream: bool | None = None,
    ) -> AgentExecutor:
        """Rebuild an agent from a stored session; continue it with `send`.

        Args:
            store: The session store.
            session_id: The session to continue.
            llm: The model client.
            config: The agent's settings (defaults when omitted).
            tools: As in the constructor.
            approval: As in the constructor.
            bus: As in the constructor.
            output_type: As in the constructor.
            stream: As in the constructor.

        Raises:
            SessionNotFoundError: No session has that id.
        """
        state = await store.load(session_id)
        settings = config if config is not None else AgentConfig()
        history = state.history(counter=_make_counter(settings)[0])
        environment = state.environment if state.environment is not None else Environment()
        return cls(
            llm,
            config=settings,
            history=history,
            environment=environment,
            store=store,
            session_id=session_id,
            tools=tools,
            approval=approval,
            bus=bus,
            output_type=output_type,
            stream=stream,
        )

    # -- construction helpers ----------------------------------------------------------

    def _strategy(self, counter: TokenCounter) -> PruningStrategy:
        settings = self.config.context
        match settings.strategy:
            case "elide_then_drop":
                return Chain(ElideToolResults(), DropOldest())
            case "drop_oldest":
                return DropOldest()
            case "sliding_window":
                return Chain(SlidingWindow(settings.window_turns), DropOldest())
            case "summarize":
                from agent_flow.llm.summarizer import LLMSummarizer

                return Chain(
                    ElideToolResults(),
                    SummarizeOldest(LLMSummarizer(self.llm, counter=counter)),
                    DropOldest(),
                )

    # -- public API --------------------------------------------------------------------

    @property
    def environment(self) -> Environment:
        """The agent's working memory."""
        return self.context.environment

    @property
    def history(self) -> History:
        """The agent's transcript."""
        return self.context.history

    def subscribe(
        self,
        *,
        maxsize: int | None = None,
        policy: BackpressurePolicy = "wait",
        kinds: Iterable[str] | None = None,
    ) -> Subscription:
        """Subscribe to the events of the current or next run; see `EventBus.subscribe`.

        The subscription ends when that run ends.
        """
        return self.events.subscribe(maxsize=maxsize, policy=policy, kinds=kinds)

    def activate_skill(self, name: str | None) -> None:
        """Switch to the skill called `name` (``None``: back to the agent's own prompt).

        Raises:
            ConfigError: No skill has that name.
        """
        if name is None:
            self.skill = None
            self.context.system_prompt_template = self._base_template
            return
        self.skill = self.config.skill(name)
        template = self.skill.system_prompt
        if "{environment}" not in template:
            template = template.rstrip() + "\n\n{environment}"
        self.context.system_prompt_template = template

    def offered_tools(self) -> list[ToolDefinition]:
        """The tools the model is offered now (config allow/deny lists and the active skill)."""
        return [d for d in self.tools.definitions() if self._callable(d.name)]

    def _callable(self, name: str) -> bool:
        if any(fnmatch.fnmatchcase(name, p) for p in self.config.deny_tools):
            return False
        if name in self.tools and name in _CONTROL_NAMES and self.config.control_tools:
            return True
        if self.config.allow_tools is not None and not any(
            fnmatch.fnmatchcase(name, p) for p in self.config.allow_tools
        ):
            return False
        if self.skill is not None:
            return any(fnmatch.fnmatchcase(name, p) for p in self.skill.allowed_tools)
        return True

    async def run(self, task: str) -> ExecutionOutcome:
        """Run the agent on `task` until a stop condition; see the class docstring.

        Cancelling the task running this coroutine cancels tools in flight, closes the
        history consistently and re-raises; `cancel` instead ends the run with
        `StopReason.CANCELLED` and returns its outcome.
        """
        if self.environment.task.objective == "":
            self.environment.update_section(
                "task", objective=task, status=TaskStatus.IN_PROGRESS.value
            )
        return await self._execute(task)

    async def send(self, message: str) -> ExecutionOutcome:
        """Continue the conversation with a new user message (e.g. answering a question)."""
        return await self._execute(message)

    def cancel(self) -> None:
        """Cancel the current run: tools in flight are cancelled, `run` returns CANCELLED."""
        run, task = self._run, self._task
        # Once: a second cancel() must not leave a cancellation pending on the caller, and
        # one that arrives while the run is already finishing has nothing left to cancel.
        if run is None or task is None or run.cancel_requested or run.finishing:
            return
        run.cancel_requested = True
        task.cancel()

    # -- the loop ----------------------------------------------------------------------

    async def _execute(self, message: str) -> ExecutionOutcome:
        if self._run is not None:
            raise UserError("this agent is already running; await the current run first")
        run = _Run(run_id=uuid.uuid4().hex)
        self._run = run
        self._task = asyncio.current_task()
        finish: Finish
        try:
            if self.store is not None and self.session_id is None:
                title = textwrap.shorten(message, width=80, placeholder=" …")
                info = await self.store.create(agent=self.config.name, title=title)
                self.session_id = info.id
            self._close_pending("the previous run ended before this call finished")
            self.history.add(UserMessage(content=message))
            await self._emit(
                RunStarted, task=message, agent=self.config.name, model=_model_name(self.llm)
            )
            if self._counter_note is not None:
                await self._emit(WarningRaised, message=self._counter_note, source="tokens")
            finish = await self._loop(run)
        except asyncio.CancelledError:
            self._close_pending("the run was cancelled before this call finished")
            run.finishing = True
            if not run.cancel_requested:
                await self._finish(run, Finish(StopReason.CANCELLED))
                raise
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
            finish = Finish(StopReason.CANCELLED)
        # The loop's own failures (a summarizer's model error during pruning, a store that
        # cannot write, a bug) end the run with an error instead of leaving it half-open.
        except Exception as err:
            self._close_pending("the run failed before this call finished")
            wrapped = (
                err if isinstance(err, AgentFlowError) else RunError(f"{type(err).__name__}: {err}")
            )
            await self._error(run, wrapped, fatal=True)
            finish = Finish(StopReason.ERROR, text=str(wrapped))
        run.finishing = True
        return await self._finish(run, finish)

    async def _loop(self, run: _Run) -> Finish:
        while True:
            limit = self._limit_reached(run)
            if limit is not None:
                return limit
            run.iteration += 1
            await self._emit(IterationStarted, iteration=run.iteration)
            step = await self._model_step(run)
            if isinstance(step, RunTools):
                step = await self._tool_step(run, step)
            if isinstance(step, Finish):
                return step
            await self._after_step(run)

    def _limit_reached(self, run: _Run) -> Finish | None:
        config = self.config
        if run.iteration >= config.max_iterations:
            return Finish(StopReason.MAX_ITERATIONS)
        if config.max_total_tokens is not None and run.usage.total_tokens >= (
            config.max_total_tokens
        ):
            return Finish(StopReason.TOKEN_LIMIT)
        if config.max_cost_usd is not None and config.pricing is not None:
            cost = config.pricing.cost(run.usage.prompt_tokens, run.usage.completion_tokens)
            if cost >= config.max_cost_usd:
                return Finish(StopReason.COST_LIMIT)
        return None

    async def _model_step(self, run: _Run) -> Step:
        """Steps 2-5: prompt, model call, record the turn, decide what follows."""
        tools = self.offered_tools()
        try:
            prompt = self.context.build_prompt(tools=tools)
        except ContextBudgetError as err:
            await self._error(run, err, fatal=True)
            return Finish(StopReason.CONTEXT_BUDGET, text=str(err))
        await self._emit(ContextBuilt, iteration=run.iteration, breakdown=prompt.breakdown)
        request = LLMRequest(messages=prompt.messages, tools=prompt.tools)

        completion: Completion | None = None
        started = time.perf_counter()
        for attempt in range(self.config.model_retries + 1):
            try:
                completion = await self._call_model(request)
                break
            except ModelError as err:
                last_try = attempt == self.config.model_retries
                if not err.retryable or last_try:
                    await self._error(run, err, fatal=True)
                    return Finish(StopReason.ERROR, text=str(err))
                await self._error(run, err, fatal=False)
        assert completion is not None
        usage = completion.usage or Usage()
        run.usage = run.usage + usage
        run.usage_per_call.append(usage)
        await self._emit(
            ModelResponded,
            iteration=run.iteration,
            finish_reason=completion.finish_reason,
            prompt_tokens=usage.prompt_tokens,
            completion_tokens=usage.completion_tokens,
            tool_calls=len(completion.tool_calls),
            duration_ms=(time.perf_counter() - started) * 1000,
        )
        for warning in completion.warnings:
            await self._emit(WarningRaised, message=warning, source="model")

        self._record_turn(completion)
        if completion.tool_calls:
            return RunTools(completion.tool_calls)
        if completion.finish_reason == "length":
            await self._emit(
                WarningRaised,
                message="the model's answer was cut at its token limit",
                source="model",
            )
        return await self._text_answer(run, completion.text)

    async def _call_model(self, request: LLMRequest) -> Completion:
        if not self.stream:
            return await self.llm.complete(request)
        completion: Completion | None = None
        stream: AsyncIterator[StreamEvent] = self.llm.stream(request)
        async for delta in stream:
            match delta:
                case TextChunk(text=text):
                    await self._emit(TextDelta, text=text)
                case ThinkingChunk(text=text):
                    await self._emit(ThinkingDelta, text=text)
                case ToolCallChunk(index=index, id=call_id, name=name):
                    await self._emit(
                        ToolCallArgumentsDelta, index=index, call_id=call_id, name=name, delta=""
                    )
                case ToolCallArgumentsChunk(index=index, id=call_id, delta=text):
                    await self._emit(
                        ToolCallArgumentsDelta, index=index, call_id=call_id, name=None, delta=text
                    )
                case StreamWarning(message=message):
                    await self._emit(WarningRaised, message=message, source="model")
                case Completion():
                    completion = delta
        if completion is None:
            raise ModelResponseError("the model's stream ended without a final answer")
        return completion

    def _record_turn(self, completion: Completion) -> None:
        if completion.thinking:
            self.history.add(AgentThinking(content=completion.thinking))
        if completion.text:
            self.history.add(AgentMessage(content=completion.text))
        for call in completion.tool_calls:
            self.history.add(
                ToolCall(call_id=call.id, name=_call_name(call.name), arguments=call.arguments)
            )

    async def _text_answer(self, run: _Run, text: str) -> Step:
        """Step 5: an answer without tool calls."""
        schema = self.config.output_schema
        if self.output_type is not None:
            schema = self.output_type.model_json_schema()
        if schema is not None:
            output, problem = _validate_output(text, schema, self.output_type)
            if problem is None:
                return Finish(StopReason.COMPLETED, text=text, output=output)
            if run.output_retries >= self.config.max_output_retries:
                err = OutputValidationError(
                    f"the final answer did not match the output schema after "
                    f"{run.output_retries} correction(s): {problem}",
                    last_answer=text,
                    problems=problem,
                )
                await self._error(run, err, fatal=True)
                return Finish(StopReason.OUTPUT_INVALID, text=text)
            run.output_retries += 1
            self.history.add(
                UserMessage(
                    content=(
                        f"Your answer does not match the required output schema: {problem}\n"
                        "Answer again with only a JSON value that matches this schema:\n"
                        f"{json.dumps(schema)}"
                    )
                )
            )
            return Continue()
        if self.config.on_text_answer == "reprompt" and run.reprompts < self.config.max_reprompts:
            run.reprompts += 1
            self.history.add(UserMessage(content=_REPROMPT))
            return Continue()
        return Finish(StopReason.ANSWERED, text=text)

    async def _tool_step(self, run: _Run, step: RunTools) -> Step:
        """Steps 6-8: execute the calls, apply handlers, record results, honour control."""
        requests = [call.to_request() for call in step.calls]
        # Unknown names go to the executor, which tells the model what exists; registered
        # tools the agent may not use now (deny list, skill) are refused here.
        refused = {
            r.id: self._refusal(r)
            for r in requests
            if r.name in self.tools and not self._callable(r.name)
        }
        allowed = [r for r in requests if r.id not in refused]
        version_before = self.environment.version
        outcomes = {
            o.call.id: o
            for o in await self.tools.execute(
                allowed, run_id=run.run_id, environment=self.environment, hooks=self._hooks
            )
        }

        control: ControlSignal | None = None
        for request in requests:
            outcome = outcomes.get(request.id)
            result = outcome.result if outcome is not None else refused[request.id]
            if outcome is None:
                await self._emit(
                    ToolCallFailed,
                    call_id=request.id,
                    name=request.name,
                    error=result.content,
                    duration_ms=0.0,
                )
            else:
                for problem in outcome.handler_errors:
                    await self._emit(
                        WarningRaised,
                        message=f"result handler {problem.handler} failed on {request.name}: "
                        f"{problem.error_type}: {problem.message}",
                        source="handlers",
                    )
                    run.errors.append(
                        RunErrorInfo(
                            type=problem.error_type,
                            message=problem.message,
                            fatal=False,
                            iteration=run.iteration,
                        )
                    )
            self.history.add(
                ToolResultEntry(
                    call_id=request.id,
                    tool_name=_call_name(request.name),
                    content=result.content,
                    is_error=result.is_error,
                )
            )
            run.tool_uses.append(
                ToolUse(
                    iteration=run.iteration,
                    call_id=request.id,
                    name=request.name,
                    arguments=request.arguments,
                    content=result.content,
                    is_error=result.is_error,
                    error_kind=result.error_kind,
                    duration_ms=result.duration_seconds * 1000,
                )
            )
            if result.control is not None and not result.is_error:
                if isinstance(result.control, PlanUpdate):
                    await self._emit(
                        PlanUpdated,
                        plan=result.control.plan,
                        current_step=result.control.current_step,
                    )
                elif control is None:
                    control = result.control

        changes = self.environment.changes(since_version=version_before)
        if changes:
            await self._emit(
                EnvironmentUpdated,
                source=", ".join(sorted({r.name for r in requests})),
                version=self.environment.version,
                changes=tuple(changes),
            )
        if control is not None:
            return await self._control(control)
        return await self._check_stuck(run, requests, outcomes)

    def _refusal(self, request: ToolCallRequest) -> ToolResult:
        where = f"while skill {self.skill.name!r} is active" if self.skill else "to this agent"
        offered = ", ".join(d.name for d in self.offered_tools()) or "none"
        return ToolResult.error(
            f"tool {request.name!r} is not available {where}; available: {offered}",
            kind="denied",
        ).model_copy(update={"call_id": request.id, "tool_name": request.name})

    async def _control(self, control: ControlSignal) -> Finish:
        match control:
            case TaskCompletion(summary=summary, result=result):
                self.environment.update_section("task", status=TaskStatus.COMPLETED.value)
                return Finish(StopReason.COMPLETED, text=summary, output=result)
            case UserQuestion(question=question):
                self.environment.update_section("task", status=TaskStatus.WAITING.value)
                return Finish(StopReason.WAITING_FOR_USER, text=question)
            case ConverseMessage(message=message):
                return Finish(StopReason.CONVERSE, text=message)
            case PlanUpdate():  # pragma: no cover - plan updates never end the loop
                raise AssertionError("a plan update does not end the loop")

    async def _check_stuck(
        self, run: _Run, requests: Sequence[ToolCallRequest], outcomes: dict[str, ToolOutcome]
    ) -> Step:
        signature = tuple(
            (r.name, r.arguments, outcomes[r.id].result.content if r.id in outcomes else "")
            for r in requests
        )
        run.repeats = run.repeats + 1 if signature == run.last_signature else 1
        run.last_signature = signature
        threshold = self.config.stuck_threshold
        if run.repeats >= 2 * threshold:
            await self._emit(
                WarningRaised,
                message=f"stopping: the same calls returned the same results {run.repeats} "
                "times in a row",
                source="loop",
            )
            return Finish(StopReason.STUCK)
        if run.repeats >= threshold:
            names = ", ".join(sorted({r.name for r in requests}))
            note = (
                f"You have made the same call(s) ({names}) with the same arguments "
                f"{run.repeats} times in a row and got the same results. Repeating will not "
                "help: change your approach, or call task_completion / ask_question."
            )
            self.history.add(UserMessage(content=note))
            await self._emit(WarningRaised, message=note, source="loop")
        return Continue()

    async def _after_step(self, run: _Run) -> None:
        """Step 9: prune, then save the completed step."""
        report = await self.context.prune_if_needed(tools=self.offered_tools())
        if report is not None and report.changed:
            await self._emit(HistoryPruned, report=report)
        await self._save(run, status="active")

    async def _finish(self, run: _Run, finish: Finish) -> ExecutionOutcome:
        duration_ms = (time.perf_counter() - run.started) * 1000
        outcome = ExecutionOutcome(
            run_id=run.run_id,
            final_text=finish.text,
            output=finish.output,
            stop_reason=finish.reason,
            tool_uses=tuple(run.tool_uses),
            usage=run.usage,
            usage_per_call=tuple(run.usage_per_call),
            errors=tuple(run.errors),
            iterations=run.iteration,
            started_at=run.started_at,
            duration_ms=duration_ms,
            environment_version=self.environment.version,
        )
        try:
            await self._emit(
                RunFinished,
                stop_reason=finish.reason.value,
                final_text=finish.text,
                output=finish.output,
                iterations=run.iteration,
                prompt_tokens=run.usage.prompt_tokens,
                completion_tokens=run.usage.completion_tokens,
                duration_ms=duration_ms,
            )
            await self._save(run, status=_session_status(finish.reason))
        finally:
            self.events.close()
            self._run = None
            self._task = None
        return outcome

    # -- plumbing ----------------------------------------------------------------------

    def _close_pending(self, reason: str) -> None:
        """Answer calls left without results, so the history never has a dangling call."""
        for call in self.history.pending_calls():
            self.history.add(
                ToolResultEntry(
                    call_id=call.call_id,
                    tool_name=call.name,
                    content=f"error: {reason}",
                    is_error=True,
                )
            )

    async def _save(self, run: _Run, *, status: SessionStatus) -> None:
        if self.store is None or self.session_id is None:
            run.pending_events.clear()
            return
        events, run.pending_events = run.pending_events, []
        await self.store.save_step(
            self.session_id,
            history=self.history,
            environment=self.environment,
            events=events,
            status=status,
        )

    async def _error(self, run: _Run, err: AgentFlowError, *, fatal: bool) -> None:
        run.errors.append(
            RunErrorInfo(
                type=type(err).__name__, message=str(err), fatal=fatal, iteration=run.iteration
            )
        )
        await self._emit(
            ExecutionError, error_type=type(err).__name__, message=str(err), fatal=fatal
        )

    async def _emit(self, kind: Callable[..., AgentEvent], **fields: object) -> None:
        run = self._run
        if run is None:
            return
        # Parallel tool calls emit concurrently: number and publish under one lock, so every
        # subscriber sees the events in sequence order.
        async with self._emit_lock:
            event = kind(run_id=run.run_id, seq=run.seq, **fields)
            run.seq += 1
            if self.store is not None:
                run.pending_events.append(event)
            await self.events.publish(event)


# The loop-control tools and the plan tool stay callable under any skill.
_CONTROL_NAMES = CONTROL_TOOL_NAMES | {update_plan.name}


def _make_counter(config: AgentConfig) -> tuple[TokenCounter, str | None]:
    """Return the counter for the configured model, and a note if it had to fall back."""
    if config.context.counter == "approx":
        return ApproxCounter(), None
    try:
        model = config.resolved_llm().model if config.llm is not None else None
    except ConfigError:
        model = None
    if model is None:
        return TiktokenCounter(), None
    # A model whose encoding is not installed is counted with cl100k_base; the executor
    # reports that as a warning event of each run instead of through the warnings module.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", TokenizerFallbackWarning)
        counter = TiktokenCounter(model)
    notes = [str(w.message) for w in caught if issubclass(w.category, TokenizerFallbackWarning)]
    return counter, (notes[0] if notes else None)


def _call_name(name: str) -> str:
    """The name a call is recorded under; a call the model left nameless is "unknown"."""
    return name or "unknown"


def _model_name(client: LLMClient) -> str:
    return str(getattr(client, "model", "") or type(client).__name__)


def _session_status(reason: StopReason) -> SessionStatus:
    if reason in (StopReason.COMPLETED, StopReason.ANSWERED, StopReason.CONVERSE):
        return "completed"
    if reason is StopReason.WAITING_FOR_USER:
        return "waiting"
    if reason is StopReason.CANCELLED:
        return "cancelled"
    # Limits, a stuck model, errors: the task did not get done.
    return "failed"


def _validate_output(
    text: str, schema: JsonObject, model: type[BaseModel] | None
) -> tuple[JsonValue, str | None]:
    """Parse `text` as JSON (a fenced block is accepted) and validate it.

    With a pydantic `model`, the model validates (its own rules included); otherwise the
    JSON `schema` does. Returns the value (as JSON data) or what is wrong with it.
    """
    candidate = text.strip()
    if candidate.startswith("```"):
        candidate = candidate.strip("`")
        candidate = candidate.split("\n", 1)[1] if "\n" in candidate else ""
        candidate = candidate.rsplit("```", 1)[0].strip()
    try:
        value: JsonValue = json.loads(candidate)
    except json.JSONDecodeError as err:
        return None, f"the answer is not valid JSON ({err.msg} at position {err.pos})"
    if model is not None:
        try:
            return model.model_validate(value).model_dump(mode="json"), None
        except ValidationError as err:
            return None, "; ".join(
                f"at /{'/'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in err.errors()[:5]
            )
    errors = sorted(
        jsonschema.Draft202012Validator(schema).iter_errors(value), key=lambda e: list(e.path)
    )
    if errors:
        problems = "; ".join(
            f"at /{'/'.join(str(p) for p in e.path)}: {e.message}" for e in errors[:5]
        )
        return None, problems
    return value, None


def tool_executor_from_config(
    config: AgentConfig, *, approval: ApprovalCallback | None = None
) -> ToolExecutor:
    """Build the tool executor `config` describes.

    It gets the configured policy, timeouts and output limit, and the built-in file tools
    when ``config.workspace`` names a directory.

    Raises:
        ToolError: The workspace directory cannot be used.
    """
    policy = config.policy
    executor = ToolExecutor(
        policy=PolicyEngine(
            auto_approve=policy.auto_approve,
            read_only=policy.read_only,
            approval_tools=policy.approval_tools,
            approval_risk=policy.approval_risk,
        ),
        approval=approval,
        default_timeout=config.tool_timeout,
        max_output_tokens=config.max_tool_output_tokens,
    )
    if config.workspace is not None:
        executor.register_all(workspace_tools(Workspace(config.workspace)))
    return executor


def _config_streams(config: AgentConfig) -> bool:
    try:
        return config.resolved_llm().stream if config.llm is not None else True
    except ConfigError:
        return True
