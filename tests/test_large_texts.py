"""Large texts are counted on the tool threads, not on the event loop.

Counting a megabyte of text never seen before takes most of a second: on the event loop every
other run of the process (their streams, their leases' renewals) would wait that long. Above
`LARGE_TEXT_CHARS` the executor hands a tool result's redaction and cut to the tool threads,
and a run counts its user message there before the history counts it (a lookup then: the
counter remembers the last long text it counted); below it the hand-off would cost more than
the work, and both stay on the loop.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent_flow import AgentConfig, AgentExecutor, ContextConfig
from agent_flow._defaults import LARGE_TEXT_CHARS
from agent_flow._text import truncate_to_tokens
from agent_flow.agent import DeferredResults
from agent_flow.history import History
from agent_flow.messages import ToolCall
from agent_flow.testing import FunctionLLM, ScriptedLLM, call, reply
from agent_flow.tokens import ApproxCounter, TiktokenCounter, default_counter
from agent_flow.tools import ExternalTool, SecretRedactor, ToolExecutor, tool
from agent_flow.tools._truncation import cut_marker

SECRET = "sk-large-result-canary-0123456789"
_T = TypeVar("_T")


class _WatchedCounter(ApproxCounter):
    """Counts as `ApproxCounter`, noting the thread of every count of a text over the bound.

    While `hold` is set, a count of a large text waits for `release` (at most 10 s, then it
    goes on: a test whose loop is blocked fails on its assertions, not by hanging).
    """

    def __init__(self) -> None:
        self.large_counts_on: list[threading.Thread] = []
        self.small_counts_on: set[threading.Thread] = set()
        self.hold = False
        self.started = threading.Event()
        self.release = threading.Event()

    def count(self, text: str) -> int:
        if len(text) > LARGE_TEXT_CHARS:
            self.large_counts_on.append(threading.current_thread())
            if self.hold:
                self.started.set()
                self.release.wait(10)
        else:
            self.small_counts_on.add(threading.current_thread())
        return super().count(text)


def _executor(text: str, counter: _WatchedCounter) -> ToolExecutor:
    @tool
    def read(path: str) -> str:
        """Read a file.

        Args:
            path: The file.
        """
        return text

    return ToolExecutor(
        [read],
        counter=counter,
        secrets=SecretRedactor({"CANARY_KEY": SECRET}),
        max_output_tokens=500,
    )


def _call() -> ToolCall:
    return ToolCall(id="call_1", name="read", arguments='{"path": "big.txt"}')


def _large_text() -> str:
    line = "the quick brown fox jumps over the lazy dog " * 3 + "\n"
    body = line * (LARGE_TEXT_CHARS // len(line) + 10)
    return body[:1000] + SECRET + body[1000:] + SECRET


async def _held(counter: _WatchedCounter, work: Coroutine[Any, Any, _T]) -> _T:
    """Run `work` while `counter` holds its large count; the loop must turn meanwhile."""
    task = asyncio.create_task(work)
    # The count waits for `release`: this line runs only if the loop is free meanwhile.
    assert await asyncio.to_thread(counter.started.wait, 5), "the large text was not counted"
    ticks = 0
    for _ in range(3):
        await asyncio.sleep(0)
        ticks += 1
    assert not task.done()
    counter.release.set()
    outcome = await task
    assert ticks == 3
    return outcome


async def test_a_large_result_is_counted_off_the_event_loop_while_the_loop_runs() -> None:
    counter = _WatchedCounter()
    counter.hold = True
    executor = _executor(_large_text(), counter)
    loop_thread = threading.current_thread()
    outcome = await _held(counter, executor.execute_one(_call()))
    assert counter.large_counts_on and all(t is not loop_thread for t in counter.large_counts_on)
    # Redacted before it was cut, and cut to the limit, exactly as the loop would have.
    assert SECRET not in outcome.full_result.content
    assert SECRET not in outcome.result.content
    assert outcome.result.truncated
    assert outcome.result.original_tokens == counter.count(outcome.full_result.content)
    expected, total = truncate_to_tokens(
        outcome.full_result.content,
        500,
        ApproxCounter().count,
        marker=cut_marker,
        at_line_break=True,
    )
    assert outcome.result.content == expected
    assert outcome.result.original_tokens == total


async def test_a_small_result_is_counted_on_the_loop_with_no_hand_off() -> None:
    counter = _WatchedCounter()
    executor = _executor("a short answer " + SECRET, counter)
    outcome = await executor.execute_one(_call())
    assert counter.large_counts_on == []
    assert counter.small_counts_on == {threading.current_thread()}
    assert outcome.result.content == "a short answer [REDACTED:CANARY_KEY]"


@settings(max_examples=20, deadline=None)
@given(
    extra=st.integers(min_value=-200, max_value=200),
    secret_at=st.floats(min_value=0, max_value=1),
)
def test_either_side_of_the_bound_the_model_sees_the_same_result(
    extra: int, secret_at: float
) -> None:
    """Off the loop or on it, the shown result is the redacted text cut by the same rule."""
    filler = ("lorem ipsum dolor sit amet\n" * (LARGE_TEXT_CHARS // 27 + 20))[
        : LARGE_TEXT_CHARS + extra - len(SECRET)
    ]
    at = int(len(filler) * secret_at)
    text = filler[:at] + SECRET + filler[at:]
    counter = default_counter()
    executor = ToolExecutor(
        [], counter=counter, secrets=SecretRedactor({"CANARY_KEY": SECRET}), max_output_tokens=300
    )

    @executor.register
    @tool
    def read(path: str) -> str:
        """Read a file.

        Args:
            path: The file.
        """
        return text

    outcome = asyncio.run(executor.execute_one(_call()))
    redacted = text.replace(SECRET, "[REDACTED:CANARY_KEY]")
    assert outcome.full_result.content == redacted
    expected, total = truncate_to_tokens(
        redacted, 300, counter.count, marker=cut_marker, at_line_break=True
    )
    assert (outcome.result.content, outcome.result.original_tokens) == (expected, total)


@pytest.mark.parametrize("size", [LARGE_TEXT_CHARS, LARGE_TEXT_CHARS + 1])
async def test_the_bound_itself_stays_on_the_loop(size: int) -> None:
    counter = _WatchedCounter()
    executor = _executor("x" * size, counter)
    await executor.execute_one(_call())
    on_loop = threading.current_thread() in counter.small_counts_on
    assert bool(counter.large_counts_on) == (size > LARGE_TEXT_CHARS)
    assert on_loop == (size <= LARGE_TEXT_CHARS)


class _RecordingEncoding:
    """Wraps a counter's encoding: the thread of every count of `watched`."""

    def __init__(self, encoding: object, watched: str) -> None:
        self._encoding = encoding
        self.watched = watched
        self.threads: list[threading.Thread] = []

    def count(self, text: str) -> int:
        if text == self.watched:
            self.threads.append(threading.current_thread())
        return self._encoding.count(text)  # type: ignore[attr-defined, no-any-return]


