"""`LLMSummarizer`: a `Summarizer` that asks a model to summarize a span of history.

Summarizing is the one asynchronous step of pruning: `agent_flow.history.SummarizeOldest`
(awaited by `History.fold` and by `ContextManager.prune_if_needed`) or `History.summarize`
hands it the entries to fold and a token cap. It renders them as a plain transcript, asks the
model for a summary of at most that many tokens (``max_tokens`` on the request), and cuts the
answer with the token counter if the model overruns — the result never exceeds the cap. A
span too long for one request is summarized in parts whose summaries are then summarized
together (map-reduce), so the model's own context is never overrun either.

Every model call is admitted first with `agent_flow.llm.metering.admit_model_call` and
reported after with `report_model_call` (source ``"summarizer"``): an agent that prunes with
a summarizer holds each call to its cost limit before it is made (its counted transcript and
its whole ``max_tokens``, priced as the summarizer's own model: a call that could pass the
limit is not made, and the run stops with ``cost_limit``), and counts the calls in its usage,
its ``ModelResponded`` events and its token and cost limits.
A server that reports no usage gets the counter's counts of what was sent and received,
marked ``estimated``: such a call is never counted as free.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from agent_flow._text import truncate_to_tokens
from agent_flow._unicode import mend
from agent_flow.errors import ModelResponseError, UserError
from agent_flow.history import (
    AgentMessage,
    AgentThinking,
    Summary,
    ToolCallEntry,
    ToolResultEntry,
    UserMessage,
)
from agent_flow.llm.base import LLMClient, LLMRequest, Usage
from agent_flow.llm.metering import (
    ModelCallPlan,
    ModelCallReport,
    admit_model_call,
    report_model_call,
)
from agent_flow.messages import ChatMessage
from agent_flow.tokens import TokenCounter, default_counter

if TYPE_CHECKING:
    from agent_flow.history import HistoryEntry

__all__ = ["DEFAULT_SUMMARY_INSTRUCTIONS", "LLMSummarizer"]

DEFAULT_SUMMARY_INSTRUCTIONS = (
    "You summarize part of a conversation between a user and an AI agent that uses tools, so "
    "that the agent can carry on without the original messages. Keep what the agent will "
    "need: the user's goals and constraints, decisions taken, facts learned (names, paths, "
    "values, results), which tools ran and what they showed, errors and how they were "
    "handled, and what remains to do. Write compact bullet points in plain text, without "
    "preamble, and stay within the length you are given."
)


class LLMSummarizer:
    """Summarizes history entries with a model; implements `agent_flow.history.Summarizer`.

    Args:
        client: The model to ask (any `LLMClient`).
        counter: Counts tokens to bound the summary and the transcript; defaults to
            `default_counter()`.
        model: A model name overriding the client's (e.g. a cheaper one).
        instructions: The system prompt.
        temperature: Sampling temperature (low keeps summaries factual).
        max_input_tokens: The most transcript tokens sent in one request; longer spans are
            summarized in parts.
        max_entry_tokens: The most tokens any one entry (a long tool result) contributes.
    """

    def __init__(
        self,
        client: LLMClient,
        *,
        counter: TokenCounter | None = None,
        model: str | None = None,
        instructions: str = DEFAULT_SUMMARY_INSTRUCTIONS,
        temperature: float | None = 0.2,
        max_input_tokens: int = 16_000,
        max_entry_tokens: int = 1_000,
    ) -> None:
        if max_input_tokens < 200:
            raise UserError(f"max_input_tokens must be at least 200, got {max_input_tokens}")
        if max_entry_tokens < 20:
            raise UserError(f"max_entry_tokens must be at least 20, got {max_entry_tokens}")
        self.client = client
        self.counter: TokenCounter = counter if counter is not None else default_counter()
        self.model = model
        self.instructions = instructions
        self.temperature = temperature
        self.max_input_tokens = max_input_tokens
        self.max_entry_tokens = max_entry_tokens

    def __repr__(self) -> str:
        return f"LLMSummarizer({self.client!r}, model={self.model!r})"

    def transcript_lines(self, entries: Sequence[HistoryEntry]) -> list[str]:
        """Render entries as the transcript lines the model reads (thinking left out)."""
        lines: list[str] = []
        for entry in entries:
            if isinstance(entry, UserMessage):
                line = f"User: {entry.content}"
            elif isinstance(entry, AgentMessage):
                line = f"Assistant: {entry.content}"
            elif isinstance(entry, ToolCallEntry):
                call = entry.call
                line = f"Assistant called tool {call.name} with arguments {call.arguments}"
            elif isinstance(entry, ToolResultEntry):
                if entry.elided_tokens is not None:
                    line = f"Tool {entry.tool_name} returned {entry.elided_tokens} tokens (elided)"
                else:
                    status = "failed" if entry.is_error else "returned"
                    line = f"Tool {entry.tool_name} {status}: {entry.content}"
            elif isinstance(entry, Summary):
                line = f"Summary of what came before: {entry.content}"
            else:
                assert isinstance(entry, AgentThinking)
                continue
            lines.append(truncate_to_tokens(line, self.max_entry_tokens, self.counter.count)[0])
        return lines

    async def summarize(self, entries: Sequence[HistoryEntry], *, max_tokens: int) -> str:
        """Return a summary of `entries` of at most `max_tokens` tokens (by `counter`).

        Raises:
            UserError: `max_tokens` is below 1.
            ModelError: The model call failed, or the model answered with no text.
            CostLimitError: The running agent refused a call that could pass its
                ``max_cost_usd`` (see `agent_flow.llm.metering.admit_model_call`).
            ConfigError: The running agent has a cost limit and this model no known price.
        """
        if max_tokens < 1:
            raise UserError(f"a summary needs max_tokens >= 1, got {max_tokens}")
        lines = self.transcript_lines(entries)
        if not lines:
            return ""
        return await self._summarize_lines(lines, max_tokens)

    async def _summarize_lines(self, lines: list[str], max_tokens: int) -> str:
        groups = self._groups(lines)
        if len(groups) == 1:
            return await self._ask("\n".join(groups[0]), max_tokens)
        # Map-reduce: each part's summary is at most a quarter of the input allowance, so
        # every round shrinks the text and the recursion ends.
        part_tokens = max(1, min(max_tokens, self.max_input_tokens // 4))
        parts = [await self._ask("\n".join(group), part_tokens) for group in groups]
        combined = [f"Summary of part {i} of the conversation: {p}" for i, p in enumerate(parts, 1)]
        return await self._summarize_lines(combined, max_tokens)

    def _groups(self, lines: list[str]) -> list[list[str]]:
        count = self.counter.count
        groups: list[list[str]] = [[]]
        used = 0
        for line in lines:
            cost = count(line) + 1
            if groups[-1] and used + cost > self.max_input_tokens:
                groups.append([])
                used = 0
            groups[-1].append(line)
            used += cost
        return groups

    async def _ask(self, transcript: str, max_tokens: int) -> str:
        request = LLMRequest(
            messages=(
                ChatMessage(role="system", content=self.instructions),
                ChatMessage(
                    role="user",
                    content=(
                        f"<conversation>\n{transcript}\n</conversation>\n\n"
                        f"Summarize the conversation above in at most {max_tokens} tokens."
                    ),
                ),
            ),
            model=self.model,
            temperature=self.temperature,
            max_tokens=max_tokens,
        )
        base_url = getattr(self.client, "base_url", None)
        plan = ModelCallPlan(
            source="summarizer",
            prompt_tokens=self.counter.count_messages(request.messages),
            max_tokens=max_tokens,
            requested_model=self.model or getattr(self.client, "model", None) or None,
            base_url=base_url if isinstance(base_url, str) and base_url else None,
        )
        # A running agent refuses a call that could pass its cost limit: it is never made.
        await admit_model_call(plan)
        started = time.perf_counter()
        completion = await self.client.complete(request)
        usage = completion.usage
        if usage is None:  # the counter's counts, not 0: the call was made and billed
            usage = Usage(
                prompt_tokens=plan.prompt_tokens,
                completion_tokens=self.counter.count(completion.text),
                estimated=True,
            )
        await report_model_call(
            ModelCallReport(
                source="summarizer",
                usage=usage,
                finish_reason=completion.finish_reason,
                duration_ms=(time.perf_counter() - started) * 1000,
                model=completion.model,
                requested_model=plan.requested_model,
                base_url=plan.base_url,
                plan=plan,
            )
        )
        text = mend(completion.text).strip()  # it goes into the history: see `_unicode`
        if not text:
            raise ModelResponseError(
                "the model answered the summary request with no text "
                f"(finish reason {completion.finish_reason!r}); try another model or a larger cap"
            )
        # Models and servers do not always honour max_tokens: the counter has the last word.
        return truncate_to_tokens(text, max_tokens, self.counter.count)[0]
