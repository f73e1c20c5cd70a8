"""What the model saw at each step of a live session: `PromptTap`, `PromptLog` and the views.

The inspector shows, per step, the prompt as it was sent: every message with its tokens, and
the environment's part of the system message apart. The agent builds a prompt, publishes its
``context_built`` event (the per-section token counts), then calls its model client with it.
`SessionManager` wraps a session's model client in a `PromptTap`: the first model call after
a ``context_built`` event is that step's prompt, kept under the event's id (a retry of the
same call, or a summarizer's call while pruning, finds the step already kept and is not).

Bounded: a `PromptLog` keeps the latest `INSPECTOR_PROMPTS_KEPT` prompts of a session, and at
most `INSPECTOR_PROMPT_CHARS` characters of them (the oldest go first; the latest is always
kept). The tap lives with the session's agent: a session the server evicted or reloaded after
a restart, or one whose runs execute on durable workers, keeps no prompt of its earlier steps
(``GET /sessions/{id}/prompts/{event_id}`` answers 404 ``prompt_not_kept``); its stored
``context_built`` and ``environment_updated`` events still give every step's token counts and
environment changes.
"""

from __future__ import annotations

from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pydantic import BaseModel, Field

from agent_flow._defaults import INSPECTOR_PROMPT_CHARS, INSPECTOR_PROMPTS_KEPT
from agent_flow.events import ContextBuilt
from agent_flow.llm.base import Completion, LLMClient, LLMRequest, StreamEvent, prompt_format_of
from agent_flow.messages import ChatMessage, Role
from agent_flow.prompt import PromptBreakdown
from agent_flow.server._errors import ApiError

if TYPE_CHECKING:
    from agent_flow.context import ContextManager
    from agent_flow.server._live import LiveSession

__all__ = ["PromptLog", "PromptMessage", "PromptTap", "PromptToolCall", "PromptView", "prompt_of"]

#: How far back from the latest event a model call looks for its step's ``context_built``.
_STEP_LOOKBACK = 16


class PromptToolCall(BaseModel):
    """A tool call an assistant message of the prompt carries."""

    id: str
    name: str
    arguments: str = Field(description="As the model wrote them (JSON text).")


class PromptMessage(BaseModel):
    """One message of a prompt, as the client sent it, with what it cost."""

    role: Role
    content: str
    environment: str | None = Field(
        default=None,
        description="The rendered environment inside this (system) message's content, when "
        "it has one: the first message's (the rest of it is the system prompt template), or, "
        'with environment_placement "last", the whole content of the last message.',
    )
    name: str | None = None
    tool_call_id: str | None = None
    tool_calls: list[PromptToolCall] = Field(default_factory=list)
    tokens: int = Field(description="Its tokens, counted by the agent's token counter.")


class PromptView(BaseModel):
    """The prompt of one step: the messages sent, the tools offered, the per-section counts."""

    event_id: int = Field(description="The id of the step's `context_built` event.")
    run_id: str
    iteration: int
    format: str = Field(description='How the client sent it: "native", or "xml" tool mode.')
    breakdown: PromptBreakdown
    messages: list[PromptMessage]
    tools: list[str] = Field(description="The names of the tools offered with it.")


@dataclass(frozen=True, slots=True)
class KeptPrompt:
    """A prompt as a step sent it, under the id of its ``context_built`` event."""

    event_id: int
    event: ContextBuilt
    request: LLMRequest
    #: Where the environment is: the message's index and its (start, end) in its content.
    environment: tuple[int, int, int] | None
    chars: int


class PromptLog:
    """The latest prompts of one session, at most `keep` of them and `max_chars` together.

    The oldest go first; the latest added is always kept, however large.
    """

    def __init__(
        self, *, keep: int = INSPECTOR_PROMPTS_KEPT, max_chars: int = INSPECTOR_PROMPT_CHARS
    ) -> None:
        self.keep = keep
        self.max_chars = max_chars
        self._kept: deque[KeptPrompt] = deque()
        self.chars = 0

    def add(self, prompt: KeptPrompt) -> None:
        """Keep `prompt`, forgetting the oldest ones beyond the bounds."""
        self._kept.append(prompt)
        self.chars += prompt.chars
        while len(self._kept) > 1 and (len(self._kept) > self.keep or self.chars > self.max_chars):
            self.chars -= self._kept.popleft().chars

    def get(self, event_id: int) -> KeptPrompt | None:
        """The prompt of the step whose ``context_built`` event has `event_id`, if kept."""
        return next((kept for kept in self._kept if kept.event_id == event_id), None)

    def ids(self) -> list[int]:
        """The event ids of the kept prompts, oldest first."""
        return [kept.event_id for kept in self._kept]

    @property
    def latest(self) -> int | None:
        """The event id of the latest prompt kept."""
        return self._kept[-1].event_id if self._kept else None


