"""One model call of a step: the request's allowance, the stream relayed as events, retries.

`_call_model` streams (or completes) one request, relaying each chunk as an event, voiding
an abandoned attempt's output when the client retries, telling the model-call observers
(`agent_flow.llm.observers`) what only the call holds, and closing the stream however the
call ends. `_count_model_call` adds a call's usage and cost to the run (the summarizer's
calls too) and settles it against the cost limit it was admitted under (`agent._cost`).
`_checkpointed_call` is `_call_model` as a durable step when the run is durable (see
`agent_flow._checkpoints`): its record is the completion (or the model error) and the events
the call published, which a recovery publishes again, numbered as they were.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict

from agent_flow._checkpoints import checkpointed, current_step_runner
from agent_flow._unicode import Mender, is_clean, mend, mend_json
from agent_flow._utils import conforms
from agent_flow.agent._cost import _price_call, _settle
from agent_flow.config import AgentConfig
from agent_flow.errors import (
    ConfigError,
    ModelError,
    ModelResponseError,
)
from agent_flow.events import (
    AgentEvent,
    ModelOutputDiscarded,
    ModelResponded,
    ModelRetrying,
    TextDelta,
    ThinkingDelta,
    ToolCallArgumentsDelta,
    WarningRaised,
)
from agent_flow.llm.base import (
    NATIVE_FORMAT,
    RETRY_LISTENER,
    Completion,
    LLMRequest,
    RetryNotice,
    StreamEvent,
    StreamWarning,
    TextChunk,
    ThinkingChunk,
    ToolCallArgumentsChunk,
    ToolCallChunk,
    Usage,
    prompt_format_of,
)
from agent_flow.llm.metering import ModelCallReport
from agent_flow.llm.observers import MODEL_CALL_OBSERVERS, ModelCallObserver
from agent_flow.prompt import PromptBreakdown

if TYPE_CHECKING:
    from agent_flow.agent._loop import _Run


def _estimated_usage(run: _Run, prompt_tokens: int, completion: Completion) -> Usage:
    """The usage of a call the server did not report: agent_flow's own counts.

    The prompt is the one the context counted for this call; the answer is counted with
    the same counter (its text, its thinking and its tool calls as sent back next turn).
    """
    counter = run.agent.context.counter
    answer = counter.count_message(completion.to_message())
    if completion.thinking:
        answer += counter.count(completion.thinking)
    return Usage(prompt_tokens=prompt_tokens, completion_tokens=answer, estimated=True)


# A server's prompt count differs from agent_flow's by its tokenizer and chat template, so
# only a clear case is judged: tool schemas that are a large share of the counted prompt,
# of which less than half shows in a count that is otherwise about the rest of the prompt.
_TOOLS_SHARE_JUDGED = 0.3


def _tools_not_counted(run: _Run, breakdown: PromptBreakdown, usage: Usage) -> str | None:
    """A warning when the server's prompt count shows it dropped the offered tools.

    Only natively offered tools can be dropped (XML tool mode puts them in the prompt's text):
    llama-cpp-python, asked without ``tool_choice``, drops them silently, so the model never
    learns they exist. Told once per run.
    """
    if (
        run.tools_checked
        or usage.estimated
        or prompt_format_of(run.agent.llm) is not NATIVE_FORMAT
        or breakdown.tools < _TOOLS_SHARE_JUDGED * breakdown.total
        or breakdown.tools == 0
    ):
        return None
    without_tools = breakdown.total - breakdown.tools
    # Judged only when the count is about the prompt without the tools: far below even
    # that, it is no count of this prompt at all (a proxy's, a test double's).
    if not without_tools / 2 <= usage.prompt_tokens < without_tools + breakdown.tools / 2:
        return None
    run.tools_checked = True
    return (
        f"the model server counted {usage.prompt_tokens} prompt tokens, about what agent_flow "
        f"counts without the tool schemas ({without_tools} of {breakdown.total}): it seems "
        "to have dropped the tools, so the model cannot call them; set tool_choice (e.g. "
        '"auto") in the LLM config, or use tool_mode "xml"'
    )


async def _count_model_call(run: _Run, report: ModelCallReport, *, tool_calls: int = 0) -> None:
    """Count a model call in the run's usage (and so its limits), publish it, and settle it.

    The agent's own calls come from `_model_step`; the summarizer's arrive while pruning,
    through `agent_flow.llm.metering` (see `_Run._after_step`).
    """
    run.usage = run.usage + report.usage
    run.usage_per_call.append(report.usage)
    cost = _price_call(run, report)
    run.cost_per_call.append(cost)
    if cost is not None:
        run.cost_usd += cost
    await run.emit(
        ModelResponded,
        iteration=run.iteration,
        finish_reason=report.finish_reason,
        prompt_tokens=report.usage.prompt_tokens,
        completion_tokens=report.usage.completion_tokens,
        cached_tokens=report.usage.cached_tokens,
        reasoning_tokens=report.usage.reasoning_tokens,
        tool_calls=tool_calls,
        duration_ms=report.duration_ms,
        source=report.source,
        model=report.model,
        cost_usd=cost,
        estimated=report.usage.estimated,
    )
    await _settle(run, report, cost)


def _output_allowance(run: _Run, prompt_tokens: int) -> int:
    """The request's ``max_tokens``: the output reserve, capped by the configured limit.

    The prompt was budgeted to leave the reserve free, so the answer fits the window; it is
    never allowed more than the window leaves. A reserve of 0 (none set aside) allows what the
    window leaves.
    """
    context = run.agent.context
    leaves = context.max_tokens - prompt_tokens
    allowed = min(context.reserve_output_tokens or leaves, leaves)
    limit = _configured_max_tokens(run.agent.config)
    return allowed if limit is None else min(allowed, limit)


def _configured_max_tokens(config: AgentConfig) -> int | None:
    """The LLM config's ``max_tokens``, if the agent's config names an LLM that sets one."""
    if config.llm is None:
        return None
    try:
        return config.resolved_llm().max_tokens
    except ConfigError:  # the client was built elsewhere; the config's LLM part is unused
        return None


class _CallState:
    """What one model call has published so far, across its attempts."""

    def __init__(self) -> None:
        self.relayed: set[str] = set()  # warnings already published while streaming
        self.text: list[str] = []  # the text streamed by the current attempt
        # Who watches this call (`agent_flow.llm.observers`), read once; whether they were
        # told it started, and whether the current attempt's first chunk is still to come.
        self.observers: tuple[ModelCallObserver, ...] = MODEL_CALL_OBSERVERS.get()
        self.observed = False
        self.awaiting_first = True
        self.menders: dict[object, Mender] = {}  # the current attempt's, by stream (`_mended`)

    def mended(self, stream: object, piece: str) -> str:
        """`piece` of one of the attempt's streams of text, mended (`agent_flow._unicode`)."""
        if not self.menders and is_clean(piece):
            return piece
        mender = self.menders.get(stream)
        if mender is None:
            mender = self.menders[stream] = Mender()
        return mender.feed(piece)


def _observe_start(run: _Run, call: _CallState, request: LLMRequest) -> None:
    """Tell the observers the call starts (once, however many attempts it takes)."""
    if call.observed:
        return
    call.observed = True
    for observer in call.observers:
        observer.call_started(run.run_id, request, stream=run.agent.stream)


async def _retrying(run: _Run, call: _CallState, notice: RetryNotice) -> None:
    """Void what the failed attempt streamed, then announce the next attempt."""
    for observer in call.observers:
        observer.attempt_failed(run.run_id, notice)
    call.awaiting_first = True
    call.menders.clear()
    if call.text:
        await run.emit(
            ModelOutputDiscarded,
            iteration=run.iteration,
            attempt=notice.attempt,
            text="".join(call.text),
        )
        call.text.clear()
    await run.emit(
        ModelRetrying,
        iteration=run.iteration,
        attempt=notice.attempt,
        max_attempts=notice.max_attempts,
        delay=notice.delay,
        reason=notice.reason,
    )


class _ModelErrorRecord(BaseModel):
    """A model call's failure as a step records it (rebuilt as a `ModelError`)."""

    model_config = ConfigDict(frozen=True)

    type: str
    message: str
    retryable: bool
    attempts: int | None = None
    retry_after: float | None = None


class _ModelCallRecord(BaseModel):
    """What a durable model call records: its completion or its error, and its events."""

    model_config = ConfigDict(frozen=True)

    completion: Completion | None = None
    error: _ModelErrorRecord | None = None
    events: list[AgentEvent] = []


class _ReplayedModelError(ModelError):
    """A model error recorded before a crash, raised again by the recovered run."""


async def _checkpointed_call(run: _Run, request: LLMRequest, call: _CallState) -> Completion:
    """`_call_model`, as a durable step when the run has a step runner."""
    runner = current_step_runner()
    if runner is None:
        return await _call_model(run, request, call)

    live_error: ModelError | None = None

    async def work() -> str:
        nonlocal live_error
        run.captured = []
        try:
            try:
                completion = await _call_model(run, request, call)
            except ModelError as err:
                live_error = err
                failed = _ModelErrorRecord(
                    type=type(err).__name__,
                    message=str(err),
                    retryable=err.retryable,
                    attempts=err.attempts,
                    retry_after=err.retry_after,
                )
                return _ModelCallRecord(error=failed, events=run.captured).model_dump_json()
            return _ModelCallRecord(completion=completion, events=run.captured).model_dump_json()
        finally:
            run.captured = None

    raw, ran = await checkpointed(runner, "model_call", work)
    record = _ModelCallRecord.model_validate_json(raw)
    if not ran:
        # Replayed: publish the call's events again (the store keeps the ones it has), so
        # the numbering of every later event is the one the crashed process used.
        for event in record.events:
            if isinstance(event, WarningRaised):
                call.relayed.add(event.message)
            async with run.emit_lock:
                await run._publish(event.model_copy(update={"seq": run.seq}))
    if record.error is not None:
        if ran and live_error is not None:
            # Made just now: the error itself, with its type (fallbacks and reports read it).
            raise live_error
        err = _ReplayedModelError(f"{record.error.type}: {record.error.message}")
        err.retryable = record.error.retryable
        err.attempts = record.error.attempts
        err.retry_after = record.error.retry_after
        raise err
    assert record.completion is not None
    return record.completion


async def _call_model(run: _Run, request: LLMRequest, call: _CallState) -> Completion:
    if call.observers:
        _observe_start(run, call, request)
    if not run.agent.stream:

        async def retrying(notice: RetryNotice) -> None:
            await _retrying(run, call, notice)

        token = RETRY_LISTENER.set(retrying)
        try:
            answer = _mended(await run.agent.llm.complete(request))
        finally:
            RETRY_LISTENER.reset(token)
        for observer in call.observers:
            observer.call_finished(run.run_id, answer)
        return answer
    completion: Completion | None = None
    stream: AsyncIterator[StreamEvent] = run.agent.llm.stream(request)
    # However the loop leaves the stream (its end, a failure, a cancel while a subscriber
    # holds us up), it is closed now, releasing its connection, not whenever it is collected.
    async with contextlib.aclosing(_closable(stream)):
        async for delta in stream:
            completion = await _relay(run, delta, call) or completion
    if completion is None:
        raise ModelResponseError("the model's stream ended without a final answer")
    completion = _mended(completion)
    for observer in call.observers:
        observer.call_finished(run.run_id, completion)
    return completion


@runtime_checkable
class _Closable(Protocol):
    async def aclose(self) -> object: ...


class _NothingToClose:
    async def aclose(self) -> None:
        return None


def _closable(stream: AsyncIterator[StreamEvent]) -> _Closable:
    """`stream` itself when it can be closed (an async generator can), else a stand-in."""
    if conforms(stream, _Closable):  # type: ignore[type-abstract]  # see conforms
        return stream
    return _NothingToClose()


_CHUNKS = (TextChunk, ThinkingChunk, ToolCallChunk, ToolCallArgumentsChunk)


async def _relay(run: _Run, delta: StreamEvent, call: _CallState) -> Completion | None:
    """Publish one stream chunk as an event; return it if it is the final `Completion`."""
    if call.awaiting_first and isinstance(delta, _CHUNKS):
        call.awaiting_first = False
        for observer in call.observers:
            observer.first_chunk(run.run_id)
    match delta:
        case TextChunk(text=text):
            if text := call.mended(TextChunk, text):
                call.text.append(text)
                await run.emit(TextDelta, text=text)
        case ThinkingChunk(text=text):
            if text := call.mended(ThinkingChunk, text):
                await run.emit(ThinkingDelta, text=text)
        case ToolCallChunk(index=index, id=call_id, name=name):
            await run.emit(
                ToolCallArgumentsDelta,
                index=index,
                call_id=mend(call_id),
                name=mend(name),
                delta="",
            )
        case ToolCallArgumentsChunk(index=index, id=call_id, delta=text):
            if text := call.mended(index, text):
                await run.emit(
                    ToolCallArgumentsDelta,
                    index=index,
                    call_id=mend(call_id),
                    name=None,
                    delta=text,
                )
        case RetryNotice():
            await _retrying(run, call, delta)
        case StreamWarning(message=message):
            call.relayed.add(message)
            await run.emit(WarningRaised, message=message, source="model")
        case Completion():
            await _flush(run, call)
            return delta
    return None


async def _flush(run: _Run, call: _CallState) -> None:
    """Publish what the menders hold at the answer's end: a lone first half, as U+FFFD."""
    for stream, mender in call.menders.items():
        held = mender.flush()
        if not held:
            continue
        if stream is TextChunk:
            call.text.append(held)
            await run.emit(TextDelta, text=held)
        elif stream is ThinkingChunk:
            await run.emit(ThinkingDelta, text=held)
    call.menders.clear()


def _mended(completion: Completion) -> Completion:
    """`completion` with every text in it mended (`agent_flow._unicode`).

    A server's JSON escapes may carry lone surrogates, which no event, entry or store could
    write.
    """
    texts = (
        completion.text,
        completion.thinking,
        completion.raw_finish_reason or "",
        completion.model or "",
        completion.response_id or "",
        *completion.warnings,
        *(text for call in completion.tool_calls for text in (call.id, call.name, call.arguments)),
    )
    if all(map(is_clean, texts)):
        return completion
    return Completion.model_validate(mend_json(completion.model_dump(mode="json")))
