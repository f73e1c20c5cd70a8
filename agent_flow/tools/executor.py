"""`ToolExecutor`: the registry of tools and the safe execution of one turn's tool calls.

The executor is where a model's tool calls meet the world, and nothing a tool does may crash
the agent loop. For each `ToolCallRequest` it:

1. parses the arguments (invalid JSON → an error result),
2. finds the tool (an unknown name → an error result listing close matches and the tools
   available),
3. validates the arguments against the tool's JSON schema (→ an error result naming each
   problem and the expected parameters),
4. asks the `PolicyEngine` (denied → an error result; requires approval → the
   `ApprovalCallback`, with `ToolHooks` told before and after),
5. runs the tool under its timeout (a per-tool timeout, else the executor's default), turning
   `ToolError`, any other exception and timeouts into error results,
6. truncates the content to the tool's token limit with a visible marker (the full result
   stays available), and
7. once every call of the turn has finished, applies the result handlers to the environment
   in call order (successful results without a loop-control signal only); a handler that
   raises is reported in the outcome, the result is kept.

The calls of one turn run concurrently in an `asyncio.TaskGroup` and the outcomes come back in
call order. Cancelling `execute` cancels the running tools.

Registered names always fit what providers accept, ``^[a-zA-Z0-9_-]{1,64}$``: characters
outside that set become ``_`` and longer names are cut and suffixed with a hash of the full
name, so they stay distinct (`provider_tool_name`).
"""

from __future__ import annotations

import asyncio
import contextvars
import difflib
import hashlib
import json
import logging
import re
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

import jsonschema
import jsonschema.exceptions
import jsonschema.protocols
import jsonschema.validators
from pydantic import BaseModel, ConfigDict

from agent_flow._types import JsonObject, JsonValue
from agent_flow._utils import loads_json
from agent_flow.environment import EnvironmentChange
from agent_flow.errors import DuplicateToolError, ToolDefinitionError, ToolError, UserError
from agent_flow.messages import ChatMessage, ToolCallRequest, ToolDefinition
from agent_flow.tokens import TokenCounter, default_counter
from agent_flow.tools.base import Tool, ToolArgumentsError, ToolContext, to_tool_result
from agent_flow.tools.base import tool as make_tool
from agent_flow.tools.handlers import HandlerError, HandlerRegistry
from agent_flow.tools.policy import (
    ApprovalCallback,
    ApprovalRequest,
    ApprovalResponse,
    PolicyDecision,
    PolicyEngine,
    ToolPolicy,
)
from agent_flow.tools.results import ErrorKind, ToolResult

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
    "truncate_to_tokens",
]

logger = logging.getLogger(__name__)

MAX_TOOL_NAME_LENGTH = 64
#: The smallest output limit accepted: room for the truncation marker and some content.
MIN_OUTPUT_TOKENS = 32
_INVALID_NAME_CHARS = re.compile(r"[^a-zA-Z0-9_-]")


def provider_tool_name(name: str, *, namespace: str | None = None) -> str:
    """Return the name a tool is registered under: namespaced, provider-safe, at most 64 chars.

    ``provider_tool_name("search", namespace="github")`` is ``"github_search"``. Characters outside
    ``[a-zA-Z0-9_-]`` become ``_``; a longer name keeps its first 55 characters and gets
    ``_`` plus 8 hex digits of the SHA-256 of the full name, so distinct long names stay
    distinct and the same name always maps to the same result.

    Raises:
        ToolDefinitionError: The name is empty.
    """
    full = f"{namespace}_{name}" if namespace else name
    if not name:
        raise ToolDefinitionError("a tool name cannot be empty; give the tool a name")
    cleaned = _INVALID_NAME_CHARS.sub("_", full)
    if len(cleaned) <= MAX_TOOL_NAME_LENGTH:
        return cleaned
    digest = hashlib.sha256(full.encode("utf-8")).hexdigest()[:8]
    return f"{cleaned[: MAX_TOOL_NAME_LENGTH - 9]}_{digest}"


# --- truncation ---------------------------------------------------------------------------


