from __future__ import annotations

import asyncio
import re
from typing import Literal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent_flow.errors import DuplicateToolError, ToolDefinitionError, UserError
from agent_flow.messages import ToolCall
from agent_flow.tools import (
    MAX_TOOL_NAME_LENGTH,
    BaseTool,
    Tool,
    ToolContext,
    ToolExecutor,
    ToolHooks,
    ToolResult,
    provider_tool_name,
    tool,
)
from tests.helpers import tool_call as call
from tests.tools_helpers import NAME_RE, RecordingHooks, explode, refuse, search

# --- registry -----------------------------------------------------------------------------


def test_registering_a_duplicate_name_raises_a_clear_error() -> None:
    executor = ToolExecutor([search])
    with pytest.raises(DuplicateToolError, match="'search' is already registered"):
        executor.register(search)


def test_a_namespace_prefixes_the_name_and_avoids_the_collision() -> None:
    executor = ToolExecutor([search])
    assert executor.register(search, namespace="github") == "github_search"
    assert executor.names == ["search", "github_search"]
    assert [d.name for d in executor.definitions()] == ["search", "github_search"]
    assert executor.definitions(names=["github_search"])[0].description == "Search things."


def test_plain_functions_are_wrapped_as_tools_on_registration() -> None:
    def double(x: int) -> int:
        """Double x."""
        return 2 * x

    executor = ToolExecutor()
    assert executor.register(double) == "double"
    assert "double" in executor


def test_register_all_is_all_or_nothing() -> None:
    executor = ToolExecutor([search])

    @tool(name="search")
    def other(q: str) -> str:
        """Another search."""
        return q

    with pytest.raises(DuplicateToolError):
        executor.register_all([explode, other])
    assert executor.names == ["search"]


def test_names_with_invalid_characters_are_made_provider_safe() -> None:
    assert provider_tool_name("read.file", namespace="my server") == "my_server_read_file"


def named(name: str) -> Tool:
    @tool(name=name)
    def function(x: int) -> str:
        """Return which tool ran."""
        return f"{name} {x}"

    return function


@given(
    names=st.lists(
        st.sampled_from(["get_sum", "get.sum", "get/sum", "get sum", "get-sum"]),
        min_size=1,
        max_size=5,
        unique=True,
    ),
    one_by_one=st.booleans(),
)
def test_names_that_differ_only_in_refused_characters_are_all_registered_apart(
    names: list[str], one_by_one: bool
) -> None:
    executor = ToolExecutor()
    tools = [named(n) for n in names]
    if one_by_one:
        for item in tools:
            executor.register(item, namespace="srv")
    else:
        executor.register_all(tools, namespace="srv")
    registered = executor.tools
    assert len(registered) == len(names)
    assert all(NAME_RE.match(n) for n in registered)
    by_source = {r.source_name: n for n, r in registered.items()}
    # Whatever the order: a name that needs no change keeps it; look-alikes get a suffix.
    for name in names:
        exposed = by_source[f"srv_{name}"]
        if name in ("get_sum", "get-sum"):
            assert exposed == f"srv_{name}"
        elif "get_sum" in names:
            assert re.fullmatch(r"srv_get_sum_[0-9a-f]{8}", exposed)
        else:
            assert re.fullmatch(r"srv_get_sum(_[0-9a-f]{8})?", exposed)


async def test_a_tool_moved_by_a_look_alike_is_called_under_its_new_name() -> None:
    executor = ToolExecutor()
    first = executor.register(named("get.sum"))
    assert first == "get_sum"
    assert executor.register(named("get_sum")) == "get_sum"
    (moved,) = [n for n in executor.names if n != "get_sum"]
    assert moved.startswith("get_sum_")
    assert executor.definitions(names=[moved])[0].name == moved
    call = ToolCall(id="1", name=moved, arguments='{"x": 1}')
    assert (await executor.execute_one(call)).result.content == "get.sum 1"
    with pytest.raises(DuplicateToolError):
        executor.register(named("get.sum"))


def test_long_names_are_shortened_deterministically_and_stay_distinct() -> None:
    a = provider_tool_name("a" * 70)
    b = provider_tool_name("a" * 69 + "b")
    assert len(a) == len(b) == MAX_TOOL_NAME_LENGTH
    assert a != b
    assert a == provider_tool_name("a" * 70)
    assert a.startswith("a" * 55 + "_")


@given(
    name=st.text(min_size=1, max_size=120),
    namespace=st.one_of(st.none(), st.text(min_size=1, max_size=40)),
)
def test_every_registered_name_fits_what_providers_accept(name: str, namespace: str | None) -> None:
    assert NAME_RE.match(provider_tool_name(name, namespace=namespace))


@given(names=st.lists(st.text(alphabet="ab_", min_size=60, max_size=80), unique=True, max_size=8))
def test_distinct_long_names_never_collide(names: list[str]) -> None:
    assert len({provider_tool_name(n) for n in names}) == len(names)


