"""Where sync tools run: one thread while their calls are quick, more while one blocks.

`asyncio.to_thread` hands each call to the event loop's default pool, which starts a thread
whenever none is idle (up to the CPU count plus four). With many runs at once those threads
and the event loop's thread take the GIL from each other at every call: 100 runs of a
one-line sync tool cost 0.67 ms of CPU per model turn more than with an async tool
(`bench_loop`'s workload, 2 cores), against 0.04 ms with one thread taking the calls one
after another (`bench_tool_threads.py` compares this pool with `asyncio.to_thread`). One
thread alone would let a call that blocks (a slow request, a sleep) hold up every other
run's calls, so:

- calls queue for the pool's threads; the first thread stays for the life of the process;
- while calls wait and every thread has been inside one call for longer than `patience`
  (20 ms: well above the 5 ms a thread may wait for the GIL between two calls), the event
  loop that queued them starts one more thread, up to `max_threads`, and looks again;
- a thread beyond the first leaves after `linger` seconds without a call.

Each call runs in a copy of its caller's context (as with `asyncio.to_thread`). A call whose
caller stopped waiting before it started (cancelled, timed out) is not run; one already
running runs to its end (no thread can be stopped) and its result is dropped. At interpreter
exit the threads finish their calls first, as `concurrent.futures`' do.

Owner: `tool_threads()`'s pool is the process's (re-made in a forked child, where threads do
not survive); its threads are owned by it and touch a caller's loop only through
``call_soon_threadsafe``.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import os
import queue
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from agent_flow._defaults import (
    TOOL_THREAD_LINGER_SECONDS,
    TOOL_THREAD_PATIENCE_SECONDS,
    TOOL_THREADS_MAX,
)

__all__ = ["ToolThreads", "tool_threads"]

_R = TypeVar("_R")


class _Call:
    """One sync call waiting for, or running on, a pool thread."""

    __slots__ = ("arguments", "context", "function", "future", "keywords", "loop")

    def __init__(
        self,
        function: Callable[..., Any],
        arguments: tuple[Any, ...],
        keywords: dict[str, Any],
        loop: asyncio.AbstractEventLoop,
        future: asyncio.Future[Any],
    ) -> None:
        self.context = contextvars.copy_context()
        self.function = function
        self.arguments = arguments
        self.keywords = keywords
        self.loop = loop
        self.future = future


class ToolThreads:
    """A pool of threads for sync tool calls (see the module doc).

    Args:
        max_threads: The most threads at once.
        patience: Seconds every thread must have been inside one call, while calls wait,
            before one more thread starts.
        linger: Idle seconds after which a thread beyond the first leaves.
    """

    def __init__(
        self,
        *,
        max_threads: int = TOOL_THREADS_MAX,
        patience: float = TOOL_THREAD_PATIENCE_SECONDS,
        linger: float = TOOL_THREAD_LINGER_SECONDS,
    ) -> None:
        if max_threads < 1:
            raise ValueError(f"max_threads={max_threads}: at least one thread is needed")
        self.max_threads = max_threads
        self.patience = patience
        self.linger = linger
        self._reset()

    def _reset(self) -> None:
        self._calls: queue.SimpleQueue[_Call | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        #: When each busy thread entered its call (monotonic), by thread id.
        self._busy: dict[int, float] = {}
        self._threads: list[threading.Thread] = []
        self._closed = False
        #: When the pending look is due (None: none pending). One look at a time, on the loop
        #: that asked for it; one a second overdue (its loop closed) is replaced.
        self._look_due: float | None = None

    @property
    def threads(self) -> int:
        """How many threads the pool has now."""
        with self._lock:
            return len(self._threads)

    async def run(self, function: Callable[..., _R], /, *args: Any, **kwargs: Any) -> _R:
        """Call ``function(*args, **kwargs)`` on a pool thread and return what it returns.

        Raises:
            BaseException: Whatever the function raised.
        """
        loop = asyncio.get_running_loop()
        future: asyncio.Future[_R] = loop.create_future()
        with self._lock:
            if self._closed:
                raise RuntimeError("the tool threads were shut down (the interpreter is exiting)")
            self._calls.put(_Call(function, args, kwargs, loop, future))
            if not self._threads:
                self._start(first=True)
            # Look in a while, in case every thread blocks while calls wait. Not only when
            # every thread is in a call now: a thread that has not taken its call yet (one
            # just started, on a loaded machine) may block the moment it does, and without a
            # look pending nothing would start a spare for the calls queued behind it.
            now = time.monotonic()
            if self._look_due is None or now > self._look_due + 1.0:
                self._look_due = now + self.patience
                loop.call_later(self.patience, self._look, loop)
        return await future

    def _look(self, loop: asyncio.AbstractEventLoop) -> None:
        """On `loop`: start a thread if calls wait behind threads that all seem blocked."""
        with self._lock:
            if self._calls.empty() or self._closed:
                self._look_due = None
                return
            now = time.monotonic()
            stuck = [since for since in self._busy.values() if now - since >= self.patience]
            if len(stuck) >= len(self._threads) and len(self._threads) < self.max_threads:
                self._start(first=False)
            self._look_due = now + self.patience
        loop.call_later(self.patience, self._look, loop)

    def _start(self, *, first: bool) -> None:
        """Start a thread (the caller holds the lock)."""
        thread = threading.Thread(
            target=self._work,
            args=(first,),
            name=f"agent_flow.tools-{len(self._threads)}",
            daemon=True,  # joined at exit by `_shutdown`, after its call
        )
        self._threads.append(thread)
        thread.start()

    def _work(self, first: bool) -> None:
        ident = threading.get_ident()
        while True:
            try:
                call = self._calls.get(timeout=None if first else self.linger)
            except queue.Empty:
                with self._lock:
                    if self._calls.empty() or self._closed:
                        self._threads.remove(threading.current_thread())
                        return
                continue
            if call is None:  # shut down
                return
            if call.future.cancelled():  # its caller stopped waiting before it started
                continue
            with self._lock:
                self._busy[ident] = time.monotonic()
            try:
                result = call.context.run(call.function, *call.arguments, **call.keywords)
            except BaseException as error:  # handed to the caller, whatever it is
                outcome: tuple[Any, BaseException | None] = (None, error)
            else:
                outcome = (result, None)
            finally:
                with self._lock:
                    del self._busy[ident]
            # A closed loop (RuntimeError) has nobody waiting any more.
            with contextlib.suppress(RuntimeError):
                call.loop.call_soon_threadsafe(_settle, call.future, *outcome)
            del call, outcome

    def _shutdown(self) -> None:
        """Let every thread finish its call, then stop it (at interpreter exit)."""
        with self._lock:
            self._closed = True
            threads = list(self._threads)
        for _ in threads:
            self._calls.put(None)
        for thread in threads:
            thread.join()


def _settle(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if future.cancelled():
        return
    if error is None:
        future.set_result(result)
    elif isinstance(error, StopIteration):
        # A future cannot carry StopIteration (it would end the awaiting coroutine).
        future.set_exception(RuntimeError(f"the tool raised StopIteration: {error!r}"))
    else:
        future.set_exception(error)


_pool: ToolThreads | None = None
_pool_lock = threading.Lock()


def tool_threads() -> ToolThreads:
    """The process's pool for sync tool calls."""
    global _pool
    if _pool is None:
        with _pool_lock:
            if _pool is None:
                pool = ToolThreads()
                _at_exit(pool._shutdown)
                _pool = pool
    return _pool


def _at_exit(callback: Callable[[], None]) -> None:
    # Before non-daemon threads are joined, as concurrent.futures does; plain atexit (after
    # them) where this private hook is missing.
    register = getattr(threading, "_register_atexit", None)
    if register is not None:
        register(callback)
    else:
        import atexit

        atexit.register(callback)


def _forked() -> None:
    if _pool is not None:
        _pool._reset()  # the parent's threads do not exist here


os.register_at_fork(after_in_child=_forked)