def _marker(cut: int, total: int) -> str:
    return (
        f"\n[... truncated: {cut} of {total} tokens cut to fit the output limit; "
        "ask for a narrower result to see more]"
    )


def truncate_to_tokens(text: str, max_tokens: int, counter: TokenCounter) -> tuple[str, int]:
    """Cut `text` to at most `max_tokens` tokens, ending with a marker saying how much was cut.

    The head of the text is kept, cut at a line break when one is near. The result never
    exceeds `max_tokens` when `max_tokens` is at least `MIN_OUTPUT_TOKENS`.

    Returns:
        The (possibly) truncated text and the token count of the original.
    """
    total = counter.count(text)
    if total <= max_tokens:
        return text, total
    budget = max_tokens - counter.count(_marker(total, total))
    keep = _longest_prefix(text, max(budget, 0), total, counter)
    newline = text.rfind("\n", 0, keep)
    if newline > keep * 0.8:
        keep = newline
    while True:
        head = text[:keep]
        kept = counter.count(head) if keep else 0
        result = head + _marker(total - kept, total)
        if keep == 0 or counter.count(result) <= max_tokens:
            return result, total
        keep = keep * 9 // 10  # token boundaries shifted under the cut; shave a little more


def _longest_prefix(text: str, budget: int, total: int, counter: TokenCounter) -> int:
    """The length of (nearly) the longest prefix of `text` within `budget` tokens."""
    if budget <= 0:
        return 0
    low, high = 0, len(text)  # count(text[:low]) <= budget < count(text[:high])
    guess = int(len(text) * budget / max(total, 1))
    proportional = True
    while high - low > 16:
        if not low < guess < high:
            guess = (low + high) // 2
        tokens = counter.count(text[:guess])
        if tokens <= budget:
            low = guess
        else:
            high = guess
        # Alternate a proportional step (fast on ordinary text) with bisection (guaranteed).
        proportional = not proportional
        guess = int(guess * budget / max(tokens, 1)) if proportional else (low + high) // 2
    return low


# --- records ------------------------------------------------------------------------------


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

    call: ToolCallRequest
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


class ToolHooks:
    """Callbacks the executor awaits as calls progress; override the ones you need.

    The agent loop subclasses this to publish events (tool call started/completed/failed,
    approval required/resolved, progress). A hook that raises is logged and ignored: it never
    changes a result. Every method is a no-op by default.
    """

    async def call_started(self, call: ToolCallRequest) -> None:
        """A call began (every call gets exactly one `call_finished` afterwards)."""

    async def progress(
        self, call: ToolCallRequest, progress: float, total: float | None, message: str | None
    ) -> None:
        """A running tool reported progress."""

    async def approval_required(self, call: ToolCallRequest, request: ApprovalRequest) -> None:
        """A call waits for approval."""

    async def approval_resolved(self, call: ToolCallRequest, response: ApprovalResponse) -> None:
        """An approval request was answered."""

    async def call_finished(self, call: ToolCallRequest, result: ToolResult) -> None:
        """A call produced its result (``result.failed`` when it could not run to completion)."""


@dataclass(frozen=True)
class RegisteredTool:
    """A tool as registered: its exposed name and effective settings.

    Attributes:
        name: The name the model calls it by.
        tool: The tool.
        policy: The effective policy (the registration's, else the tool's).
        timeout: The effective timeout (``None``: the executor's default).
        max_output_tokens: The output limit (``None``: the executor's default).
        definition: What the model is told about it.
    """

    name: str
    tool: Tool
    policy: ToolPolicy
    timeout: float | None
    max_output_tokens: int | None
    definition: ToolDefinition
    validator: jsonschema.protocols.Validator


@dataclass
class _Ran:
    result: ToolResult
    decision: PolicyDecision | None = None
    approval: ApprovalResponse | None = None
    shown: ToolResult | None = None  # the result as the model sees it (truncated)


# --- the executor -------------------------------------------------------------------------

_CALL_HOOKS: contextvars.ContextVar[ToolHooks | None] = contextvars.ContextVar(
    "agent_flow_tool_hooks", default=None
)