class PromptTap:
    """A session's model client that keeps each step's prompt (see the module doc).

    Everything but the two calls goes to the wrapped client (its model name, its prompt
    format, its ``aclose``...).
    """

    def __init__(
        self, inner: LLMClient, live: LiveSession, *, log: PromptLog | None = None
    ) -> None:
        self.inner = inner
        self.live = live
        self.log = log if log is not None else PromptLog()
        #: The agent's context manager, once the agent is built (`attach`).
        self.context: ContextManager | None = None

    def attach(self, context: ContextManager) -> None:
        """Know the agent's context manager: its template and its token counter."""
        self.context = context

    def __getattr__(self, name: str) -> object:
        # Only called for what this class lacks: the wrapped client answers.
        return getattr(self.inner, name)

    # What a run asks of its client on every turn, answered without `__getattr__`'s detour
    # (a failed lookup first): the same answers, or the same `AttributeError`.
    @property
    def model(self) -> object:
        """The wrapped client's model."""
        return self.inner.model  # type: ignore[attr-defined]

    @property
    def prompt_format(self) -> object:
        """The wrapped client's prompt format."""
        return self.inner.prompt_format  # type: ignore[attr-defined]

    @property
    def base_url(self) -> object:
        """The wrapped client's base URL."""
        return self.inner.base_url  # type: ignore[attr-defined]

    async def complete(self, request: LLMRequest) -> Completion:
        """Keep the step's prompt, then ask the wrapped client."""
        self._keep(request)
        return await self.inner.complete(request)

    def stream(self, request: LLMRequest) -> AsyncIterator[StreamEvent]:
        """Keep the step's prompt, then stream from the wrapped client."""
        self._keep(request)
        return self.inner.stream(request)

    def _keep(self, request: LLMRequest) -> None:
        step = self._step()
        if step is None or step[0] == self.log.latest:
            return  # no step of this server's, or its prompt is kept already (a retry)
        event_id, event = step
        self.log.add(
            KeptPrompt(
                event_id=event_id,
                event=event,
                request=request,
                environment=self._environment_span(request.messages),
                chars=_chars(request.messages),
            )
        )

    def _step(self) -> tuple[int, ContextBuilt] | None:
        """The latest ``context_built`` event of the session's run, with its id."""
        buffer = self.live.buffer
        for index in range(len(buffer) - 1, max(-1, len(buffer) - 1 - _STEP_LOOKBACK), -1):
            event_id, event = buffer[index]
            if isinstance(event, ContextBuilt) and not event.path:  # the run's own, not a child's
                return event_id, event
        return None

    def _environment_span(self, messages: tuple[ChatMessage, ...]) -> tuple[int, int, int] | None:
        if self.context is None or not messages or messages[0].role != "system":
            return None
        if self.context.environment_placement == "last":
            last = len(messages) - 1
            if last == 0 or messages[last].role != "system":
                return None  # it rendered empty, or did not fit
            return last, 0, len(messages[last].content)
        # The same head and tail `build_prompt` put around the environment just now.
        head, tail, _ = self.context._template(None)
        content = messages[0].content
        if len(content) < len(head) + len(tail):
            return None
        if not (content.startswith(head) and content.endswith(tail)):
            return None  # rewritten on the way (XML tool mode fits it to the wire)
        return 0, len(head), len(content) - len(tail)


def _chars(messages: tuple[ChatMessage, ...]) -> int:
    """The characters of `messages` (a plain loop: it runs on every model call)."""
    chars = 0
    for message in messages:
        chars += len(message.content)
        if message.tool_calls:
            for tool_call in message.tool_calls:
                chars += len(tool_call.arguments)
    return chars


def prompt_of(live: LiveSession, event_id: int) -> PromptView:
    """The prompt of `live`'s step whose ``context_built`` event has `event_id`.

    Raises:
        ApiError: 404 ``prompt_not_kept`` when the session keeps no such prompt.
    """
    agent = live.agent
    tap = agent.llm if agent is not None else None
    kept = tap.log.get(event_id) if isinstance(tap, PromptTap) else None
    if kept is None or not isinstance(tap, PromptTap) or tap.context is None:
        raise ApiError(
            404,
            "prompt_not_kept",
            f"session {live.id!r} keeps no prompt of event {event_id}: a live session keeps "
            f"the prompts of its latest {INSPECTOR_PROMPTS_KEPT} steps, and one reloaded from "
            "the store (after a restart, or idle) or run by durable workers none; its "
            "context_built event still has the step's tokens per section",
            field="event_id",
        )
    form = prompt_format_of(tap.inner)
    wire, _ = form.render(kept.request.messages, kept.request.tools)
    environment, at = None, -1
    if kept.environment is not None:
        at, start, end = kept.environment
        text = kept.request.messages[at].content[start:end]
        # The client may add to the system message (the XML tools prompt); find it there.
        at = 0 if at == 0 else len(wire) - 1  # the same message as sent (XML merges others)
        found = wire and text and text in wire[at].content
        environment = text if found else None
    counter = tap.context.counter
    return PromptView(
        event_id=kept.event_id,
        run_id=kept.event.run_id,
        iteration=kept.event.iteration,
        format=form.name,
        breakdown=kept.event.breakdown,
        messages=[
            PromptMessage(
                role=message.role,
                content=message.content,
                environment=environment if index == at and message.role == "system" else None,
                name=message.name,
                tool_call_id=message.tool_call_id,
                tool_calls=[
                    PromptToolCall(id=c.id, name=c.name, arguments=c.arguments)
                    for c in message.tool_calls
                ],
                tokens=counter.count_message(message),
            )
            for index, message in enumerate(wire)
        ],
        tools=[tool.name for tool in kept.request.tools],
    )