def _agent() -> AgentExecutor:
    return AgentExecutor(
        FunctionLLM(lambda request: reply("read it"), model="gpt-4o-mini"),
        config=AgentConfig(context=ContextConfig(max_tokens=200_000)),
    )


async def test_a_large_user_message_is_counted_once_and_off_the_event_loop() -> None:
    message = "a long letter, " + _large_text()
    agent = _agent()
    counter = agent.history.counter
    assert isinstance(counter, TiktokenCounter)
    recording = _RecordingEncoding(counter._encoding, message)
    counter._encoding = recording  # type: ignore[assignment]
    outcome = await agent.run(message)
    assert outcome.stop_reason.value == "answered"
    assert len(recording.threads) == 1
    assert recording.threads[0] is not threading.current_thread()
    (entry, _) = agent.history.entries
    assert entry.content == message
    assert agent.history.token_count() > TiktokenCounter().count(message)


@pytest.mark.parametrize("stream", [False, True])
async def test_a_large_answer_and_its_thinking_are_counted_once_and_off_the_event_loop(
    stream: bool,
) -> None:
    """A long-output model's answer (or reasoning) joined the history counted on the loop."""
    answer = "a long answer, " + _large_text()
    thinking = "long thoughts, " + _large_text()
    agent = AgentExecutor(
        FunctionLLM(lambda request: reply(answer, thinking=thinking), model="gpt-4o-mini"),
        stream=stream,
        config=AgentConfig(context=ContextConfig(max_tokens=200_000)),
    )
    counter = agent.history.counter
    assert isinstance(counter, TiktokenCounter)
    for watched in (answer, thinking):
        recording = _RecordingEncoding(counter._encoding, watched)
        counter._encoding = recording  # type: ignore[assignment]
        outcome = await agent.run("write at length")
        assert outcome.final_text == answer
        assert len(recording.threads) == 1
        assert recording.threads[0] is not threading.current_thread()
        counter._encoding = recording._encoding  # type: ignore[assignment]