class ToolExecutor:
    """Registers tools and executes the model's tool calls safely.

    Args:
        tools: Tools (or plain functions, wrapped with `@tool`) to register now.
        policy: Decides what may run; defaults to a `PolicyEngine` with its defaults.
        approval: Answers approval requests; without one, calls needing approval are refused.
        handlers: Result handlers applied when an environment is passed to `execute`;
            defaults to `HandlerRegistry.with_defaults()` (pass an empty
            ``HandlerRegistry(default=None)`` for none).
        hooks: Callbacks for the loop's events.
        default_timeout: Seconds a call may run unless its tool says otherwise (``None``: no
            limit).
        max_output_tokens: Default token limit of a result's content (``None``: no limit).
        counter: Counts tokens for truncation; defaults to `default_counter()`.
        max_concurrency: The most calls running at once (``None``: all of a turn).
        approval_timeout: Seconds to wait for an approval answer (``None``: no limit).

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
        default_timeout: float | None = 60.0,
        max_output_tokens: int | None = 4000,
        counter: TokenCounter | None = None,
        max_concurrency: int | None = None,
        approval_timeout: float | None = None,
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
        self._counter = counter
        self._semaphore = asyncio.Semaphore(max_concurrency) if max_concurrency else None
        self._tools: dict[str, RegisteredTool] = {}
        for item in tools:
            self.register(item)

    @property
    def counter(self) -> TokenCounter:
        """The token counter used for truncation."""
        if self._counter is None:
            self._counter = default_counter()
        return self._counter

    # --- registry -------------------------------------------------------------------------

    def register(
        self,
        tool: Tool | Callable[..., object],
        *,
        namespace: str | None = None,
        name: str | None = None,
        timeout: float | None = None,
        max_output_tokens: int | None = None,
        policy: ToolPolicy | None = None,
    ) -> str:
        """Register a tool and return the name the model will call it by.

        Args:
            tool: A `Tool`, or a plain function (wrapped with `@tool`).
            namespace: A prefix: ``register(search, namespace="github")`` → ``github_search``.
            name: Register under this name instead of the tool's own.
            timeout: Seconds a call may run (overrides the tool's own timeout).
            max_output_tokens: Token limit of this tool's results.
            policy: A policy overriding the tool's own.

        Raises:
            DuplicateToolError: A tool with the resulting name is already registered.
            ToolDefinitionError: The object is not a tool or its schema is invalid.
        """
        if isinstance(tool, Tool):
            resolved: Tool = tool
        elif callable(tool):
            resolved = make_tool(tool)
        else:
            raise ToolDefinitionError(f"{tool!r} is not a tool; pass a Tool or a typed function")
        tool = resolved
        _check_limit(max_output_tokens)
        exposed = provider_tool_name(name or tool.name, namespace=namespace)
        if exposed in self._tools:
            existing = self._tools[exposed]
            raise DuplicateToolError(
                f"a tool named {exposed!r} is already registered ({existing.tool!r}); "
                "register the new one with another name or a namespace"
            )
        parameters = tool.parameters
        validator = _validator(exposed, parameters)
        self._tools[exposed] = RegisteredTool(
            name=exposed,
            tool=tool,
            policy=policy or tool.policy,
            timeout=timeout if timeout is not None else tool.timeout,
            max_output_tokens=max_output_tokens,
            definition=ToolDefinition(
                name=exposed, description=tool.description, parameters=parameters
            ),
            validator=validator,
        )
        return exposed

    def register_all(
        self, tools: Iterable[Tool | Callable[..., object]], *, namespace: str | None = None
    ) -> list[str]:
        """Register several tools (all or none) and return their names.

        Raises:
            DuplicateToolError: One of the names is taken (nothing is registered then).
        """
        snapshot = dict(self._tools)
        try:
            return [self.register(item, namespace=namespace) for item in tools]
        except BaseException:
            self._tools = snapshot
            raise

    def unregister(self, name: str) -> None:
        """Remove the tool registered as `name`.

        Raises:
            UserError: No tool has that name.
        """
        if self._tools.pop(name, None) is None:
            raise UserError(f"no tool named {name!r} is registered")

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __len__(self) -> int:
        return len(self._tools)

    @property
    def names(self) -> list[str]:
        """The registered names, in registration order."""
        return list(self._tools)

    @property
    def tools(self) -> Mapping[str, RegisteredTool]:
        """The registered tools by name (read-only view)."""
        return dict(self._tools)

    def definitions(self, *, names: Iterable[str] | None = None) -> list[ToolDefinition]:
        """What the model is told about the tools (all, or those named, in registration order).

        Raises:
            UserError: One of `names` is not registered.
        """
        if names is None:
            return [registered.definition for registered in self._tools.values()]
        wanted = set(names)
        unknown = wanted - self._tools.keys()
        if unknown:
            raise UserError(
                f"no tools named {sorted(unknown)!r} are registered; "
                f"registered: {', '.join(self._tools) or '(none)'}"
            )
        return [r.definition for n, r in self._tools.items() if n in wanted]

    # --- execution ------------------------------------------------------------------------

    async def execute(
        self,
        calls: Sequence[ToolCallRequest],
        *,
        run_id: str = "",
        environment: Environment | None = None,
        hooks: ToolHooks | None = None,
    ) -> list[ToolOutcome]:
        """Execute one turn's calls concurrently and return their outcomes in call order.

        Args:
            calls: The calls the model made.
            run_id: The run they belong to (given to tools in their `ToolContext`).
            environment: The run's environment: given to tools, and updated by the result
                handlers.
            hooks: Callbacks for these calls only, instead of the executor's `hooks` (so
                several agents can share one executor, each receiving its own calls' events).

        Never raises for anything a tool does; cancellation propagates (running tools are
        cancelled).
        """
        ran: list[_Ran | None] = [None] * len(calls)

        async def run(index: int, call: ToolCallRequest) -> None:
            ran[index] = await self._run_call(call, run_id, environment)

        # The tasks below copy the current context, so they see these calls' hooks.
        token = _CALL_HOOKS.set(hooks)
        try:
            async with asyncio.TaskGroup() as group:
                for index, call in enumerate(calls):
                    group.create_task(run(index, call))
        finally:
            _CALL_HOOKS.reset(token)
        return [
            self._finish(call, record, environment) for call, record in zip(calls, ran, strict=True)
        ]

    def _hooks(self) -> ToolHooks:
        return _CALL_HOOKS.get() or self.hooks

    async def execute_one(
        self,
        call: ToolCallRequest,
        *,
        run_id: str = "",
        environment: Environment | None = None,
    ) -> ToolOutcome:
        """Execute a single call (see `execute`)."""
        (outcome,) = await self.execute([call], run_id=run_id, environment=environment)
        return outcome

    def _finish(
        self, call: ToolCallRequest, record: _Ran | None, environment: Environment | None
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
        content, original = truncate_to_tokens(result.content, limit, self.counter)
        if content == result.content:
            return result.model_copy(update={"original_tokens": original})
        return result.model_copy(
            update={"content": content, "truncated": True, "original_tokens": original}
        )

    async def _run_call(
        self, call: ToolCallRequest, run_id: str, environment: Environment | None
    ) -> _Ran:
        await self._hook(self._hooks().call_started(call))
        try:
            record = await self._attempt(call, run_id, environment)
        except Exception as err:  # the tool boundary: a policy rule or schema bug, say
            logger.exception("running tool call %r failed inside the executor", call.name)
            message = f"the call to {call.name!r} failed before it could run: {err}"
            record = _Ran(self._error(call, message, "exception"))
        record.shown = self._truncate(record.result)
        await self._hook(self._hooks().call_finished(call, record.shown))
        return record

    async def _attempt(
        self, call: ToolCallRequest, run_id: str, environment: Environment | None
    ) -> _Ran:
        arguments = _parse_arguments(call.arguments)
        if isinstance(arguments, str):
            return _Ran(self._error(call, arguments, "invalid_json"))
        registered = self._tools.get(call.name)
        if registered is None:
            return _Ran(self._error(call, self._unknown_tool_message(call.name), "unknown_tool"))
        problems = _schema_problems(registered, arguments)
        if problems:
            return _Ran(self._error(call, problems, "invalid_arguments"))
        decision = self.policy.evaluate(registered.name, registered.policy, arguments)
        if decision.verdict == "denied":
            message = f"the call to {registered.name!r} was denied: {decision.reason}"
            return _Ran(self._error(call, message, "denied"), decision)
        approval: ApprovalResponse | None = None
        if decision.verdict == "requires_approval":
            approval = await self._ask_approval(call, registered, arguments, decision)
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
            run_id=run_id,
            environment=environment,
            progress_callback=self._progress_reporter(call),
        )
        if self._semaphore is None:
            result = await self._invoke(call, registered, arguments, context)
        else:
            async with self._semaphore:
                result = await self._invoke(call, registered, arguments, context)
        return _Ran(result, decision, approval)

    async def _invoke(
        self,
        call: ToolCallRequest,
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
        self, call: ToolCallRequest, registered: RegisteredTool, err: BaseException
    ) -> ToolResult:
        logger.warning("tool %r raised %s", registered.name, type(err).__name__, exc_info=err)
        detail = f": {err}" if str(err) else ""
        return self._error(
            call, f"tool {registered.name!r} failed with {type(err).__name__}{detail}", "exception"
        )

    async def _ask_approval(
        self,
        call: ToolCallRequest,
        registered: RegisteredTool,
        arguments: JsonObject,
        decision: PolicyDecision,
    ) -> ApprovalResponse:
        request = ApprovalRequest(
            call_id=call.id,
            tool_name=registered.name,
            arguments=arguments,
            reason=decision.reason,
            risk=registered.policy.risk,
        )
        await self._hook(self._hooks().approval_required(call, request))
        if self.approval is None:
            response = ApprovalResponse(
                approved=False, reason="it needs approval and no approver is configured"
            )
        else:
            try:
                async with asyncio.timeout(self.approval_timeout):
                    answer = await self.approval(request)
                response = (
                    answer
                    if isinstance(answer, ApprovalResponse)
                    else ApprovalResponse(approved=bool(answer))
                )
            except TimeoutError:
                response = ApprovalResponse(
                    approved=False, reason=f"no answer within {self.approval_timeout:g}s"
                )
            except Exception as err:  # an approver failure must not crash the loop
                logger.warning("the approval callback raised", exc_info=err)
                response = ApprovalResponse(
                    approved=False, reason=f"asking for approval failed ({err})"
                )
        await self._hook(self._hooks().approval_resolved(call, response))
        return response

    def _progress_reporter(
        self, call: ToolCallRequest
    ) -> Callable[[float, float | None, str | None], Awaitable[None]]:
        async def report(progress: float, total: float | None, message: str | None) -> None:
            await self._hook(self._hooks().progress(call, progress, total, message))

        return report

    @staticmethod
    async def _hook(awaitable: Awaitable[None]) -> None:
        try:
            await awaitable
        except Exception:
            logger.exception("a tool hook raised; ignoring it")

    def _error(self, call: ToolCallRequest, message: str, kind: ErrorKind) -> ToolResult:
        return ToolResult(
            content=message,
            is_error=True,
            error_kind=kind,
            call_id=call.id,
            tool_name=call.name,
        )

    def _unknown_tool_message(self, name: str) -> str:
        available = list(self._tools)
        if not available:
            return f"unknown tool {name!r}; no tools are available"
        close = difflib.get_close_matches(name, available, n=3, cutoff=0.6)
        hint = f"did you mean {' or '.join(repr(c) for c in close)}? " if close else ""
        listed = ", ".join(available[:40])
        more = f" and {len(available) - 40} more" if len(available) > 40 else ""
        return f"unknown tool {name!r}; {hint}available: {listed}{more}"


# Checking a schema against its metaschema costs milliseconds; agents are often built per
# run with the same tools, so each distinct schema is checked once per process.
_validators: dict[str, jsonschema.protocols.Validator] = {}
_MAX_CACHED_VALIDATORS = 1024


def _validator(exposed: str, parameters: JsonObject) -> jsonschema.protocols.Validator:
    """Return a validator for `parameters`, checking the schema itself first (cached)."""
    key = json.dumps(parameters, sort_keys=True, default=str)
    cached = _validators.get(key)
    if cached is not None:
        return cached
    validator_class = jsonschema.validators.validator_for(
        parameters, default=jsonschema.Draft202012Validator
    )
    try:
        validator_class.check_schema(parameters)
    except jsonschema.exceptions.SchemaError as err:
        raise ToolDefinitionError(
            f"the parameter schema of tool {exposed!r} is not a valid JSON schema: {err.message}"
        ) from err
    if parameters.get("type") != "object":
        raise ToolDefinitionError(
            f"the parameter schema of tool {exposed!r} must have type 'object', "
            f"got {parameters.get('type')!r}"
        )
    if len(_validators) >= _MAX_CACHED_VALIDATORS:
        _validators.clear()
    validator = validator_class(parameters)
    _validators[key] = validator
    return validator


def _check_limit(limit: int | None) -> None:
    if limit is not None and limit < MIN_OUTPUT_TOKENS:
        raise UserError(
            f"an output limit of {limit} tokens is too small; use at least {MIN_OUTPUT_TOKENS}"
        )


def _parse_arguments(text: str) -> JsonObject | str:
    """Parse a call's arguments; return the object, or a message saying what is wrong."""
    if not text.strip():
        return {}
    try:
        value = loads_json(text)
        if isinstance(value, str) and value.strip().startswith("{"):
            # some models encode the object twice
            value = loads_json(value)
    except json.JSONDecodeError as err:
        return (
            f"the arguments are not valid JSON ({err.msg} at line {err.lineno} column "
            f"{err.colno}); send a JSON object"
        )
    except ValueError as err:
        return f"the arguments are not valid JSON ({err}); send a JSON object"
    if not isinstance(value, dict):
        return f"the arguments must be a JSON object, got {type(value).__name__}"
    return cast(JsonObject, value)


def _schema_problems(registered: RegisteredTool, arguments: JsonObject) -> str:
    errors = sorted(
        registered.validator.iter_errors(arguments), key=lambda e: (list(e.path), e.message)
    )
    if not errors:
        return ""
    problems = []
    for error in errors[:5]:
        where = "/".join(str(part) for part in error.path)
        problems.append(f"{where}: {error.message}" if where else error.message)
    more = f" (and {len(errors) - 5} more)" if len(errors) > 5 else ""
    return (
        f"invalid arguments for tool {registered.name!r}: {'; '.join(problems)}{more}. "
        f"Expected: {_signature(registered.definition.parameters)}"
    )


def _signature(schema: JsonObject) -> str:
    properties = schema.get("properties")
    if not isinstance(properties, dict) or not properties:
        return "no arguments"
    required = schema.get("required")
    required_names = set(required) if isinstance(required, list) else set()
    definitions = schema.get("$defs")
    parts = []
    for name, spec in properties.items():
        marker = "" if name in required_names else "?"
        parts.append(f"{name}{marker}: {_type_name(spec, definitions)}")
    return "{" + ", ".join(parts) + "}"


def _type_name(spec: JsonValue, definitions: JsonValue, depth: int = 0) -> str:
    """A short type description of a property schema, for error messages."""
    if not isinstance(spec, dict) or depth > 3:
        return "any"
    ref = spec.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/$defs/") and isinstance(definitions, dict):
        return _type_name(definitions.get(ref.removeprefix("#/$defs/")), definitions, depth + 1)
    if isinstance(spec.get("enum"), list):
        return " | ".join(json.dumps(v) for v in cast(list[JsonValue], spec["enum"]))
    for key in ("anyOf", "oneOf"):
        options = spec.get(key)
        if isinstance(options, list):
            return " | ".join(_type_name(o, definitions, depth + 1) for o in options)
    kind = spec.get("type")
    if isinstance(kind, str):
        if kind == "array":
            return f"{_type_name(spec.get('items'), definitions, depth + 1)}[]"
        return kind
    if isinstance(kind, list):
        return " | ".join(str(k) for k in kind)
    return "any"
