"""The threads sync tools run on (`agent_flow.tools._threads`): one while calls are quick,
more while one blocks; every call gets its own outcome, in its caller's context."""

from __future__ import annotations

import asyncio
import contextvars
import multiprocessing
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent_flow.testing import FunctionLLM, call, reply
from agent_flow.tools import ToolExecutor, tool
from agent_flow.tools._threads import ToolThreads, tool_threads

WHO = contextvars.ContextVar("who", default="nobody")
ROOT = Path(__file__).resolve().parents[1]


async def test_quick_calls_from_many_runs_at_once_share_one_thread() -> None:
    """200 calls at once, each quick: one thread takes them all (more would only fight the
    event loop for the GIL)."""
    pool = ToolThreads()
    results = await asyncio.gather(*(pool.run(lambda n=n: n * 2) for n in range(200)))
    assert results == [n * 2 for n in range(200)]
    assert pool.threads == 1


async def test_a_blocking_call_does_not_hold_up_the_others_and_spare_threads_leave() -> None:
    pool = ToolThreads(patience=0.02, linger=0.3)
    release = threading.Event()
    blocked = asyncio.ensure_future(pool.run(release.wait, 10))
    await asyncio.sleep(0.05)  # it is inside its call
    started = time.monotonic()
    quick = await asyncio.wait_for(asyncio.gather(*(pool.run(abs, -n) for n in range(20))), 5)
    assert quick == list(range(20))
    assert time.monotonic() - started < 2.0  # not behind the blocked call (10 s)
    assert pool.threads == 2
    release.set()
    assert await blocked is True
    for _ in range(100):
        if pool.threads == 1:
            break
        await asyncio.sleep(0.05)
    assert pool.threads == 1  # the spare left after `linger`; the first stays


async def test_a_look_lost_with_a_closed_loop_is_replaced() -> None:
    """The pool's one pending look ran on the loop that asked for it; if that loop closed
    first, a later caller's loop looks instead, and a blocking call still gets a spare."""
    pool = ToolThreads(patience=0.02)
    release = threading.Event()
    blocked = asyncio.ensure_future(pool.run(release.wait, 10))
    await asyncio.sleep(0.05)
    pool._look_due = time.monotonic() - 5.0  # as a closed loop's look that never ran leaves it
    assert await asyncio.wait_for(pool.run(abs, -3), 2) == 3
    assert pool.threads == 2
    release.set()
    await blocked


async def test_threads_never_exceed_the_limit_however_many_calls_block() -> None:
    pool = ToolThreads(max_threads=2, patience=0.01)
    release = threading.Event()
    calls = [asyncio.ensure_future(pool.run(release.wait, 10)) for _ in range(6)]
    await asyncio.sleep(0.3)
    assert pool.threads == 2
    release.set()
    assert await asyncio.wait_for(asyncio.gather(*calls), 10) == [True] * 6


