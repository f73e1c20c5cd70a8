"""Invariant checkers: what every prompt, pruned history and rendered environment must satisfy.

Call them in your own tests, on whatever your code produced — a prompt your `ContextManager`
setup built, the units your `PruningStrategy` kept, the environment your handler or extension
wrote. Each raises `AssertionError` with a message that names what broke, so pytest (and
hypothesis, when shrinking) shows the smallest failing case. They need nothing but agent_flow;
the hypothesis strategies that feed them are in `agent_flow.testing.strategies`.

What each guarantees, and the provider error it prevents:

- `assert_prompt_within_budget`: the prompt, counted as the client sends it, is exactly what
  the prompt claims (``total_tokens``, and its breakdown adds up) and leaves the output
  reserve free. Prevents HTTP 400 ``context_length_exceeded`` ("This model's maximum context
  length is N tokens. However, your messages resulted in M tokens", OpenAI; "prompt is too
  long", Anthropic), the silent cut of the prompt's oldest tokens by local servers (llama.cpp,
  Ollama truncate to ``n_ctx``, losing the system message first), and answers cut short with
  ``finish_reason="length"`` because the prompt ate the room meant for them.
- `assert_units_intact`: every assistant tool call is answered by a tool message right after
  it, and every tool message answers a call of the assistant message before it — as strict
  providers check. Prevents HTTP 400 "An assistant message with 'tool_calls' must be
  followed by tool messages responding to each 'tool_call_id'" and "messages with role
  'tool' must be a response to a preceding message with 'tool_calls'" (OpenAI and compatible
  servers), and "tool_use ids were found without tool_result blocks immediately after"
  (Anthropic).
- `assert_pinned_kept`: the first user message and every summary survive pruning (a summary
  may instead be folded into the new summary that replaces it) and keep their order; given a
  prompt, they are all sent. Prevents the prompt that starts with an assistant turn or holds
  no user message at all — refused by APIs and chat templates that want a user turn first
  ("first message must use the 'user' role", "No user query found in messages") — and, with
  every provider, a model that no longer sees the task it was given.
- `assert_render_within`: `Environment.render` stays within its token budget, every block is
  ``## <section>`` plus one line of valid JSON (or a one-line "omitted" marker), nothing is
  degraded when the whole environment fits, and rendering changes nothing. The environment
  is part of the system message, so an overrun there is a ``context_length_exceeded`` as
  above; a block cut mid-JSON would have the model misread the state.

Two more run your code themselves and check it against its contract, on its own:

- `assert_strategy_within_budget` runs a `PruningStrategy` and checks everything the
  protocol promises: within the budget whenever the pinned units fit, a truthful report,
  whole units, pinned units kept, order kept, nothing changed when the units already fit.
  Test a strategy so, not only through a `ContextManager`: the manager prunes to a target
  below its budget and then selects what fits, so it hides a strategy that misses its
  budget (the overrun shows up only in the prompts of budgets near the edge, in production).
- `assert_handlers_apply` applies result handlers to a result and fails on the first
  handler that raised: a handler that writes a value of the wrong type into a typed
  extension (`Environment.register_extension`) raises at the write, which in a run is only
  a warning while the environment silently misses the update.

Every message names the invariant, the step that broke it (the strategy and its budget, the
handler and its call) and the case (the units, by kind and size), so a shrunk failing example
reads on its own.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from typing import Final

from agent_flow.context import ContextManager
from agent_flow.environment import Environment
from agent_flow.history import (
    History,
    HistoryEntry,
    PruneReport,
    PruneResult,
    PruningStrategy,
    Unit,
)
from agent_flow.history.entries import ToolCallEntry, ToolResultEntry
from agent_flow.llm.base import NATIVE_FORMAT
from agent_flow.messages import ChatMessage, ToolCall
from agent_flow.prompt import Prompt
from agent_flow.tokens import TokenCounter
from agent_flow.tools.handlers import HandlerRegistry, HandlerReport
from agent_flow.tools.results import ToolResult

__all__ = [
    "assert_handlers_apply",
    "assert_pinned_kept",
    "assert_prompt_within_budget",
    "assert_render_within",
    "assert_strategy_within_budget",
    "assert_units_intact",
]

# Large enough that an environment never degrades when only its full size is wanted.
_UNBOUNDED: Final = 1 << 40

_BLOCK_HEADER: Final = re.compile(r"## (system|task|knowledge|workspace|extensions)")
_DROPPED_MARKER: Final = re.compile(
    r"## (system|task|knowledge|workspace|extensions): omitted to fit the token budget"
)


def assert_prompt_within_budget(prompt: Prompt, manager: ContextManager) -> None:
    """Check that `prompt`, as `manager`'s client sends it, fits the budget and is counted right.

    Recounts the prompt independently: renders it with the manager's prompt format (XML tool
    mode rewrites it), counts messages and tool schemas with the manager's counter, and
    compares with ``prompt.total_tokens``, the breakdown's sum, and ``max_tokens -
    reserve_output_tokens``.

    Args:
        prompt: What ``manager.build_prompt(...)`` returned.
        manager: The `ContextManager` that built it.

    Raises:
        AssertionError: The prompt exceeds the budget, or its counts are not what it says.
    """
    fmt = manager.prompt_format if manager.prompt_format is not None else NATIVE_FORMAT
    messages, tools = fmt.render(prompt.messages, prompt.tools)
    counter = manager.counter
    recount = counter.count_messages(messages) + counter.count_tools(tools)
    available = manager.max_tokens - manager.reserve_output_tokens
    if recount > available:
        raise AssertionError(
            f"the prompt as sent ({fmt.name}) counts {recount} tokens with {counter.name}, "
            f"over the {available} the budget leaves (max_tokens {manager.max_tokens} minus "
            f"reserve {manager.reserve_output_tokens}): the provider would refuse it as too "
            "long (context_length_exceeded) or cut it"
        )
    if recount != prompt.total_tokens:
        raise AssertionError(
            f"the prompt says it is {prompt.total_tokens} tokens but counts {recount} as sent "
            f"({fmt.name}, {counter.name}): its budgeting is off by "
            f"{recount - prompt.total_tokens}"
        )
    b = prompt.breakdown
    parts = b.system_template + b.environment + b.tools + b.history + b.priming
    if parts != b.total or b.total != prompt.total_tokens:
        raise AssertionError(
            f"the breakdown's parts add up to {parts} and its total is {b.total}, but the "
            f"prompt is {prompt.total_tokens} tokens: {b!r}"
        )
    if b.budget != manager.max_tokens or b.reserve != manager.reserve_output_tokens:
        raise AssertionError(
            f"the breakdown names budget {b.budget} and reserve {b.reserve}, but the manager's "
            f"are {manager.max_tokens} and {manager.reserve_output_tokens}"
        )


def _messages_of(
    target: Prompt | History | PruneResult | Iterable[ChatMessage] | Iterable[Unit],
) -> list[ChatMessage]:
    if isinstance(target, Prompt):
        return list(target.messages)
    if isinstance(target, History):
        return target.to_messages()
    if isinstance(target, PruneResult):
        return [m for unit in target.units for m in unit.messages]
    messages: list[ChatMessage] = []
    for item in target:
        if isinstance(item, Unit):
            messages.extend(item.messages)
        else:
            messages.append(item)
    return messages


def _units_of(target: object) -> Sequence[Unit] | None:
    if isinstance(target, History):
        return target.units()
    if isinstance(target, PruneResult):
        return target.units
    if isinstance(target, list | tuple) and target and all(isinstance(u, Unit) for u in target):
        return target
    return None


def _check_unit_entries(units: Sequence[Unit]) -> None:
    """Each result answers a call of its own unit, once; each unit sends only answered calls."""
    for index, unit in enumerate(units):
        calls = {e.call_id for e in unit.entries if isinstance(e, ToolCallEntry)}
        answered: set[str] = set()
        for entry in unit.entries:
            if not isinstance(entry, ToolResultEntry):
                continue
            if entry.call_id not in calls:
                raise AssertionError(
                    f"unit {index} holds the result {entry.id!r} of call {entry.call_id!r}, "
                    "which is not a call of that unit: a result without its call"
                )
            if entry.call_id in answered:
                raise AssertionError(
                    f"unit {index} answers call {entry.call_id!r} twice (result {entry.id!r})"
                )
            answered.add(entry.call_id)
        sent = {c.id for m in unit.messages for c in m.tool_calls}
        if sent - answered:
            raise AssertionError(
                f"unit {index} sends calls {sorted(sent - answered)} that have no result in it: "
                "a tool call without its result"
            )


def assert_units_intact(
    target: Prompt | History | PruneResult | Iterable[ChatMessage] | Iterable[Unit],
) -> None:
    """Check that no tool call goes without its result, and no result without its call.

    The rule strict providers enforce on the messages sent: an assistant message's tool calls
    (unique ids) are answered by tool messages that follow it directly, one per call, before
    any other message; a tool message answers a call of the assistant message just before.
    For a `History`, a `PruneResult` or units, each unit's entries are checked too: every
    result answers a call of its own unit, once.

    Args:
        target: A prompt, a history, a strategy's result, units, or messages.

    Raises:
        AssertionError: A call without its result, or a result without its call (the message
            names the call id and the position).
    """
    units = _units_of(target)
    if units is not None:
        _check_unit_entries(units)
    expected: set[str] = set()
    owner = -1
    for position, message in enumerate(_messages_of(target)):
        if message.role == "tool":
            if message.tool_call_id not in expected:
                raise AssertionError(
                    f"message {position} is the result of call {message.tool_call_id!r}, which "
                    "no assistant message just before it made (or it was answered already): a "
                    "tool result without its call"
                )
            expected.discard(message.tool_call_id)
            continue
        if expected:
            raise AssertionError(
                f"the tool calls {sorted(expected)} of message {owner} are not answered before "
                f"message {position} ({message.role}): a tool call without its result"
            )
        ids = [call.id for call in message.tool_calls]
        if ids and message.role != "assistant":
            raise AssertionError(f"message {position} is a {message.role} message with calls")
        if len(set(ids)) != len(ids):
            raise AssertionError(f"message {position} repeats a call id: {ids}")
        expected, owner = set(ids), position
    if expected:
        raise AssertionError(
            f"the tool calls {sorted(expected)} of message {owner} are never answered: a tool "
            "call without its result"
        )


def _find_in_order(sent: Sequence[ChatMessage], wanted: Sequence[ChatMessage]) -> int | None:
    """Return the index in `wanted` of the first message not found in `sent` in order."""
    position = 0
    for index, message in enumerate(wanted):
        while position < len(sent) and sent[position] != message:
            position += 1
        if position == len(sent):
            return index
        position += 1
    return None


def assert_pinned_kept(
    before: History | Sequence[Unit],
    after: PruneResult | History | Sequence[Unit] | Prompt,
    *,
    report: PruneReport | None = None,
) -> None:
    """Check that pruning (or prompt building) kept the pinned units, unchanged and in order.

    Pinned are the first user message and every summary. After pruning each is still there
    with the same entries, except a summary folded into the new one (its id among the
    report's ``summarized``, and the report's ``summary_id`` present). Given a prompt, every
    message of every pinned unit is sent, in order.

    Args:
        before: The units before (take ``tuple(history.units())`` before pruning in place).
        after: What pruning left (a `PruneResult`, a `History`, units), or a built `Prompt`.
        report: The pruning's report (taken from `after` when it is a `PruneResult`).

    Raises:
        AssertionError: A pinned entry was dropped, changed or moved.
    """
    units = before.units() if isinstance(before, History) else before
    pinned = [u for u in units if u.pinned]
    if isinstance(after, Prompt):
        wanted = [m for unit in pinned for m in unit.messages]
        missing = _find_in_order(after.messages, wanted)
        if missing is not None:
            raise AssertionError(
                f"the prompt does not send the pinned message {wanted[missing].content[:80]!r} "
                "(first user message or summary) in its place"
            )
        return
    if isinstance(after, PruneResult):
        report = report if report is not None else after.report
        after_units: Sequence[Unit] = after.units
    else:
        after_units = after.units() if isinstance(after, History) else after
    kept: dict[str, HistoryEntry] = {e.id: e for u in after_units for e in u.entries}
    order = {entry_id: i for i, entry_id in enumerate(kept)}
    positions: list[int] = []
    for unit in pinned:
        folded = (
            report is not None
            and unit.kind == "summary"
            and unit.entries[0].id in report.summarized
            and report.summary_id in kept
        )
        if folded:
            continue
        for entry in unit.entries:
            if entry.id not in kept:
                what = "first user message" if unit.kind == "user" else "summary"
                raise AssertionError(f"the pinned {what} {entry.id!r} was dropped")
            if kept[entry.id] != entry:
                raise AssertionError(f"the pinned entry {entry.id!r} was changed")
            positions.append(order[entry.id])
    if positions != sorted(positions):
        raise AssertionError("the pinned entries are no longer in their original order")


def assert_render_within(environment: Environment, max_tokens: int, counter: TokenCounter) -> None:
    """Check that `environment` renders within `max_tokens`, well formed, without loss to spare.

    Renders it at `max_tokens` and checks: the count is within the budget; each block is
    ``## <section>`` and one line of valid JSON, or a one-line "omitted" marker; the text is
    the whole environment whenever that fits; rendering changed nothing (same version).

    Args:
        environment: The environment, as your handler, extension or code left it.
        max_tokens: The budget (the environment's share of a prompt).
        counter: The token counter the agent uses.

    Raises:
        AssertionError: The rendering is over budget, malformed, needlessly degraded, or
            changed the environment.
    """
    version = environment.version
    text = environment.render(max_tokens, counter)
    tokens = counter.count(text)
    if tokens > max_tokens:
        raise AssertionError(
            f"the environment renders as {tokens} tokens ({counter.name}), over its budget of "
            f"{max_tokens}"
        )
    for block in text.split("\n\n") if text else []:
        header, _, body = block.partition("\n")
        if not body:
            if not _DROPPED_MARKER.fullmatch(header):
                raise AssertionError(f"a rendered block is not a section or a marker: {block!r}")
            continue
        if not _BLOCK_HEADER.fullmatch(header) or "\n" in body:
            raise AssertionError(f"a rendered block is not '## <section>' + one line: {block!r}")
        try:
            json.loads(body)
        except ValueError as err:
            raise AssertionError(f"the {header} block is not valid JSON ({err}): {body!r}") from err
    full = environment.render(_UNBOUNDED, counter)
    if text != full and counter.count(full) <= max_tokens:
        raise AssertionError(
            f"the whole environment ({counter.count(full)} tokens) fits {max_tokens}, yet the "
            "rendering degraded it"
        )
    if environment.version != version:
        raise AssertionError("rendering the environment changed it")


# -- a strategy on its own -------------------------------------------------------------------

#: Units listed in a failure message; a shrunk case has a few.
_SHOWN_UNITS: Final = 12


def _describe_units(units: Sequence[Unit]) -> str:
    """Units in one line, by kind and size: ``[u0 user 9t pinned, u1 assistant 41t 2 calls]``."""
    parts = []
    for index, unit in enumerate(units[:_SHOWN_UNITS]):
        calls = sum(isinstance(e, ToolCallEntry) for e in unit.entries)
        text = f"u{index} {unit.kind} {unit.tokens}t"
        if unit.pinned:
            text += " pinned"
        if calls:
            text += f" {calls} call{'s' if calls > 1 else ''}"
        parts.append(text)
    more = len(units) - _SHOWN_UNITS
    return "[" + ", ".join(parts) + (f", +{more} more" if more > 0 else "") + "]"


def assert_strategy_within_budget(
    strategy: PruningStrategy,
    units: Sequence[Unit],
    max_tokens: int,
    counter: TokenCounter,
    *,
    drops_to_fit: bool = True,
) -> PruneResult:
    """Run `strategy` on `units` and check what the `PruningStrategy` protocol promises.

    Checked, in order: the report is truthful (its budget, its counts before and after, and
    ``fits``); each kept unit counts what its messages cost; nothing changes when the units
    already fit; whole units (`assert_units_intact`); pinned units kept in place
    (`assert_pinned_kept`); kept units in their order; and, with `drops_to_fit`, the result
    fits whenever the pinned units alone do.

    Draw the budget with `agent_flow.testing.strategies.budgets_around`, which puts a third of
    its budgets one token either side of the sizes a strategy's choices flip at: an
    off-by-one in a strategy shows there, and almost nowhere else.

    Args:
        strategy: Your strategy.
        units: The units to prune (``build_units(entries, counter)``, ``history.units()``).
        max_tokens: The budget.
        counter: The counter the units were counted with.
        drops_to_fit: Whether the strategy promises to reach any budget the pinned units fit
            in, as `DropOldest` and chains ending in it do; pass False for strategies that
            only elide or keep a window.

    Returns:
        The strategy's result.

    Raises:
        AssertionError: A promise is broken; the message names it, the strategy and budget,
            and the case.
    """
    result = strategy.prune(units, max_tokens, counter)
    name = getattr(strategy, "name", type(strategy).__name__)
    where = f"{name}.prune(units, max_tokens={max_tokens})"

    def broken(invariant: str, detail: str) -> AssertionError:
        return AssertionError(
            f"invariant broken, {invariant}: {detail}; step: {where}; case: budget {max_tokens}"
            f" for {_describe_units(units)}, kept {_describe_units(result.units)}"
        )

    before = sum(u.tokens for u in units)
    after = sum(u.tokens for u in result.units)
    report = result.report
    if (report.max_tokens, report.tokens_before, report.tokens_after) != (
        max_tokens,
        before,
        after,
    ):
        raise broken(
            "a truthful report",
            f"it reports budget {report.max_tokens}, {report.tokens_before} tokens before and "
            f"{report.tokens_after} after, but the budget is {max_tokens} and the units count "
            f"{before} before and {after} after",
        )
    if report.fits != (after <= max_tokens):
        detail = f"fits={report.fits} for {after} tokens in a budget of {max_tokens}"
        raise broken("a truthful report", detail)
    for index, unit in enumerate(result.units):
        cost = sum(counter.count_message(m) for m in unit.messages)
        if cost != unit.tokens:
            raise broken(
                "kept units count their messages",
                f"kept unit {index} says {unit.tokens} tokens but its messages cost {cost} "
                f"({counter.name}): the budget would be checked against the wrong size",
            )
    if before <= max_tokens and tuple(result.units) != tuple(units):
        raise broken("nothing changes when the units already fit", f"they count {before}")
    try:
        assert_units_intact(result)
    except AssertionError as err:
        raise broken("whole units", str(err)) from err
    try:
        assert_pinned_kept(units, result)
    except AssertionError as err:
        raise broken("pinned units kept", str(err)) from err
    positions = {e.id: i for i, u in enumerate(units) for e in u.entries}
    kept = [positions[e.id] for u in result.units for e in u.entries if e.id in positions]
    if kept != sorted(kept):
        raise broken("order kept", "kept entries come out in another order than they went in")
    pinned = sum(u.tokens for u in units if u.pinned)
    if drops_to_fit and pinned <= max_tokens < after:
        raise broken(
            "within the budget whenever the pinned units fit",
            f"it kept {after} tokens, {after - max_tokens} over, though the pinned units alone "
            f"take {pinned}",
        )
    return result


def assert_handlers_apply(
    handlers: HandlerRegistry, environment: Environment, call: ToolCall, result: ToolResult
) -> HandlerReport:
    """Apply `handlers` to one result and check that none of them raised.

    In a run a raising handler costs only a warning (the model still gets the result), so a
    handler that writes the wrong type into a typed extension, or into a typed section, goes
    unnoticed while the environment misses its update. Here it fails. Check the environment
    afterwards with `assert_render_within`.

    Args:
        handlers: The registry (``agent.handlers``, or one with just your handler).
        environment: The environment to update (drawn with ``environments(extensions=...)``
            so that your extension models are registered).
        call: The call the result answers.
        result: The result.

    Returns:
        What the handlers did.

    Raises:
        AssertionError: A handler raised; the message names it, the call and the error.
    """
    report = handlers.apply(environment, call, result)
    if report.errors:
        error = report.errors[0]
        raise AssertionError(
            "invariant broken, handlers leave the environment valid: result handler "
            f"{error.handler} (pattern {error.pattern!r}) raised {error.error_type}: "
            f"{error.message}; step: its result of call {error.call_id!r} to "
            f"{error.tool_name!r}; case: {_brief_result(result)}"
        )
    return report


def _brief_result(result: ToolResult) -> str:
    data = json.dumps(result.data, ensure_ascii=False) if result.data is not None else None
    text = data if data is not None else result.content
    return f"data {text[:200]!r}{'…' if len(text) > 200 else ''}"
