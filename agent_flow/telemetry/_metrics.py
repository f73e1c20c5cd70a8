"""The metrics the telemetry ring records: the GenAI conventions' and agent_flow's own.

- ``gen_ai.client.token.usage`` (histogram, ``{token}``): each model call's input and output
  tokens, by ``gen_ai.token.type``.
- ``gen_ai.client.operation.duration`` (histogram, ``s``): each model call (``chat``) and run
  (``invoke_agent``), failed ones too, with their ``error.type``: an error rate reads from it.
- ``gen_ai.client.operation.time_to_first_chunk`` (histogram, ``s``): each streamed model
  call, from the request to the first chunk of the answer it returned.
- ``agent_flow.context.utilization`` (histogram, ratio): each prompt section's share of the
  budget (``agent_flow.prompt.section``): environment, tools, history and total, one point
  per prompt built; system_template, priming and reserve, which hardly change within a run,
  one point at its first prompt and one whenever their share changes.
- ``agent_flow.history.pruned_entries`` (counter): entries dropped, elided or summarized
  (``agent_flow.history.prune_action``).
- ``agent_flow.history.pruned_tokens`` (counter, ``{token}``): history tokens pruning freed.
- ``agent_flow.cost`` (counter, ``USD``): the cost of the model calls with a known price.

Off the loop: the SDK checks, copies and hashes the attributes of every point it records,
some tens of microseconds each, and a turn makes a dozen. So the loop only queues each point
(the instrument, the value and a prebuilt attribute dict: no copy), and the points are
recorded when a metric reader collects, from an observable instrument's callback that runs
just before the SDK reads its instruments: every point lands in the collection it would have
landed in, but its cost is paid in the reader's thread, not in the agent's turn. Should no
reader collect (the API without an SDK), the queue stops at `_MAX_PENDING` points (about a MB)
and later points are recorded in place, as without the queue, until a collection empties it:
memory stays bounded and the loop never stalls on a backlog. The points carry no trace
exemplars: they are recorded where no span is current.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Final, TypeAlias

from agent_flow.telemetry import _names as n

if TYPE_CHECKING:
    from opentelemetry.metrics import CallbackOptions, Meter, Observation

    from agent_flow.events import ModelResponded
    from agent_flow.history.pruning import PruneReport
    from agent_flow.prompt import PromptBreakdown

Attributes: TypeAlias = Mapping[str, Any]
_Record: TypeAlias = Callable[[float, Attributes], None]

# The sections whose share changes from prompt to prompt, and those that stay (the reserve and
# the priming are fixed; the system template changes only with a skill).
_VARYING = ("environment", "tools", "history", "total")
_STEADY = ("system_template", "priming", "reserve")
_VARYING_ATTRIBUTES = tuple((section, {n.SECTION: section}) for section in _VARYING)
_STEADY_ATTRIBUTES = tuple((section, {n.SECTION: section}) for section in _STEADY)
_PRUNE_ATTRIBUTES = {
    action: {n.PRUNE_ACTION: action} for action in ("dropped", "elided", "summarized")
}
_NO_ATTRIBUTES: Final[Attributes] = {}
#: The most points queued; past it, points are recorded in place until a reader collects.
_MAX_PENDING: Final = 10_000

# One queue for the process: a collection by any meter provider records every queued point
# into its own instrument (each entry holds it), so no agent's points wait on another's reader.
_pending: deque[tuple[_Record, float, Attributes]] = deque()


def flush_pending() -> None:
    """Record every queued point now (safe from any thread, and while others queue)."""
    pop = _pending.popleft
    while True:
        try:
            record, value, attributes = pop()
        except IndexError:
            return
        record(value, attributes)


def _flush_on_collect(options: CallbackOptions) -> Iterable[Observation]:
    flush_pending()
    return ()


class CallAttributes:
    """The prebuilt attribute dicts of one model's calls (points keep them: never mutate)."""

    __slots__ = ("call", "input", "output")

    def __init__(self, attributes: dict[str, Any]) -> None:
        self.call: Attributes = attributes
        self.input: Attributes = {**attributes, n.TOKEN_TYPE: "input"}
        self.output: Attributes = {**attributes, n.TOKEN_TYPE: "output"}