async def test_calls_queued_before_the_first_thread_takes_one_still_get_a_spare(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Calls queued while the first thread is still starting (a loaded machine): when it then
    blocks in the first, a spare starts for the rest; no new call has to come to ask."""
    work = ToolThreads._work

    def slow_start(self: ToolThreads, first: bool) -> None:
        time.sleep(0.1)  # the thread takes its first call only after every call is queued
        work(self, first)

    monkeypatch.setattr(ToolThreads, "_work", slow_start)
    pool = ToolThreads(max_threads=2, patience=0.01)
    release = threading.Event()
    calls = [asyncio.ensure_future(pool.run(release.wait, 10)) for _ in range(3)]
    for _ in range(100):
        if pool.threads == 2:
            break
        await asyncio.sleep(0.02)
    assert pool.threads == 2
    release.set()
    assert await asyncio.wait_for(asyncio.gather(*calls), 10) == [True] * 3


async def test_a_call_its_caller_stopped_waiting_for_before_it_started_is_not_run() -> None:
    pool = ToolThreads(patience=60.0)  # no second thread: the second call must wait
    release = threading.Event()
    ran: list[str] = []
    first = asyncio.ensure_future(pool.run(release.wait, 10))
    await asyncio.sleep(0.05)
    second = asyncio.ensure_future(pool.run(ran.append, "second"))
    await asyncio.sleep(0.05)
    second.cancel()
    release.set()
    await first
    assert await pool.run(ran.append, "third") is None
    assert ran == ["third"]
    assert second.cancelled()


async def test_each_call_runs_in_a_copy_of_its_callers_context() -> None:
    pool = ToolThreads()

    def read_and_set() -> str:
        seen = WHO.get()
        WHO.set("the tool")
        return seen

    token = WHO.set("the run")
    try:
        assert await pool.run(read_and_set) == "the run"
        assert WHO.get() == "the run"  # the tool's own set stays in its copy
    finally:
        WHO.reset(token)


async def test_what_a_call_raises_reaches_its_caller() -> None:
    pool = ToolThreads()

    def fail(kind: type[BaseException]) -> None:
        raise kind("from the tool")

    with pytest.raises(ValueError, match="from the tool"):
        await pool.run(fail, ValueError)
    with pytest.raises(RuntimeError, match="StopIteration"):
        await pool.run(fail, StopIteration)
    assert await pool.run(int, "7") == 7  # the thread survived both


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    calls=st.lists(
        st.tuples(st.sampled_from(["return", "raise"]), st.sampled_from([0.0, 0.0, 0.002, 0.03])),
        min_size=1,
        max_size=25,
    ),
    max_threads=st.integers(min_value=1, max_value=4),
)
async def test_every_call_gets_its_own_outcome_within_the_thread_limit(
    calls: list[tuple[str, float]], max_threads: int
) -> None:
    """Quick and slow calls, returning and raising, all at once: each caller gets its own
    call's result or exception, and the pool never has more threads than its limit."""
    pool = ToolThreads(max_threads=max_threads, patience=0.005, linger=0.05)
    most = 0

    def work(index: int, kind: str, seconds: float) -> int:
        nonlocal most
        most = max(most, pool.threads)
        time.sleep(seconds)
        if kind == "raise":
            raise ValueError(index)
        return index

    outcomes = await asyncio.gather(
        *(pool.run(work, i, kind, seconds) for i, (kind, seconds) in enumerate(calls)),
        return_exceptions=True,
    )
    for index, ((kind, _), outcome) in enumerate(zip(calls, outcomes, strict=True)):
        if kind == "raise":
            assert isinstance(outcome, ValueError) and outcome.args == (index,)
        else:
            assert outcome == index
    assert 1 <= most <= max_threads and pool.threads <= max_threads


async def test_a_sync_tool_of_a_run_runs_on_the_pool() -> None:
    names: list[str] = []

    @tool
    def where() -> str:
        """Say which thread runs this."""
        names.append(threading.current_thread().name)
        return "here"

    def answer(request: object) -> object:
        messages = getattr(request, "messages", [])
        if any(m.role == "tool" for m in messages):
            return reply("done")
        return reply(tool_calls=[call("where")])

    from agent_flow import AgentExecutor

    outcome = await AgentExecutor(FunctionLLM(answer), tools=ToolExecutor([where])).run("go")
    assert outcome.final_text == "done"
    assert names and names[0].startswith("agent_flow.tools-")


def _in_child(results: multiprocessing.queues.Queue[object]) -> None:
    results.put(asyncio.run(tool_threads().run(sum, [1, 2, 3])))


async def test_a_forked_child_gets_a_pool_of_its_own() -> None:
    """Threads do not survive fork: the child's pool starts its own instead of queueing for
    the parent's threads forever."""
    assert await tool_threads().run(len, "abc") == 3  # the parent's pool has a thread
    context = multiprocessing.get_context("fork")
    results = context.Queue()
    child = context.Process(target=_in_child, args=(results,))
    child.start()
    try:
        assert results.get(timeout=20) == 6
    finally:
        child.join(20)
    assert child.exitcode == 0


def test_at_exit_a_running_call_finishes_before_the_process_ends(tmp_path: Path) -> None:
    """A call whose caller gave up (a cancelled run) is still running when the program
    ends: the interpreter waits for it, as for `concurrent.futures`' threads, so a tool is
    never cut off half-way by an ordinary exit."""
    done = tmp_path / "done"
    script = textwrap.dedent(
        f"""
        import asyncio, time
        from pathlib import Path
        from agent_flow.tools._threads import tool_threads

        def slow():
            time.sleep(0.5)
            Path({str(done)!r}).write_text("finished")

        async def main():
            call = asyncio.ensure_future(tool_threads().run(slow))
            await asyncio.sleep(0.1)
            call.cancel()

        asyncio.run(main())
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert result.returncode == 0, result.stderr
    assert done.read_text() == "finished"