def test_an_empty_name_is_rejected() -> None:
    with pytest.raises(ToolDefinitionError, match="cannot be empty"):
        provider_tool_name("")


def test_a_tool_with_an_invalid_schema_is_rejected() -> None:
    class Broken(BaseTool):
        name = "broken"
        parameters = {"type": "object", "properties": {"x": {"type": "nonsense"}}}  # noqa: RUF012

    with pytest.raises(ToolDefinitionError, match="not a valid JSON schema"):
        ToolExecutor([Broken()])


def test_a_non_object_schema_is_rejected() -> None:
    class Listy(BaseTool):
        name = "listy"
        parameters = {"type": "array"}  # noqa: RUF012

    with pytest.raises(ToolDefinitionError, match="must have type 'object'"):
        ToolExecutor([Listy()])


def test_unregister_and_unknown_definitions_raise_user_errors() -> None:
    executor = ToolExecutor([search])
    executor.unregister("search")
    assert len(executor) == 0
    with pytest.raises(UserError, match="no tool named 'search'"):
        executor.unregister("search")
    with pytest.raises(UserError, match="'nope'"):
        executor.definitions(names=["nope"])


def test_a_tiny_output_limit_is_a_usage_error() -> None:
    with pytest.raises(UserError, match="too small"):
        ToolExecutor(max_output_tokens=5)


# --- errors become results ----------------------------------------------------------------


async def test_a_successful_call_returns_content_and_data() -> None:
    outcome = await ToolExecutor([search]).execute_one(call("search", '{"query": "x", "limit": 2}'))
    result = outcome.result
    assert (result.content, result.data, result.is_error) == (
        '["x-0","x-1"]',
        ["x-0", "x-1"],
        False,
    )
    assert (result.call_id, result.tool_name) == ("1", "search")
    assert result.duration_seconds >= 0
    assert outcome.decision is not None
    assert outcome.decision.verdict == "allowed"
    message = outcome.to_message()
    assert (message.role, message.tool_call_id, message.name) == ("tool", "1", "search")


async def test_unknown_tools_get_an_error_naming_close_matches_and_the_available_tools() -> None:
    outcome = await ToolExecutor([search, explode]).execute_one(call("serach"))
    assert outcome.result.is_error
    assert outcome.result.error_kind == "unknown_tool"
    assert outcome.result.content == (
        "unknown tool 'serach'; did you mean 'search'? available: search, explode"
    )
    assert outcome.decision is None


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        ("{not json", "the arguments are not valid JSON (Expecting property name"),
        ("[1, 2]", "the arguments must be a JSON object, not a JSON array"),
    ],
)
async def test_invalid_json_arguments_become_error_results(arguments: str, expected: str) -> None:
    outcome = await ToolExecutor([search]).execute_one(call("search", arguments))
    assert outcome.result.error_kind == "invalid_json"
    assert outcome.result.content.startswith(expected)


async def test_empty_and_double_encoded_arguments_are_accepted() -> None:
    @tool
    def ping() -> str:
        """Answer pong."""
        return "pong"

    executor = ToolExecutor([ping, search])
    assert (await executor.execute_one(call("ping", ""))).result.content == "pong"
    doubled = '"{\\"query\\": \\"q\\", \\"limit\\": 1}"'
    assert (await executor.execute_one(call("search", doubled))).result.data == ["q-0"]


async def test_arguments_are_validated_against_the_schema_before_the_call() -> None:
    calls: list[int] = []

    @tool
    def pick(option: Literal["a", "b"], count: int) -> str:
        """Pick an option."""
        calls.append(count)
        return option

    outcome = await ToolExecutor([pick]).execute_one(
        call("pick", '{"option": "c", "count": "3", "extra": 1}')
    )
    assert outcome.result.error_kind == "invalid_arguments"
    assert calls == []
    assert outcome.result.content == (
        "invalid arguments for tool 'pick': Additional properties are not allowed "
        "('extra' was unexpected); count: '3' is not of type 'integer'; option: 'c' is not one "
        "of ['a', 'b']. Expected: {option: \"a\" | \"b\", count: integer}"
    )


async def test_exceptions_and_tool_errors_become_error_results() -> None:
    executor = ToolExecutor([explode, refuse])
    crashed, refused = await executor.execute(
        [
            call("explode", '{"message": "boom"}', "1"),
            call("refuse", '{"message": "use another path"}', "2"),
        ]
    )
    assert crashed.result.error_kind == "exception"
    assert crashed.result.content == "tool 'explode' failed with RuntimeError: boom"
    assert refused.result.error_kind == "tool_error"
    assert refused.result.content == "use another path"
    assert crashed.result.failed
    assert refused.result.failed


async def test_a_tool_reporting_an_error_itself_is_marked_reported() -> None:
    @tool
    def check(path: str) -> ToolResult:
        """Check a path."""
        return ToolResult(content=f"{path} is missing", is_error=True)

    outcome = await ToolExecutor([check]).execute_one(call("check", '{"path": "a"}'))
    assert outcome.result.error_kind == "reported"
    assert outcome.result.is_error
    assert not outcome.result.failed


