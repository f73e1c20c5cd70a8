"""The one retry layer and the timeouts of calls to an OpenAI-compatible server.

Private to `agent_flow.llm`. The SDK's own retries are switched off (``max_retries=0``), so
attempts are counted here and nowhere else: `RetryPolicy` decides whether a failed attempt
is tried again and after how long (the server's ``Retry-After``, else a doubling, jittered
backoff), and marks the error it finally lets through with the number of attempts made.
`Timeouts` holds the four limits of one attempt, each named in the error it causes.
"""

from __future__ import annotations

import email.utils
import random
import time
from collections.abc import Mapping
from dataclasses import dataclass

from agent_flow._defaults import (
    DEFAULT_CHUNK_TIMEOUT,
    DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_FIRST_BYTE_TIMEOUT,
    DEFAULT_MODEL_RETRIES,
    DEFAULT_REQUEST_TIMEOUT,
    RETRY_BASE_DELAY,
    RETRY_MAX_DELAY,
)
from agent_flow.errors import MalformedChunkError, ModelError, ModelServerError

__all__ = ["RetryPolicy", "Timeouts", "parse_retry_after"]


@dataclass(frozen=True)
class Timeouts:
    """The limits of one attempt, in seconds.

    Attributes:
        connect: To get a connection.
        first_byte: For a streamed answer to start (response and first chunk).
        chunk: Between two chunks of a streamed answer.
        request: For the whole attempt (a non-streamed answer included).
    """

    connect: float = DEFAULT_CONNECT_TIMEOUT
    first_byte: float = DEFAULT_FIRST_BYTE_TIMEOUT
    chunk: float = DEFAULT_CHUNK_TIMEOUT
    request: float = DEFAULT_REQUEST_TIMEOUT


def parse_retry_after(headers: Mapping[str, str]) -> float | None:
    """The wait a response asks for: ``retry-after-ms``, else ``retry-after`` (seconds, date)."""
    millis = headers.get("retry-after-ms")
    if millis is not None:
        try:
            return max(0.0, float(millis) / 1000)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


class RetryPolicy:
    """Whether and when a failed attempt is tried again, for one call.

    Args:
        retries: Retries after the first attempt (so ``retries + 1`` attempts at most).
        base_delay: The first backoff without ``Retry-After`` (doubled per attempt, jittered).
        max_delay: The longest wait; a server asking for longer is not retried.
    """

    def __init__(
        self,
        retries: int = DEFAULT_MODEL_RETRIES,
        *,
        base_delay: float = RETRY_BASE_DELAY,
        max_delay: float = RETRY_MAX_DELAY,
    ) -> None:
        self.max_attempts = retries + 1
        self.base_delay = base_delay
        self.max_delay = max_delay
        self._last_failure: tuple[object, str] | None = None

    def delay(self, err: ModelError, attempt: int) -> float | None:
        """Return the seconds to wait before attempt ``attempt + 1``, or ``None`` to give up.

        When giving up after more than one attempt, `err` is marked with the attempts made
        and its message says so; `err.attempts` is set either way.
        """
        err.attempts = attempt
        give_up = ""
        if not err.retryable:
            return None
        if attempt >= self.max_attempts:
            give_up = f"gave up after {attempt} attempts"
        elif self._repeats(err):
            give_up = (
                f"gave up after {attempt} attempts: the identical request failed identically, "
                "so the failure is not transient"
            )
        elif err.retry_after is not None and err.retry_after > self.max_delay:
            give_up = (
                f"the server asked to wait {err.retry_after:g} s, longer than the "
                f"{self.max_delay:g} s agent_flow waits between attempts"
            )
        if give_up:
            if attempt > 1 or err.retry_after is not None:
                err.args = (f"{err.args[0] if err.args else err} ({give_up})", *err.args[1:])
            return None
        if err.retry_after is not None:
            # Honour the hint, with a little jitter on top so clients do not return in step.
            return float(err.retry_after) * (1 + 0.1 * random.random())
        backoff = min(self.max_delay, self.base_delay * 2.0 ** (attempt - 1))
        return backoff * (0.5 + 0.5 * random.random())

    def _repeats(self, err: ModelError) -> bool:
        """Whether `err` repeats the previous attempt's failure exactly.

        Compared: an HTTP 500 by its body, a corrupt chunk by where and what it was.
        """
        if isinstance(err, ModelServerError) and err.status_code == 500:
            failure: tuple[object, str] | None = (err.status_code, repr(err.body))
        elif isinstance(err, MalformedChunkError):
            failure = ("corrupt chunk", str(err))
        else:
            failure = None
        if failure is None:
            self._last_failure = None
            return False
        repeated = failure == self._last_failure
        self._last_failure = failure
        return repeated
