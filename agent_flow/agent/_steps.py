"""The loop's steps: what one model call and one batch of tool calls do to a `_Run`.

`_model_step` builds the prompt, calls the model (streaming its deltas as events), records
the assistant turn and decides what follows: `RunTools`, or for a plain answer a `Finish`
(a valid final answer) or `Continue` (a correction or a re-prompt). `_tool_step` executes
the calls (refusing tools the `ToolFilter` withholds), records their results, honours
loop-control tools and watches for a stuck model, returning `Continue` or `Finish`; calls it
hands to the run's caller end the run with `StopReason.DEFERRED` (`agent_flow.agent._deferred`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from agent_flow._checkpoints import current_step_runner
from agent_flow._defaults import LARGE_TEXT_CHARS
from agent_flow._types import JsonObject
from agent_flow.agent._cost import _admit_or_stop
from agent_flow.agent._deferred import route_calls
from agent_flow.agent._model_call import (
    _CallState,
    _count_model_call,
    _estimated_usage,
    _output_allowance,
    _retrying,
    _tools_not_counted,
)
from agent_flow.agent._output import (
    _call_with_format,
    _output_check,
    _response_format,
    _validate_output,
    _validate_result,
)
from agent_flow.agent.outcome import (
    Continue,
    Finish,
    RunErrorInfo,
    RunTools,
    Step,
    StopReason,
    ToolUse,
)
from agent_flow.errors import (
    ContextBudgetError,
    ModelError,
    OutputValidationError,
)
from agent_flow.events import (
    ContextBuilt,
    EnvironmentUpdated,
    PlanUpdated,
    ToolCallFailed,
    WarningRaised,
)
from agent_flow.history import (
    AgentMessage,
    AgentThinking,
    ToolCallEntry,
    ToolResultEntry,
    UserMessage,
)
from agent_flow.llm.base import (
    Completion,
    LLMRequest,
    RetryNotice,
    prompt_format_of,
)
from agent_flow.llm.metering import ModelCallPlan, ModelCallReport
from agent_flow.messages import ToolCall
from agent_flow.tokens import TiktokenCounter, TokenCounter
from agent_flow.tools import (
    ControlSignal,
    ConverseMessage,
    PlanUpdate,
    TaskCompletion,
    ToolOutcome,
    ToolResult,
    UserQuestion,
)
from agent_flow.tools._threads import tool_threads

if TYPE_CHECKING:
    from agent_flow.agent._loop import _Run

_REPROMPT = (
    "You answered without calling a tool. If the task is done, call task_completion with a "
    "summary; if you need the user, call ask_question; otherwise continue with your tools."
)

# Answers the model did not end on its own: never reported as a clean answer.
_CUT_ANSWERS = {
    "length": "the model's answer was cut at its token limit (finish reason 'length')",
    "content_filter": (
        "the provider's content filter withheld part or all of the model's answer "
        "(finish reason 'content_filter')"
    ),
}


async def _model_step(run: _Run) -> Step:
    """Steps 2-5: prompt, model call, record the turn, decide what follows."""
    tools = run.agent.offered_tools()
    # Budget the prompt as this client sends it (XML tool mode rewrites it).
    context = run.agent.context
    context.prompt_format = prompt_format_of(run.agent.llm)
    try:
        if context.environment.longest_string() > LARGE_TEXT_CHARS:
            # Shortening a text that long to fit counts it once per probe of the search: a
            # second of counting per turn, which every other run on the loop would wait.
            prompt = await tool_threads().run(context.build_prompt, tools=tools)
        else:
            prompt = context.build_prompt(tools=tools)
    except ContextBudgetError as err:
        await run._error(err, fatal=True)
        return Finish(StopReason.CONTEXT_BUDGET, text=str(err))
    await run.emit(ContextBuilt, iteration=run.iteration, breakdown=prompt.breakdown)
    allowed = _output_allowance(run, prompt.total_tokens)
    if allowed < 1:
        no_room = ContextBudgetError(
            f"the prompt fills the whole window of {run.agent.context.max_tokens} tokens and "
            "leaves the model no room to answer; set reserve_output_tokens above 0",
            part="fixed_costs",
            needed=prompt.total_tokens + 1,
            available=run.agent.context.max_tokens,
        )
        await run._error(no_room, fatal=True)
        return Finish(StopReason.CONTEXT_BUDGET, text=str(no_room))
    plan = ModelCallPlan(source="agent", prompt_tokens=prompt.total_tokens, max_tokens=allowed)
    over_budget = await _admit_or_stop(run, plan)
    if over_budget is not None:
        return over_budget
    request = LLMRequest(
        messages=prompt.messages,
        tools=prompt.tools,
        max_tokens=allowed,
        response_format=_response_format(run, _output_schema(run), tools=bool(prompt.tools)),
    )

    completion: Completion | None = None
    started = time.perf_counter()
    call = _CallState()
    attempts = run.agent.config.model_retries + 1
    for attempt in range(1, attempts + 1):
        try:
            completion = await _call_with_format(run, request, call)
            break
        except ModelError as err:
            # A client with its own retry layer (err.attempts set) has retried already.
            if not err.retryable or err.attempts is not None or attempt == attempts:
                await run._error(err, fatal=True)
                return Finish(StopReason.ERROR, text=str(err))
            await run._error(err, fatal=False)
            await _retrying(
                run, call, RetryNotice.after(err, attempt=attempt, max_attempts=attempts, delay=0.0)
            )
    assert completion is not None
    usage = completion.usage
    if usage is None:
        usage = _estimated_usage(run, prompt.total_tokens, completion)
        if not run.usage.estimated:  # once per run
            await run.emit(
                WarningRaised,
                message=(
                    "the model server reported no token usage, so agent_flow counts it itself "
                    f"({usage.prompt_tokens} prompt and {usage.completion_tokens} completion "
                    "tokens for this call, marked as estimated); token and cost limits use "
                    "these counts"
                ),
                source="model",
            )
    elif (dropped := _tools_not_counted(run, prompt.breakdown, usage)) is not None:
        await run.emit(WarningRaised, message=dropped, source="model")
    await _count_model_call(
        run,
        ModelCallReport(
            source="agent",
            usage=usage,
            finish_reason=completion.finish_reason,
            duration_ms=(time.perf_counter() - started) * 1000,
            model=completion.model,
            plan=plan,
        ),
        tool_calls=len(completion.tool_calls),
    )
    for warning in completion.warnings:
        if warning not in call.relayed:
            await run.emit(WarningRaised, message=warning, source="model")

    await _record_turn(run, completion)
    if completion.finish_reason in _CUT_ANSWERS:
        await run.emit(
            WarningRaised, message=_CUT_ANSWERS[completion.finish_reason], source="model"
        )
    if completion.tool_calls:
        return RunTools(completion.tool_calls)
    return await _text_answer(run, completion.text)


async def _record_turn(run: _Run, completion: Completion) -> None:
    history = run.agent.history
    if completion.thinking:
        await _count_ahead(history.counter, completion.thinking)
        history.add(AgentThinking(content=completion.thinking))
    if completion.text:
        await _count_ahead(history.counter, completion.text)
        history.add(AgentMessage(content=completion.text))
    for call in completion.tool_calls:
        history.add(
            ToolCallEntry(
                call=call if call.name else call.model_copy(update={"name": _call_name(call.name)})
            )
        )


def _output_schema(run: _Run) -> JsonObject | None:
    if run.agent.output_type is not None:
        return run.agent.output_type.model_json_schema()
    return run.agent.config.output_schema


async def _correct(run: _Run, problem: str, *, answer: str, text: str, again: str | None) -> Step:
    """Ask for a correction of an `answer` that missed the output schema, or give up.

    Corrections are bounded (``max_output_retries``); then the run ends as OUTPUT_INVALID
    with `text` as its final text. `again` is the request added as a user message (None: the
    model was told already, in the refused call's result).
    """
    if run.output_retries >= run.agent.config.max_output_retries:
        err = OutputValidationError(
            f"the final answer did not match the output schema after "
            f"{run.output_retries} correction(s): {problem}",
            last_answer=answer,
            problems=problem,
        )
        await run._error(err, fatal=True)
        return Finish(StopReason.OUTPUT_INVALID, text=text)
    run.output_retries += 1
    if again is not None:
        run.agent.history.add(UserMessage(content=f"{problem}\n{again}"))
    return Continue()


async def _text_answer(run: _Run, text: str) -> Step:
    """Step 5: an answer without tool calls."""
    schema = _output_schema(run)
    if schema is not None:
        output, problem = _validate_output(text, schema, run.agent.output_type)
        if problem is None:
            return Finish(StopReason.COMPLETED, text=text, output=output)
        return await _correct(
            run,
            f"Your answer does not match the required output schema: {problem}",
            answer=text,
            text=text,
            again="Answer again with only a JSON value that matches this schema:\n"
            f"{json.dumps(schema)}",
        )
    if (
        run.agent.config.on_text_answer == "reprompt"
        and run.reprompts < run.agent.config.max_reprompts
    ):
        run.reprompts += 1
        run.agent.history.add(UserMessage(content=_REPROMPT))
        return Continue()
    return Finish(StopReason.ANSWERED, text=text)


async def _record_sequence(run: _Run) -> None:
    """In a durable run, record where a turn's tool calls left the run's event sequence.

    A delegated child's events take numbers from the run's sequence (`_Run.forward`), and a
    recovery that replays the child's recorded result publishes none of them (nor does it
    know how many a timed-out or failed child took): the recovered run takes the recorded
    number, so the events after the turn keep the numbers they were stored under.
    """
    runner = current_step_runner()
    if runner is None:
        return
    seq = run.seq

    async def where() -> str:
        return str(seq)

    recorded = await runner.step("tool_turn_events", where)
    run.seq = max(run.seq, int(recorded))


async def _tool_step(run: _Run, step: RunTools) -> Step:
    """Steps 6-8: execute the calls, apply handlers, record results, honour control."""
    requests = step.calls
    # Unknown names go to the executor, which tells the model what exists; registered
    # tools the agent may not use now (deny list, skill) are refused here.
    gate = run.agent._tool_filter()
    limit = run.agent.config.max_tool_calls_per_turn
    refused = {
        r.id: _refusal(run, r)
        for r in requests[:limit]
        if r.name in run.agent.tools and not gate.allows(r.name)
    }
    refused |= {r.id: _one_too_many(r, len(requests), limit) for r in requests[limit:]}
    if len(requests) > limit:
        await run.emit(
            WarningRaised,
            message=f"the model asked for {len(requests)} tool calls in one answer; the first "
            f"{limit} ran (max_tool_calls_per_turn), the rest were answered with an error",
            source="loop",
        )
    allowed = [r for r in requests if r.id not in refused]
    version_before = run.agent.environment.version
    schema = _output_schema(run)
    # Calls handed to the caller, and the caller's answers to earlier ones (`_deferred`).
    routed = await route_calls(run, allowed)
    outcomes = {
        o.call.id: o
        for o in await run.agent.tools.execute(
            routed.execute,
            run_id=run.run_id,
            environment=run.agent.environment,
            hooks=run.agent._hooks,
            approval=routed.approval or run.agent.approval,
            output=_output_check(schema, run.agent.output_type) if schema is not None else None,
        )
    }
    outcomes.update(routed.outcomes)

    control: ControlSignal | None = None
    for request in requests:
        if request.id in routed.handed:
            continue  # stays open in the history until the caller answers it
        outcome = outcomes.get(request.id)
        result = outcome.result if outcome is not None else refused[request.id]
        if outcome is None:
            await run.emit(
                ToolCallFailed,
                call_id=request.id,
                name=request.name,
                error=result.content,
                duration_ms=0.0,
                error_kind=result.error_kind,
            )
        else:
            for problem in outcome.handler_errors:
                await run.emit(
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
        run.agent.history.add(
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
        # A refused task_completion is an error result that still signals: a correction.
        refused_completion = _refused(result.control)
        if result.control is not None and (not result.is_error or refused_completion):
            if isinstance(result.control, PlanUpdate):
                await run.emit(
                    PlanUpdated,
                    plan=result.control.plan,
                    current_step=result.control.current_step,
                )
            elif control is None or (_refused(control) and not refused_completion):
                control = result.control  # the first signal; a refused completion gives way

    changes = run.agent.environment.changes(since_version=version_before)
    if changes:
        await run.emit(
            EnvironmentUpdated,
            source=", ".join(sorted({r.name for r in requests})),
            version=run.agent.environment.version,
            changes=tuple(changes),
        )
    if routed.execute:
        await _record_sequence(run)  # the turn's results are in the history and the outcome
    if routed.handed:
        return Finish(StopReason.DEFERRED, deferred=tuple(routed.handed.values()))
    if control is not None:
        return await _control(run, control)
    return await _check_stuck(run, requests, outcomes)


def _refused(control: ControlSignal | None) -> bool:
    """Whether `control` is a ``task_completion`` its tool refused (the result did not fit)."""
    return isinstance(control, TaskCompletion) and control.problem is not None


def _refusal(run: _Run, request: ToolCall) -> ToolResult:
    where = (
        f"while skill {run.agent.skill.name!r} is active" if run.agent.skill else "to this agent"
    )
    offered = ", ".join(d.name for d in run.agent.offered_tools()) or "none"
    return _denied(request, f"tool {request.name!r} is not available {where}; available: {offered}")


def _one_too_many(request: ToolCall, count: int, limit: int) -> ToolResult:
    return _denied(
        request,
        f"the answer asked for {count} tool calls and at most {limit} run in one turn "
        f"(max_tool_calls_per_turn), so this call to {request.name!r} did not run; "
        "ask for it again, with fewer calls at a time",
    )


def _denied(request: ToolCall, message: str) -> ToolResult:
    """The result of `request`, refused before it ran: `message` says why."""
    return ToolResult(
        content=message,
        is_error=True,
        error_kind="denied",
        call_id=request.id,
        tool_name=request.name,
    )


async def _control(run: _Run, control: ControlSignal) -> Step:
    match control:
        case TaskCompletion(summary=summary, problem=str(refused)):
            # Refused by the tool itself, which told the model why: count the correction.
            answer = summary if control.result is None else json.dumps(control.result)
            return await _correct(run, refused, answer=answer, text=summary, again=None)
        case TaskCompletion(summary=summary, result=result):
            schema = _output_schema(run)
            if schema is not None:
                # The same schema as a text answer: `output_type` holds however the run ends.
                result, problem = _validate_result(result, summary, schema, run.agent.output_type)
                if problem is not None:
                    return await _correct(
                        run,
                        "The result of your task_completion call does not match the required "
                        f"output schema: {problem}",
                        answer=summary if control.result is None else json.dumps(control.result),
                        text=summary,
                        again="Call task_completion again with a result that matches this "
                        f"schema:\n{json.dumps(schema)}",
                    )
            # /task/status is set (and announced) by the run's end: `settle_task`.
            return Finish(StopReason.COMPLETED, text=summary, output=result)
        case UserQuestion(question=question):
            return Finish(StopReason.WAITING_FOR_USER, text=question)
        case ConverseMessage(message=message):
            return Finish(StopReason.CONVERSE, text=message)
        case PlanUpdate():  # pragma: no cover - plan updates never end the loop
            raise AssertionError("a plan update does not end the loop")


async def _check_stuck(
    run: _Run, requests: Sequence[ToolCall], outcomes: dict[str, ToolOutcome]
) -> Step:
    signature = tuple(
        (r.name, r.arguments, outcomes[r.id].result.content if r.id in outcomes else "")
        for r in requests
    )
    run.repeats = run.repeats + 1 if signature == run.last_signature else 1
    run.last_signature = signature
    threshold = run.agent.config.stuck_threshold
    if run.repeats >= 2 * threshold:
        await run.emit(
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
        run.agent.history.add(UserMessage(content=note))
        await run.emit(WarningRaised, message=note, source="loop")
    return Continue()


def _call_name(name: str) -> str:
    """The name a call is recorded under; a call the model left nameless is "unknown"."""
    return name or "unknown"


async def _count_ahead(counter: TokenCounter, text: str) -> None:
    """Count a large `text` on the tool threads before the history counts it on the loop.

    Counting a megabyte of new text takes most of a second, which every other run on the
    event loop would wait; `TiktokenCounter` remembers the last long text it counted, so the
    history's count is then a lookup. Other counters are fast or their own (not done twice).
    """
    if len(text) > LARGE_TEXT_CHARS and isinstance(counter, TiktokenCounter):
        await tool_threads().run(counter.count, text)