async def test_a_short_user_message_is_counted_on_the_loop() -> None:
    message = "add two and two"
    agent = _agent()
    counter = agent.history.counter
    assert isinstance(counter, TiktokenCounter)
    recording = _RecordingEncoding(counter._encoding, message)
    counter._encoding = recording  # type: ignore[assignment]
    await agent.run(message)
    assert recording.threads == [threading.current_thread()]


@settings(max_examples=30, deadline=None)
@given(
    texts=st.lists(
        st.sampled_from(["ab cd", "ab ce", "xy zz", "éé ab"]).map(lambda t: t * 500),
        min_size=1,
        max_size=8,
    )
)
def test_the_remembered_long_text_never_answers_for_another(texts: list[str]) -> None:
    """Long texts of one length, counted in any order: each gets its own count."""
    counter = TiktokenCounter()
    reference = counter._encoding
    for text in texts:
        assert counter.count(text) == reference.count(text)
        assert counter.count(text) == reference.count(text)


def _agent_with(counter: _WatchedCounter, seen: list[str]) -> AgentExecutor:
    def answer(request: Any) -> Any:
        seen.append(request.messages[0].content)
        return reply("read it")

    return AgentExecutor(
        FunctionLLM(answer, model="gpt-4o-mini"),
        history=History(counter=counter),
        config=AgentConfig(context=ContextConfig(max_tokens=8_000)),
    )


async def test_a_prompt_around_a_long_environment_text_is_built_off_the_event_loop() -> None:
    """Shortening it to fit counts it once per probe of the search: seconds on the loop."""
    counter = _WatchedCounter()
    seen: list[str] = []
    agent = _agent_with(counter, seen)
    agent.environment.set("/extensions/document", _large_text())
    counter.hold = True
    loop_thread = threading.current_thread()
    outcome = await _held(counter, agent.run("summarize the document"))
    assert outcome.stop_reason.value == "answered"
    assert counter.large_counts_on and all(t is not loop_thread for t in counter.large_counts_on)
    (system,) = seen
    assert "## extensions" in system and "chars]" in system  # shortened to fit, as before
    assert len(system) < len(_large_text())


async def test_a_prompt_around_short_texts_is_built_on_the_loop() -> None:
    counter = _WatchedCounter()
    seen: list[str] = []
    agent = _agent_with(counter, seen)
    agent.environment.set("/extensions/document", "a short document")
    outcome = await agent.run("summarize the document")
    assert outcome.stop_reason.value == "answered"
    assert counter.large_counts_on == []
    assert counter.small_counts_on == {threading.current_thread()}
    assert "a short document" in seen[0]


async def test_a_large_message_sent_with_answers_is_counted_once_and_off_the_event_loop() -> None:
    """`send(message, results=...)`: the message follows the answered calls' results."""
    pick = ExternalTool(
        "pick_color", "Ask the user.", {"type": "object", "properties": {}, "required": []}
    )
    llm = ScriptedLLM([reply(tool_calls=[call("pick_color", call_id="c1")]), "noted"])
    tools = ToolExecutor()
    tools.register(pick)
    agent = AgentExecutor(
        llm, tools=tools, config=AgentConfig(context=ContextConfig(max_tokens=200_000))
    )
    first = await agent.run("paint it")
    assert first.stop_reason.value == "deferred"
    message = "and here is the brief, " + _large_text()
    counter = agent.history.counter
    assert isinstance(counter, TiktokenCounter)
    recording = _RecordingEncoding(counter._encoding, message)
    counter._encoding = recording  # type: ignore[assignment]
    outcome = await agent.send(message, results=DeferredResults(calls={"c1": "red"}))
    assert outcome.final_text == "noted"
    assert len(recording.threads) == 1
    assert recording.threads[0] is not threading.current_thread()
