"""`ToolExecutor`: the registry of tools and the safe execution of one turn's tool calls.

The executor is where a model's tool calls meet the world, and nothing a tool does may crash
the agent loop. For each `ToolCall` it:

1. parses the arguments (invalid JSON → an error result),
2. finds the tool (an unknown name → an error result listing close matches and the tools
   available),
3. validates the arguments against the tool's JSON schema (→ an error result naming each
   problem and the expected parameters),
4. asks the `PolicyEngine` (denied → an error result; requires approval → the
   `ApprovalCallback`, with `ToolHooks` told before and after),
5. runs the tool under its timeout (a per-tool timeout, else the executor's default), turning
   `ToolError`, any other exception and timeouts into error results,
6. replaces known secret values in the result with ``[REDACTED:NAME]`` (`SecretRedactor`),
   so nothing a tool stumbles on reaches the model, the events or the store,
7. truncates the content to the tool's token limit with a visible marker (the full result
   stays available), and
8. once every call of the turn has finished, applies the result handlers to the environment
   in call order (successful results without a loop-control signal only); a handler that
   raises is reported in the outcome, the result is kept.

The calls of one turn run concurrently in an `asyncio.TaskGroup` and the outcomes come back in
call order. A turn's only call runs in the caller's task (in a copy of its context, as in a
task) when its tool has no async code of its own (a sync function, which runs on a tool
thread): the task would cost a turn of the event loop. Cancelling `execute` cancels the
running tools.

In a durable run (a step runner is set, see `agent_flow._checkpoints`) each invocation is a
step recording its `ToolResult`. Recovery matches steps by position, so the calls of a turn
run side by side only when the runner reserves each call's positions in call order first
(`CallSteps`, as `agent_flow.durable` does); with another runner they run one after another
(`StepRunner.sequential_tools`). A call a crash interrupted runs again if its tool is
idempotent (or read-only); otherwise it gets an error result saying so, and never runs twice.

Several agents may share one executor: the hooks and the approver of a turn travel with its
`execute` call (a `_Scope`), never as state on the executor, so each agent hears about and
answers for its own calls only. The executor's own `hooks` and `approval` are the defaults
for calls that bring none.

Registration (names, namespaces, collisions, schema checks) is `ToolRegistry`'s, in
`_registry`; argument checking is in `_validation`, output limits in `_truncation`, the
approval flow in `_approval` and `ToolHooks` in `_hooks`. This module runs the calls.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict

from agent_flow._checkpoints import STEP_RUNNER, CallSteps, checkpointed, current_step_runner
from agent_flow._defaults import (
    DEFAULT_MAX_TOOL_OUTPUT_TOKENS,
    DEFAULT_TOOL_TIMEOUT,
    LARGE_TEXT_CHARS,
)
from agent_flow._eager import in_own_context
from agent_flow._text import truncate_to_tokens
from agent_flow._types import JsonObject
from agent_flow._utils import conforms
from agent_flow.environment import EnvironmentChange
from agent_flow.errors import ToolError, UserError
from agent_flow.messages import ChatMessage, ToolCall
from agent_flow.tokens import TokenCounter, default_counter
from agent_flow.tools._approval import _ask_approval
from agent_flow.tools._hooks import ToolHooks, _hook
from agent_flow.tools._registry import (
    MAX_TOOL_NAME_LENGTH,
    RegisteredTool,
    ToolRegistry,
    provider_tool_name,
)
from agent_flow.tools._secrets import SecretRedactor
from agent_flow.tools._threads import tool_threads
from agent_flow.tools._truncation import MIN_OUTPUT_TOKENS, _check_limit, cut_marker
from agent_flow.tools._validation import _schema_problems
from agent_flow.tools.base import (
    FunctionTool,
    Tool,
    ToolArgumentsError,
    ToolContext,
    to_tool_result,
)
from agent_flow.tools.handlers import HandlerError, HandlerRegistry
from agent_flow.tools.policy import (
    ApprovalCallback,
    ApprovalResponse,
    PolicyDecision,
    PolicyEngine,
)
from agent_flow.tools.results import ErrorKind, OutputCheck, ToolResult, mended

if TYPE_CHECKING:
    from agent_flow.environment import Environment

__all__ = [
    "MAX_TOOL_NAME_LENGTH",
    "MIN_OUTPUT_TOKENS",
    "RegisteredTool",
    "ToolExecutor",
    "ToolHooks",
    "ToolOutcome",
    "provider_tool_name",
]

logger = logging.getLogger(__name__)


class ToolOutcome(BaseModel):
    """Everything the loop needs about one executed call.

    Attributes:
        call: The call as the model made it.
        result: The result for the model (content possibly truncated).
        full_result: The complete result, as the handlers saw it.
        decision: The policy decision (``None`` when the call never reached the policy:
            invalid JSON, unknown tool, invalid arguments).
        approval: The approval answer, when approval was asked.
        handler_errors: Result handlers that raised (the result is unaffected).
        environment_changes: Changes the result handlers made to the environment. Changes a
            tool makes itself through its context are not attributed to a call (calls run
            concurrently); read them with ``environment.changes(since_version)``.
    """

    model_config = ConfigDict(frozen=True)

    call: ToolCall
    result: ToolResult
    full_result: ToolResult
    decision: PolicyDecision | None = None
    approval: ApprovalResponse | None = None
    handler_errors: tuple[HandlerError, ...] = ()
    environment_changes: tuple[EnvironmentChange, ...] = ()

    def to_message(self) -> ChatMessage:
        """The tool message that answers the call in the next prompt."""
        return ChatMessage(
            role="tool",
            content=self.result.content,
            tool_call_id=self.call.id,
            name=self.result.tool_name or self.call.name,
        )


@dataclass
class _Ran:
    result: ToolResult
    decision: PolicyDecision | None = None
    approval: ApprovalResponse | None = None
    shown: ToolResult | None = None  # the result as the model sees it (truncated)


@dataclass(frozen=True, slots=True)
class _Scope:
    """What one `execute` call brings along: who hears about its calls and who approves them."""

    run_id: str
    environment: Environment | None
    hooks: ToolHooks
    approval: ApprovalCallback | None
    output: OutputCheck | None = None


class ToolExecutor(ToolRegistry):
    """Registers tools and executes the model's tool calls safely.

    Registering tools (`register`, `register_all`, `unregister`, `names`, `definitions`)
    comes from `ToolRegistry`.

    Args:
        tools: Tools (or plain functions, wrapped with `@tool`) to register now.
        policy: Decides what may run; defaults to a `PolicyEngine` with its defaults.
        approval: Answers approval requests of calls whose `execute` brings no approver of its
            own; without any, calls needing approval are refused.
        handlers: Result handlers applied when an environment is passed to `execute`;
            defaults to `HandlerRegistry.with_defaults()` (pass an empty
            ``HandlerRegistry(default=None)`` for none).
        hooks: Callbacks for the progress of calls whose `execute` brings no hooks of its own.
        default_timeout: Seconds a call may run unless its tool says otherwise (``None``: no
            limit).
        max_output_tokens: Default token limit of a result's content (``None``: no limit).
        counter: Counts tokens for truncation; defaults to the counter of the first agent
            that uses this executor (`count_with`), else `default_counter()`. A result over
            `LARGE_TEXT_CHARS` characters is counted on the tool threads, so a
            counter of your own must be thread-safe (agent_flow's are).
        max_concurrency: The most calls running at once (``None``: all of a turn).
        approval_timeout: Seconds to wait for an approval answer (``None``: no limit); an
            answer that reached the approver as the time ran out is kept, not cut off.
        secrets: Redacts known secret values from every result (and progress message);
            default: `SecretRedactor.from_environment()`, the values of this process's
            environment variables whose names look secret. Pass ``SecretRedactor()`` for
            none.

    Raises:
        UserError: A limit is out of range.
    """

    def __init__(
        self,
        tools: Iterable[Tool | Callable[..., object]] = (),
        *,
        policy: PolicyEngine | None = None,
        approval: ApprovalCallback | None = None,
        handlers: HandlerRegistry | None = None,
        hooks: ToolHooks | None = None,
        default_timeout: float | None = DEFAULT_TOOL_TIMEOUT,
        max_output_tokens: int | None = DEFAULT_MAX_TOOL_OUTPUT_TOKENS,
        counter: TokenCounter | None = None,
        max_concurrency: int | None = None,
        approval_timeout: float | None = None,
        secrets: SecretRedactor | None = None,
    ) -> None:
        _check_limit(max_output_tokens)
        if max_concurrency is not None and max_concurrency < 1:
            raise UserError(f"max_concurrency must be at least 1, got {max_concurrency}")
        self.policy = policy or PolicyEngine()
        self.approval = approval
        self.handlers = handlers if handlers is not None else HandlerRegistry.with_defaults()
        self.hooks = hooks or ToolHooks()
        self.default_timeout = default_timeout
        self.max_output_tokens = max_output_tokens
        self.approval_timeout = approval_timeout
        self.secrets = secrets if secrets is not None else SecretRedactor.from_environment()
        self._counter = counter
        self._semaphore = asyncio.Semaphore(max_concurrency) if max_concurrency else None
        super().__init__()
        for item in tools:
            self.register(item)

    @property
    def counter(self) -> TokenCounter:
        """The token counter used for truncation."""
        # The default is not kept: an agent that uses this executor later still gives its own.
        return self._counter if self._counter is not None else default_counter()

    def count_with(self, counter: TokenCounter) -> None:
        """Count with `counter` for truncation, unless this executor already has a counter.

        An `AgentExecutor` calls it with its own counter: a result is then truncated in the
        tokens its prompt budget counts, and a process loads only the tokenizer encodings its
        models use (without it, an agent of an ``o200k_base`` model loaded ``cl100k_base``
        too, about 25 MB, for truncation alone).
        """
        if self._counter is None:
            self._counter = counter

    async def execute(
        self,
        calls: Sequence[ToolCall],
        *,
        run_id: str = "",
        environment: Environment | None = None,
        hooks: ToolHooks | None = None,
        approval: ApprovalCallback | None = None,
        output: OutputCheck | None = None,
    ) -> list[ToolOutcome]:
        """Execute one turn's calls concurrently and return their outcomes in call order.

        Args:
            calls: The calls the model made.
            run_id: The run they belong to (given to tools in their `ToolContext`).
            environment: The run's environment: given to tools, and updated by the result
                handlers.
            hooks: Callbacks for these calls only, instead of the executor's `hooks` (so
                several agents can share one executor, each receiving its own calls' events).
            approval: Answers approval requests of these calls only, instead of the
                executor's `approval` (so agents sharing an executor each answer for their
                own calls).
            output: What the run's final result must match (given to tools in their
                `ToolContext`; ``task_completion`` checks its result against it).

        Never raises for anything a tool does; cancellation propagates (running tools are
        cancelled).
        """
        scope = _Scope(
            run_id=run_id,
            environment=environment,
            hooks=hooks if hooks is not None else self.hooks,
            approval=approval if approval is not None else self.approval,
            output=output,
        )
        ran: list[_Ran | None] = [None] * len(calls)

        runner = current_step_runner()
        # A durable run's calls run side by side, each with its own reserved step positions.
        # (`runner is not None` first, and `conforms` remembers the answer per type: a runtime
        # protocol check costs microseconds per turn.)
        calls_steps = None
        if runner is not None and conforms(runner, CallSteps):  # type: ignore[type-abstract]
            calls_steps = runner.for_calls(len(calls))

        async def run(index: int, call: ToolCall) -> None:
            if calls_steps is None:
                ran[index] = await self._run_call(call, scope)
                return
            token = STEP_RUNNER.set(calls_steps[index])
            try:
                ran[index] = await self._run_call(call, scope)
            finally:
                STEP_RUNNER.reset(token)

        if calls_steps is not None:
            # Durable: every call runs to its end, even when another's record fails; then the
            # first failure in call order stops the run (`StepRecordError`: the tool boundary
            # lets nothing else through). A call cancelled half-way could not be told from a
            # crash, and the calls after the failing one are recorded where they finished.
            ended = await asyncio.gather(
                *(run(index, call) for index, call in enumerate(calls)), return_exceptions=True
            )
            for failure in ended:
                if isinstance(failure, BaseException):
                    raise failure
        elif runner is not None and runner.sequential_tools:
            for index, call in enumerate(calls):
                await run(index, call)
        elif len(calls) == 1 and self._needs_no_task(calls[0]):
            # A task of its own would cost a turn of the event loop; its own context is kept.
            await in_own_context(run(0, calls[0]))
        else:
            async with asyncio.TaskGroup() as group:
                for index, call in enumerate(calls):
                    group.create_task(run(index, call))
        return [
            self._finish(call, record, environment) for call, record in zip(calls, ran, strict=True)
        ]

    def _needs_no_task(self, call: ToolCall) -> bool:
        """Whether `call` may run in the caller's task: no async code of its tool's runs.

        A sync function tool (or an unknown name): nothing of its could cancel the task it
        runs in, or swallow that task's cancellation.
        """
        registered = self._tools.get(call.name)
        return registered is None or (
            isinstance(registered.tool, FunctionTool) and not registered.tool.is_async
        )

    async def execute_one(
        self,
        call: ToolCall,
        *,
        run_id: str = "",
        environment: Environment | None = None,
        hooks: ToolHooks | None = None,
        approval: ApprovalCallback | None = None,
        output: OutputCheck | None = None,
    ) -> ToolOutcome:
        """Execute a single call (see `execute`)."""
        (outcome,) = await self.execute(
            [call],
            run_id=run_id,
            environment=environment,
            hooks=hooks,
            approval=approval,
            output=output,
        )
        return outcome

    def _finish(
        self, call: ToolCall, record: _Ran | None, environment: Environment | None
    ) -> ToolOutcome:
        if record is None:  # the task was cancelled by something other than our caller
            record = _Ran(
                self._error(call, "the call was cancelled before it finished", "exception")
            )
        full = record.result
        errors: tuple[HandlerError, ...] = ()
        changes: tuple[EnvironmentChange, ...] = ()
        if environment is not None and not full.is_error and full.control is None:
            report = self.handlers.apply(environment, call, full)
            errors, changes = tuple(report.errors), tuple(report.changes)
        return ToolOutcome(
            call=call,
            result=record.shown if record.shown is not None else self._truncate(full),
            full_result=full,
            decision=record.decision,
            approval=record.approval,
            handler_errors=errors,
            environment_changes=changes,
        )

    def _truncate(self, result: ToolResult) -> ToolResult:
        registered = self._tools.get(result.tool_name)
        limit = self.max_output_tokens
        if registered is not None and registered.max_output_tokens is not None:
            limit = registered.max_output_tokens
        if limit is None:
            return result
        content, original = truncate_to_tokens(
            result.content, limit, self.counter.count, marker=cut_marker, at_line_break=True
        )
        if content == result.content:
            return result.model_copy(update={"original_tokens": original})
        return result.model_copy(
            update={"content": content, "truncated": True, "original_tokens": original}
        )

    async def _settle(self, result: ToolResult) -> tuple[ToolResult, ToolResult]:
        """`result` redacted, and as the model sees it; a large one off the event loop.

        Redacting and counting a large result takes as long as its text is (most of a second
        for a megabyte never seen before): on the tool threads the loop goes on meanwhile,
        taking the GIL back between their steps (`LARGE_TEXT_CHARS`).
        """
        if len(result.content) <= LARGE_TEXT_CHARS:
            return self._redacted_and_cut(result)
        return await tool_threads().run(self._redacted_and_cut, result)

    def _redacted_and_cut(self, result: ToolResult) -> tuple[ToolResult, ToolResult]:
        redacted = self.secrets.redact_result(mended(result))
        return redacted, self._truncate(redacted)

    async def _run_call(self, call: ToolCall, scope: _Scope) -> _Ran:
        await _hook(scope.hooks.call_started(call))
        try:
            record = await self._attempt(call, scope)
        except Exception as err:  # the tool boundary: a policy rule or schema bug, say
            logger.exception("running tool call %r failed inside the executor", call.name)
            message = f"the call to {call.name!r} failed before it could run: {err}"
            record = _Ran(self._error(call, message, "exception"))
        record.result, record.shown = await self._settle(record.result)
        await _hook(scope.hooks.call_finished(call, record.shown))
        return record

    async def _attempt(self, call: ToolCall, scope: _Scope) -> _Ran:
        # Parsed once, by the call itself: the same verdict the LLM layer reached.
        arguments = call.parsed_arguments
        if arguments is None and call.name:
            return _Ran(self._error(call, str(call.parse_error), "invalid_json"))
        registered = self._tools.get(call.name)
        if registered is None or arguments is None:
            return _Ran(self._error(call, self.unknown_tool_message(call.name), "unknown_tool"))
        problems = _schema_problems(registered, arguments)
        if problems:
            return _Ran(self._error(call, problems, "invalid_arguments"))
        decision = self.policy.evaluate(registered.name, registered.policy, arguments)
        if decision.verdict == "denied":
            message = f"the call to {registered.name!r} was denied: {decision.reason}"
            return _Ran(self._error(call, message, "denied"), decision)
        approval: ApprovalResponse | None = None
        if decision.verdict == "requires_approval":
            approval = await _ask_approval(
                call,
                registered,
                arguments,
                decision,
                approver=scope.approval,
                approval_timeout=self.approval_timeout,
                hooks=scope.hooks,
            )
            if not approval.approved:
                because = f": {approval.reason}" if approval.reason else ""
                message = (
                    f"the user did not approve the call to {registered.name!r}{because}; "
                    "do not repeat it unchanged"
                )
                return _Ran(self._error(call, message, "not_approved"), decision, approval)
        context = ToolContext(
            call_id=call.id,
            tool_name=registered.name,
            run_id=scope.run_id,
            environment=scope.environment,
            output=scope.output,
            progress_callback=self._progress_reporter(call, scope.hooks),
        )
        if self._semaphore is None:
            result = await self._checkpointed_invoke(call, registered, arguments, context)
        else:
            async with self._semaphore:
                result = await self._checkpointed_invoke(call, registered, arguments, context)
        return _Ran(result, decision, approval)

    async def _checkpointed_invoke(
        self,
        call: ToolCall,
        registered: RegisteredTool,
        arguments: JsonObject,
        context: ToolContext,
    ) -> ToolResult:
        """`_invoke`, as a durable step when the run has a step runner (see the module doc)."""
        runner = current_step_runner()
        if runner is None:
            return await self._invoke(call, registered, arguments, context)
        policy = registered.policy
        rerun = policy.idempotent or policy.read_only
        started_before = False
        if not rerun:
            # A step recorded before the call starts: replayed without its result, it
            # means the process that started the call crashed before recording one.
            _, started_now = await checkpointed(
                runner, f"tool_started:{registered.name}", _started, stored_now=True
            )
            started_before = not started_now

        async def work() -> str:
            if started_before:
                result = self._error(
                    call,
                    f"the call to {registered.name!r} was interrupted by a crash and was not "
                    "run again because the tool is not idempotent; check its effect before "
                    "calling it again",
                    "interrupted",
                )
            else:
                result = await self._invoke(call, registered, arguments, context)
            return result.model_dump_json()

        # Not idempotent: its result is stored at once too, so that a crash of this process
        # after the call leaves its answer, not an "interrupted" (it may or may not have run).
        # Unsynced: losing it in a database crash costs that answer, never a second call.
        raw, _ = await checkpointed(
            runner, f"tool:{registered.name}", work, stored_now=not rerun, synced=False
        )
        return ToolResult.model_validate_json(raw)

    async def _invoke(
        self,
        call: ToolCall,
        registered: RegisteredTool,
        arguments: JsonObject,
        context: ToolContext,
    ) -> ToolResult:
        timeout = registered.timeout if registered.timeout is not None else self.default_timeout
        started = time.monotonic()
        deadline = asyncio.timeout(timeout)
        try:
            async with deadline:
                output = await registered.tool.run(arguments, context)
            result = to_tool_result(output)
        except TimeoutError as err:
            if not deadline.expired():
                result = self._exception_result(call, registered, err)
            else:
                message = (
                    f"tool {registered.name!r} did not finish within {timeout:g}s and was "
                    "stopped; try a smaller request"
                )
                result = self._error(call, message, "timeout")
        except ToolArgumentsError as err:
            result = self._error(call, str(err), "invalid_arguments")
        except ToolError as err:
            result = self._error(call, str(err) or type(err).__name__, "tool_error")
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # the run itself is being cancelled
            result = self._error(call, f"tool {registered.name!r} was cancelled", "exception")
        except Exception as err:  # the tool boundary: whatever a tool raises becomes a result
            result = self._exception_result(call, registered, err)
        if result.is_error and result.error_kind is None:
            result = result.model_copy(update={"error_kind": "reported"})
        return result.model_copy(
            update={
                "call_id": call.id,
                "tool_name": registered.name,
                "duration_seconds": time.monotonic() - started,
            }
        )

    def _exception_result(
        self, call: ToolCall, registered: RegisteredTool, err: BaseException
    ) -> ToolResult:
        logger.warning("tool %r raised %s", registered.name, type(err).__name__, exc_info=err)
        detail = f": {err}" if str(err) else ""
        return self._error(
            call, f"tool {registered.name!r} failed with {type(err).__name__}{detail}", "exception"
        )

    def _progress_reporter(
        self, call: ToolCall, hooks: ToolHooks
    ) -> Callable[[float, float | None, str | None], Awaitable[None]]:
        async def report(progress: float, total: float | None, message: str | None) -> None:
            if message is not None:
                message = self.secrets.redact(message)
            await _hook(hooks.progress(call, progress, total, message))

        return report

    def _error(self, call: ToolCall, message: str, kind: ErrorKind) -> ToolResult:
        return ToolResult(
            content=message,
            is_error=True,
            error_kind=kind,
            call_id=call.id,
            tool_name=call.name,
        )


async def _started() -> str:
    return "started"
