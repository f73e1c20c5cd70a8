"""The metrics the telemetry ring records: the GenAI conventions' and agent_flow's own.

- ``gen_ai.client.token.usage`` (histogram, ``{token}``): each model call's input and output
  tokens, by ``gen_ai.token.type``.
- ``gen_ai.client.operation.duration`` (histogram, ``s``): each model call (``chat``) and run
  (``invoke_agent``).
- ``agent_flow.context.utilization`` (histogram, ratio): each prompt section's share of the
  budget (``agent_flow.prompt.section``: system_template, environment, tools, history,
  priming, reserve, and total), one point per prompt built.
- ``agent_flow.history.pruned_entries`` (counter): entries dropped, elided or summarized
  (``agent_flow.history.prune_action``).
- ``agent_flow.history.pruned_tokens`` (counter, ``{token}``): history tokens pruning freed.
- ``agent_flow.cost`` (counter, ``USD``): the cost of the model calls with a known price.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from agent_flow.telemetry import _names as n

if TYPE_CHECKING:
    from opentelemetry.metrics import Meter

    from agent_flow.events import ModelResponded
    from agent_flow.history.pruning import PruneReport
    from agent_flow.prompt import PromptBreakdown

_SECTIONS = ("system_template", "environment", "tools", "history", "priming", "reserve", "total")
_SECTION_ATTRIBUTES = tuple((section, {n.SECTION: section}) for section in _SECTIONS)


class _Metrics:
    """The instruments, created once per meter."""

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

    def model_call(self, event: ModelResponded, attributes: dict[str, Any]) -> None:
        self._tokens.record(event.prompt_tokens, {**attributes, n.TOKEN_TYPE: "input"})
        self._tokens.record(event.completion_tokens, {**attributes, n.TOKEN_TYPE: "output"})
        self.operation(event.duration_ms, attributes, error=None)
        if event.cost_usd is not None:
            self._cost.add(event.cost_usd, attributes)

    def operation(
        self, duration_ms: float, attributes: dict[str, Any], *, error: str | None
    ) -> None:
        if error is not None:
            attributes = {**attributes, n.ERROR_TYPE: error}
        self._duration.record(duration_ms / 1000, attributes)

    def prompt(self, breakdown: PromptBreakdown) -> None:
        budget = breakdown.budget
        if budget <= 0:
            return
        for section, attributes in _SECTION_ATTRIBUTES:
            self._utilization.record(getattr(breakdown, section) / budget, attributes)

    def pruned(self, report: PruneReport) -> None:
        for action, ids in (
            ("dropped", report.dropped),
            ("elided", report.elided),
            ("summarized", report.summarized),
        ):
            if ids:
                self._pruned_entries.add(len(ids), {n.PRUNE_ACTION: action})
        freed = report.tokens_before - report.tokens_after
        if freed > 0:
            self._pruned_tokens.add(freed)
