"""`cancel_and_wait` stops tasks, waits for them, and never loses its caller's cancellation.

Every test steps real asyncio tasks with events and ``sleep(0)`` turns: nothing sleeps for time.
A "child" is a task being stopped; the "caller" is the task that runs `cancel_and_wait`.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Literal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent_flow._utils import cancel_and_wait

Ending = Literal["reraise", "swallow", "fail"]


class ChildFailedError(Exception):
    """What a child that fails while stopping raises."""


@dataclass
class Child:
    """A task that, once cancelled, cleans up for some loop turns (or until `release` is set)."""

    turns: int = 0
    ending: Ending = "reraise"
    release: asyncio.Event | None = None
    stopping: asyncio.Event = field(default_factory=asyncio.Event)
    cleaned: bool = False
    task: asyncio.Task[None] | None = None

    async def run(self) -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.stopping.set()
            for _ in range(self.turns):
                await asyncio.sleep(0)
            if self.release is not None:
                await self.release.wait()
            self.cleaned = True
            if self.ending == "fail":
                raise ChildFailedError(f"child of {self.turns} turns") from None
            if self.ending == "reraise":
                raise

    async def start(self) -> asyncio.Task[None]:
        self.task = asyncio.create_task(self.run())
        await asyncio.sleep(0)  # now waiting in `run`
        return self.task


async def _finished(task: asyncio.Future[object]) -> None:
    await asyncio.wait({task})


async def test_a_running_task_is_cancelled_and_waited_for() -> None:
    child = Child(turns=3)
    task = await child.start()

    await cancel_and_wait(task)

    assert task.cancelled()
    assert child.cleaned


async def test_a_task_that_ignores_the_cancel_and_returns_is_done_with() -> None:
    child = Child(turns=1, ending="swallow")
    task = await child.start()

    await cancel_and_wait(task)

    assert task.done()
    assert not task.cancelled()
    assert child.cleaned


async def test_a_caller_cancelled_while_it_waits_is_cancelled_once_the_task_has_ended() -> None:
    child = Child(release=asyncio.Event())
    task = await child.start()
    carried_on = False

    async def stop() -> None:
        nonlocal carried_on
        await cancel_and_wait(task)
        carried_on = True

    caller = asyncio.create_task(stop())
    await child.stopping.wait()
    caller.cancel()
    for _ in range(3):
        await asyncio.sleep(0)
    assert not caller.done()  # it still waits for the child's cleanup
    assert not task.done()
    child.release.set()  # type: ignore[union-attr]
    await _finished(caller)

    assert caller.cancelled()
    assert not carried_on
    assert child.cleaned  # its cleanup was not cut short by a second cancel
    assert task.cancelled()


async def test_cleanup_after_a_cancellation_waits_for_the_task_then_goes_on() -> None:
    child = Child(release=asyncio.Event())
    task = await child.start()
    entered = asyncio.Event()
    after: list[str] = []

    async def run() -> None:
        try:
            entered.set()
            await asyncio.Event().wait()
        finally:
            await cancel_and_wait(task)
            after.append("cleanup went on")

    caller = asyncio.create_task(run())
    await entered.wait()
    caller.cancel()
    await child.stopping.wait()
    assert not caller.done()
    child.release.set()  # type: ignore[union-attr]
    await _finished(caller)

    assert caller.cancelled()  # the first cancellation goes on
    assert after == ["cleanup went on"]
    assert child.cleaned
    assert task.cancelled()


async def test_a_caller_cancelled_again_during_its_cleanup_gets_that_cancellation() -> None:
    child = Child(release=asyncio.Event())
    task = await child.start()
    entered = asyncio.Event()
    after: list[str] = []

    async def run() -> None:
        try:
            entered.set()
            await asyncio.Event().wait()
        finally:
            await cancel_and_wait(task)
            after.append("cleanup went on")

    caller = asyncio.create_task(run())
    await entered.wait()
    caller.cancel()
    await child.stopping.wait()
    caller.cancel()  # a second cancellation, while it waits
    await asyncio.sleep(0)
    child.release.set()  # type: ignore[union-attr]
    await _finished(caller)

    assert caller.cancelled()
    assert after == []
    assert child.cleaned


async def test_a_cancellation_the_caller_asked_of_itself_is_raised_after_the_wait() -> None:
    child = Child(turns=3)
    task = await child.start()
    after: list[str] = []

    async def run() -> None:
        this = asyncio.current_task()
        assert this is not None
        this.cancel()  # requested, not yet delivered: `cancelling()` is 1 on entry
        await cancel_and_wait(task)
        after.append("carried on")

    caller = asyncio.create_task(run())
    await _finished(caller)

    assert caller.cancelled()
    assert after == []
    assert child.cleaned
    assert task.cancelled()


@pytest.mark.parametrize("ending", ["result", "cancelled"])
async def test_a_task_already_done_is_done_with_at_once(ending: str) -> None:
    task: asyncio.Task[None] = asyncio.create_task(asyncio.sleep(0))
    if ending == "cancelled":
        task.cancel()
    await _finished(task)

    await cancel_and_wait(task)

    assert task.cancelled() == (ending == "cancelled")


async def test_a_task_already_failed_raises_its_failure() -> None:
    async def fail() -> None:
        raise ChildFailedError("before the cancel")

    task = asyncio.create_task(fail())
    await _finished(task)

    with pytest.raises(ChildFailedError, match="before the cancel"):
        await cancel_and_wait(task)


async def test_a_task_that_fails_while_stopping_raises_its_failure_as_awaiting_it_would() -> None:
    child = Child(turns=1, ending="fail")
    task = await child.start()

    with pytest.raises(ChildFailedError):
        await cancel_and_wait(task)
    assert child.cleaned


async def test_a_cancelled_caller_gets_its_cancellation_with_the_tasks_failure_as_context() -> None:
    child = Child(release=asyncio.Event(), ending="fail")
    task = await child.start()
    caught: list[BaseException] = []

    async def stop() -> None:
        try:
            await cancel_and_wait(task)
        except asyncio.CancelledError as err:
            caught.append(err)
            raise

    caller = asyncio.create_task(stop())
    await child.stopping.wait()
    caller.cancel()
    await asyncio.sleep(0)
    child.release.set()  # type: ignore[union-attr]
    await _finished(caller)

    assert caller.cancelled()
    assert isinstance(caught[0].__context__, ChildFailedError)


async def test_several_tasks_are_all_cancelled_first_and_all_waited_for() -> None:
    children = [Child(turns=turns) for turns in (3, 0, 1)]
    tasks = [await child.start() for child in children]

    await cancel_and_wait(*tasks)

    assert all(task.cancelled() for task in tasks)
    assert all(child.cleaned for child in children)


async def test_no_tasks_is_nothing_to_do() -> None:
    await cancel_and_wait()


@given(
    children=st.lists(
        st.tuples(st.integers(0, 4), st.sampled_from(["reraise", "swallow", "fail"])),
        min_size=1,
        max_size=3,
    ),
    cleanup=st.booleans(),
    cancel_after=st.none() | st.integers(1, 8),
)
async def test_tasks_always_finish_their_cleanup_and_the_callers_cancellation_is_never_lost(
    children: list[tuple[int, Ending]], cleanup: bool, cancel_after: int | None
) -> None:
    """Whatever the tasks do when cancelled, and whenever the caller is cancelled meanwhile.

    `cleanup`: the caller runs `cancel_and_wait` in a ``finally`` after a cancellation of its
    own (then `cancel_after` is a second one). Every task ends with its cleanup whole; the
    caller ends cancelled when a cancellation arrived during the call, else with the first
    task's failure, else as it would have (cancelled in cleanup); code after the call runs
    exactly when neither a cancellation arrived during it nor a task failed.
    """
    kids = [Child(turns=turns, ending=ending) for turns, ending in children]
    tasks = [await kid.start() for kid in kids]
    state = {"inside": False, "after": False}
    entered = asyncio.Event()

    async def stop() -> None:
        state["inside"] = True
        try:
            await cancel_and_wait(*tasks)
        finally:
            state["inside"] = False
        state["after"] = True

    async def run() -> None:
        if not cleanup:
            await stop()
            return
        try:
            entered.set()
            await asyncio.Event().wait()
        finally:
            await stop()

    caller = asyncio.create_task(run())
    if cleanup:
        await entered.wait()
        caller.cancel()
    await asyncio.sleep(0)  # the caller has cancelled the tasks and waits for them
    cancelled_inside = False
    if cancel_after is not None:
        for _ in range(cancel_after):
            await asyncio.sleep(0)
        if not caller.done():
            cancelled_inside = state["inside"]
            caller.cancel()
    await _finished(caller)

    assert all(task.done() for task in tasks)
    assert all(kid.cleaned for kid in kids)  # never cut short
    failed = [kid for kid in kids if kid.ending == "fail"]
    for task in tasks:  # a failure after the first is left unretrieved: retrieve it here
        task.cancelled() or task.exception()
    assert state["after"] == (not cancelled_inside and not failed)
    if cancelled_inside:
        assert caller.cancelled()
    elif failed:  # raised as awaiting the task raised it (in a ``finally``, it replaces the
        # cancellation under way, as any exception raised there does)
        assert str(caller.exception()) == f"child of {failed[0].turns} turns"
    elif cleanup:
        assert caller.cancelled()
    else:
        assert caller.result() is None