class _Metrics:
    """The instruments, created once per meter, and the queue in front of them."""

    def __init__(self, meter: Meter) -> None:
        self._tokens = meter.create_histogram(
            n.TOKEN_USAGE_METRIC,
            unit="{token}",
            description="Number of input and output tokens used.",
            explicit_bucket_boundaries_advisory=n.TOKEN_BUCKETS,
        )
        self._duration = meter.create_histogram(
            n.DURATION_METRIC,
            unit="s",
            description="GenAI operation duration.",
            explicit_bucket_boundaries_advisory=n.DURATION_BUCKETS,
        )
        self._first_chunk = meter.create_histogram(
            n.TIME_TO_FIRST_CHUNK_METRIC,
            unit="s",
            description=(
                "Time to receive the first chunk, measured from when the client issues the "
                "generation request to when the first chunk is received in the response stream."
            ),
            explicit_bucket_boundaries_advisory=n.DURATION_BUCKETS,
        )
        self._utilization = meter.create_histogram(
            n.UTILIZATION_METRIC,
            unit="1",
            description="Share of the prompt budget each section of a prompt took.",
            explicit_bucket_boundaries_advisory=(0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9),
        )
        self._pruned_entries = meter.create_counter(
            n.PRUNED_ENTRIES_METRIC,
            unit="{entry}",
            description="History entries dropped, elided or summarized by pruning.",
        )
        self._pruned_tokens = meter.create_counter(
            n.PRUNED_TOKENS_METRIC,
            unit="{token}",
            description="History tokens freed by pruning.",
        )
        self._cost = meter.create_counter(
            n.COST_METRIC, unit="USD", description="Cost of model calls with a known price."
        )
        # It observes nothing: its callback records the queued points when a reader collects.
        # (A second agent on the same meter gets the same instrument; one callback suffices.)
        meter.create_observable_gauge(
            n.FLUSH_METRIC,
            callbacks=[_flush_on_collect],
            description="No points: records agent_flow's queued points when collected.",
        )

    @staticmethod
    def _queue(record: _Record, value: float, attributes: Attributes) -> None:
        if len(_pending) < _MAX_PENDING:
            _pending.append((record, value, attributes))
        else:
            record(value, attributes)

    def model_call(
        self, event: ModelResponded, attributes: CallAttributes, first_chunk: float | None
    ) -> None:
        queue = self._queue
        queue(self._tokens.record, event.prompt_tokens, attributes.input)
        queue(self._tokens.record, event.completion_tokens, attributes.output)
        queue(self._duration.record, event.duration_ms / 1000, attributes.call)
        if first_chunk is not None:
            queue(self._first_chunk.record, first_chunk, attributes.call)
        if event.cost_usd is not None:
            queue(self._cost.add, event.cost_usd, attributes.call)

    def operation(self, duration_ms: float, attributes: Attributes, *, error: str | None) -> None:
        if error is not None:
            attributes = {**attributes, n.ERROR_TYPE: error}
        self._queue(self._duration.record, duration_ms / 1000, attributes)

    def prompt(self, breakdown: PromptBreakdown, previous: PromptBreakdown | None) -> None:
        """The shares of a prompt's sections: the steady ones only when they changed.

        Args:
            breakdown: The prompt's.
            previous: The run's previous prompt's (``None``: this is its first).
        """
        budget = breakdown.budget
        if budget <= 0:
            return
        queue, record = self._queue, self._utilization.record
        for section, attributes in _VARYING_ATTRIBUTES:
            queue(record, getattr(breakdown, section) / budget, attributes)
        for section, attributes in _STEADY_ATTRIBUTES:
            share = getattr(breakdown, section) / budget
            if (
                previous is None
                or previous.budget <= 0
                or getattr(previous, section) / previous.budget != share
            ):
                queue(record, share, attributes)

    def pruned(self, report: PruneReport) -> None:
        for action, ids in (
            ("dropped", report.dropped),
            ("elided", report.elided),
            ("summarized", report.summarized),
        ):
            if ids:
                self._queue(self._pruned_entries.add, len(ids), _PRUNE_ATTRIBUTES[action])
        freed = report.tokens_before - report.tokens_after
        if freed > 0:
            self._queue(self._pruned_tokens.add, freed, _NO_ATTRIBUTES)
