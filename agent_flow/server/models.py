"""The JSON bodies of the HTTP API: every request and response model, and `ErrorBody`."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from agent_flow._types import JsonObject
from agent_flow.prompt import PromptBreakdown
from agent_flow.sessions.models import SessionStatus

__all__ = [
    "ApprovalDecision",
    "ApprovalView",
    "CreateSession",
    "ErrorBody",
    "HistorySummary",
    "MessageAccepted",
    "NoOptions",
    "RunCancelled",
    "SendMessage",
    "SessionList",
    "SessionOptions",
    "SessionSummary",
    "SessionView",
]

#: What a session id may look like (the stores' own rule).
SESSION_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$"
#: What ``Last-Event-ID`` may hold: an event's id, or -1 (before the first event).
EVENT_ID_PATTERN = r"^(-1|[0-9]{1,19})$"
#: The largest event id (the stores keep ids as signed 64-bit integers).
MAX_EVENT_ID = 2**63 - 1


class ErrorBody(BaseModel):
    """Every 4xx answer: what went wrong, and which field (when one is to blame)."""

    code: str = Field(description="A stable machine name of the error, e.g. `not_found`.")
    message: str = Field(description="One sentence saying what is wrong and what to change.")
    field: str | None = Field(default=None, description="The offending field, dotted.")
    run_id: str | None = Field(default=None, description="The run in the way (409 only).")


class SessionOptions(BaseModel):
    """What a session chose on top of the server's agent config (stored with it)."""

    model_config = ConfigDict(extra="forbid")

    llm: str | None = Field(
        default=None,
        min_length=1,
        max_length=200,
        description="A model endpoint of this server, by name (GET /endpoints); default: "
        "the agent's own.",
    )
    model: str | None = Field(
        default=None,
        min_length=1,
        max_length=200,
        description="A model the endpoint allows (GET /endpoints); default: its first.",
    )
    base_url: str | None = Field(
        default=None,
        min_length=1,
        max_length=2000,
        pattern=r"^https?://",
        description="Your own OpenAI-compatible endpoint (an http(s) URL), only where the "
        "server allows client endpoints; such a session sends no key.",
    )
    workspace: str | None = Field(default=None, min_length=1, max_length=4000)
    skill: str | None = Field(default=None, min_length=1, max_length=200)
    max_tokens: int | None = Field(default=None, ge=256, le=10_000_000)


class CreateSession(SessionOptions):
    """Create a session: its options, and optionally its id and title."""

    session_id: str | None = Field(default=None, pattern=SESSION_ID_PATTERN)
    title: str = Field(default="", max_length=500)

    @field_validator("title")
    @classmethod
    def _no_nul(cls, title: str) -> str:
        # PostgreSQL's text columns take no NUL: refused here, whichever store is behind.
        if "\x00" in title:
            raise ValueError("a title may not contain the NUL character (U+0000)")
        return title


class NoOptions(BaseModel):
    """The body of an action that takes no options: ``{}``.

    Without tokens the server refuses a ``POST`` that is not ``Content-Type:
    application/json`` (415), which a web page's form cannot send; so such an action takes
    an empty JSON object (an empty body with that header is accepted too).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)


class SendMessage(BaseModel):
    """A user message: the task of the session's first run, or a follow-up."""

    model_config = ConfigDict(extra="forbid")

    message: str = Field(min_length=1, max_length=200_000)


class MessageAccepted(BaseModel):
    """A run started on the message; watch it on the session's event stream."""

    session_id: str
    run_id: str
    first_event_id: int = Field(description="The SSE id of the run's first event.")


class RunCancelled(BaseModel):
    """The run asked to stop; its ``run_finished`` event says when it has."""

    session_id: str
    run_id: str


class ApprovalDecision(BaseModel):
    """The answer to an ``approval_required`` event."""

    model_config = ConfigDict(extra="forbid")

    approved: bool
    reason: str = Field(default="", max_length=2000)


class ApprovalView(BaseModel):
    """A tool call waiting for approval."""

    call_id: str
    name: str
    arguments: JsonObject
    reason: str


class HistorySummary(BaseModel):
    """The shape of a session's history."""

    entries: int
    tokens: int
    kinds: dict[str, int] = Field(description="Entries per kind.")


class SessionSummary(BaseModel):
    """A session as listed, with its model calls, tokens and cost over all runs.

    The usage fields are the store's (`agent_flow.sessions.SessionInfo`): the summarizer's
    calls are included, and ``cost_usd`` is ``null`` (unknown) when ``unpriced_calls`` is
    above 0, never a misleading 0.
    """

    id: str
    title: str
    agent: str
    status: SessionStatus
    running: bool
    run_id: str | None
    created_at: datetime
    updated_at: datetime
    steps: int
    event_count: int
    model_calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float | None = Field(default=0.0, description="US dollars; null: unknown.")
    unpriced_calls: int = Field(default=0, description="Calls with no known price.")
    estimated_calls: int = Field(
        default=0, description="Calls whose usage agent_flow counted (the server reported none)."
    )


class SessionList(BaseModel):
    """Sessions, the most recently updated first."""

    sessions: list[SessionSummary]


class SessionView(SessionSummary):
    """One session in full: its options, environment, history, last prompt and approvals."""

    options: SessionOptions
    environment: JsonObject
    environment_version: int
    history: HistorySummary
    last_prompt: PromptBreakdown | None
    pending_approvals: list[ApprovalView]
    state: Literal["idle", "running"]