async def test_a_tool_that_runs_past_its_timeout_is_stopped_with_an_error_result() -> None:
    stopped = asyncio.Event()

    @tool(timeout=0.05)
    async def stuck() -> str:
        """Never finish."""
        try:
            await asyncio.Event().wait()
        finally:
            stopped.set()
        return "unreachable"

    outcome = await ToolExecutor([stuck]).execute_one(call("stuck"))
    assert outcome.result.error_kind == "timeout"
    assert outcome.result.content == (
        "tool 'stuck' did not finish within 0.05s and was stopped; try a smaller request"
    )
    assert stopped.is_set()


async def test_the_default_timeout_applies_to_tools_without_their_own() -> None:
    @tool
    async def stuck() -> str:
        """Never finish."""
        await asyncio.Event().wait()
        return "unreachable"

    executor = ToolExecutor([stuck], default_timeout=0.05)
    assert (await executor.execute_one(call("stuck"))).result.error_kind == "timeout"
    executor.unregister("stuck")
    executor.register(stuck, timeout=0.01)
    outcome = await executor.execute_one(call("stuck"))
    assert "within 0.01s" in outcome.result.content


async def test_a_timeout_error_raised_by_the_tool_itself_is_an_exception_not_a_timeout() -> None:
    @tool
    async def upstream() -> str:
        """Fail like a slow upstream."""
        raise TimeoutError("upstream took too long")

    outcome = await ToolExecutor([upstream]).execute_one(call("upstream"))
    assert outcome.result.error_kind == "exception"
    assert "upstream took too long" in outcome.result.content


async def test_a_tool_that_cancels_itself_does_not_cancel_the_run() -> None:
    @tool
    async def quitter() -> str:
        """Raise CancelledError without being cancelled."""
        raise asyncio.CancelledError

    outcome = await ToolExecutor([quitter, search]).execute_one(call("quitter"))
    assert outcome.result.error_kind == "exception"
    assert outcome.result.content == "tool 'quitter' was cancelled"


# --- concurrency and cancellation ---------------------------------------------------------


async def test_calls_run_concurrently_and_results_keep_call_order() -> None:
    second_started = asyncio.Event()
    finished: list[str] = []

    @tool
    async def first() -> str:
        """Wait until the second call has started: only possible if both run at once."""
        await second_started.wait()
        finished.append("first")
        return "first"

    @tool
    async def second() -> str:
        """Start, then finish before the first."""
        second_started.set()
        finished.append("second")
        return "second"

    outcomes = await ToolExecutor([first, second]).execute(
        [call("first", call_id="a"), call("second", call_id="b")]
    )
    assert finished == ["second", "first"]
    assert [o.result.content for o in outcomes] == ["first", "second"]
    assert [o.call.id for o in outcomes] == ["a", "b"]


async def test_max_concurrency_limits_how_many_calls_run_at_once() -> None:
    running = 0
    peak = 0

    @tool
    async def busy(n: int) -> int:
        """Be busy for a few scheduler turns."""
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        for _ in range(3):
            await asyncio.sleep(0)
        running -= 1
        return n

    executor = ToolExecutor([busy], max_concurrency=2)
    outcomes = await executor.execute([call("busy", f'{{"n": {i}}}', str(i)) for i in range(6)])
    assert [o.result.data for o in outcomes] == list(range(6))
    assert peak == 2


async def test_cancelling_the_run_cancels_running_tools() -> None:
    started = asyncio.Event()
    cancelled = asyncio.Event()

    @tool
    async def long_job() -> str:
        """Run until cancelled."""
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return "unreachable"

    task = asyncio.create_task(ToolExecutor([long_job]).execute([call("long_job")]))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert cancelled.is_set()


# --- hooks --------------------------------------------------------------------------------


async def test_hooks_see_start_progress_and_finish_of_every_call() -> None:
    @tool
    async def steps(ctx: ToolContext) -> str:
        """Report progress."""
        await ctx.report_progress(1, 2, "half")
        return "done"

    hooks = RecordingHooks()
    await ToolExecutor([steps], hooks=hooks).execute(
        [call("steps", call_id="1"), call("nope", call_id="2")]
    )
    assert sorted(hooks.events) == sorted(
        [
            ("started", "1"),
            ("progress", "1", "1/2", "half"),
            ("finished", "1", "ok"),
            ("started", "2"),
            ("finished", "2", "unknown_tool"),
        ]
    )


async def test_a_hook_that_raises_changes_nothing(caplog: pytest.LogCaptureFixture) -> None:
    class BrokenHooks(ToolHooks):
        async def call_started(self, call: ToolCall) -> None:
            raise RuntimeError("hook bug")

    outcome = await ToolExecutor([search], hooks=BrokenHooks()).execute_one(
        call("search", '{"query": "q", "limit": 1}')
    )
    assert outcome.result.data == ["q-0"]
    assert "a tool hook raised" in caplog.text
