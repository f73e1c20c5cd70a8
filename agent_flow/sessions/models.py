"""What a store says about a session: its status, description, state, checkpoints and lease.

`SessionStatus`, `SessionInfo`, `SessionState`, `Checkpoint`, `Lease`, and how stored events are
numbered (`event_id`). These are what crosses the store's boundary; the session id rules
(`_check_id`) live with them.

Event ids. Every stored event has an id, unique in its session and never reused, even across
crashes: an event written under a lease with fencing number ``F`` and sequence number ``s`` gets
`event_id` ``(F, s) = F * 2**32 + s``; an event written without a lease gets the session's last
id plus one (so it sorts after everything). A store refuses a write whose ids would not all be
above the session's last id, so reading on from the last id seen (``after_id``) never misses or
repeats an event. Sessions stored before ids existed keep their positions as ids; a fenced id
is at least ``2**32``, so they stay first.

A delegated child's events (``event.path`` names the runs above it) are stored in the session of
the top-level run they belong to, numbered in that run's sequence (`numbering_run`): one run,
one tree, one sequence of ids.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final, Literal, TypeAlias

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field

from agent_flow._types import JsonObject
from agent_flow.environment import Environment
from agent_flow.errors import UserError
from agent_flow.events import AgentEvent
from agent_flow.history import History, HistoryEntry
from agent_flow.tokens import TokenCounter

__all__ = [
    "EVENT_ID_RUN_BITS",
    "Checkpoint",
    "Lease",
    "SessionInfo",
    "SessionState",
    "SessionStatus",
    "event_id",
    "numbering_run",
]

#: What a session is doing: ``active`` (running or resumable), ``waiting`` (for the user, e.g.
#: an approval or a question), ``completed``, ``failed``, ``cancelled`` or ``interrupted`` (the
#: process running it died; the next claim of the session found its lease expired).
SessionStatus: TypeAlias = Literal[
    "active", "waiting", "completed", "failed", "cancelled", "interrupted"
]
_STATUSES: frozenset[str] = frozenset(
    ("active", "waiting", "completed", "failed", "cancelled", "interrupted")
)

_ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")

#: How many low bits of an event id hold the event's ``seq`` (the rest: the fencing number).
EVENT_ID_RUN_BITS: Final = 32


def numbering_run(event: AgentEvent) -> str:
    """The run whose sequence numbers `event`: the top-level run of its tree.

    A delegated child's events carry the child's ``run_id`` and the runs above it in ``path``
    (outermost first); their ``seq`` is the top-level run's (``path[0]``).
    """
    return event.path[0] if event.path else event.run_id


def event_id(fence: int, seq: int) -> int:
    """Return the id of event `seq` written under the lease whose fencing number is `fence`.

    ``fence * 2**EVENT_ID_RUN_BITS + seq``: ids of a later lease are above every id of an
    earlier one, whatever their sequence numbers.

    Raises:
        UserError: `fence` is below 1, or `seq` is negative or needs more than 32 bits.
    """
    if fence < 1 or not 0 <= seq < 1 << EVENT_ID_RUN_BITS:
        raise UserError(
            f"no event id for fence {fence} and seq {seq}: fences start at 1 and a seq must "
            f"be 0 to {(1 << EVENT_ID_RUN_BITS) - 1}"
        )
    return (fence << EVENT_ID_RUN_BITS) + seq


class Lease(BaseModel):
    """A run's claim on a session: while it lasts, that run alone writes the session.

    `SessionStore.claim` returns it, `SessionStore.renew` extends it, `SessionStore.release`
    ends it; every write of the run carries its `fence` and run (``save_step(...,
    fence=lease.fence, lease_run=lease.run_id)``), and the store refuses a write whose lease is
    no longer the session's (`LeaseLostError`).

    Attributes:
        session_id: The session claimed.
        run_id: The run that holds it.
        holder: Who runs that run (``pid@host:pidns``, a DBOS executor id...), for people
            reading it.
        fence: The fencing number: 1 for the session's first claim, one more for each claim
            after (a released lease's number is never given again).
        expires_at: When the lease ends unless renewed (by the store's clock; PostgreSQL's
            for a PostgreSQL store).
        interrupted_run: The run whose lease this claim found expired and unreleased (its
            holder died) and that had no `RunFinished` stored: the claim stored one for it,
            with stop reason ``interrupted``, and set the session's status to
            ``interrupted``. None otherwise.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    session_id: str
    run_id: str
    holder: str
    fence: int = Field(ge=1)
    expires_at: AwareDatetime
    interrupted_run: str | None = None


class SessionInfo(BaseModel):
    """What a store knows about a session without loading it.

    Attributes:
        id: The session id (letters, digits and ``._:-``, at most 128 characters).
        agent: The name of the agent that runs it.
        title: A human title (the first task, typically).
        created_at: When it was created.
        updated_at: When it was last saved.
        status: What it is doing (`SessionStatus`).
        steps: How many steps were saved.
        entry_count: History entries stored now (after any pruning).
        event_count: Events stored, over all runs.
        environment_version: The stored environment's version (0 before the first step).
        metadata: Free JSON the caller attached at creation.
        task: The task the session was created for, whole (the title may be shortened); kept
            so that a session stopped before its first step was saved still has it.
        model_calls: Model calls over all runs, the summarizer's included (one per
            ``ModelResponded`` event stored).
        prompt_tokens: Prompt tokens of those calls, summed.
        completion_tokens: Completion tokens of those calls, summed.
        cost_usd: What those calls cost in US dollars, summed; ``None`` (unknown) as soon as
            one call's price is unknown, never a misleading 0 (0.0 before any call).
        unpriced_calls: Calls whose price is unknown (``cost_usd`` is None when above 0).
        estimated_calls: Calls whose usage agent_flow counted itself because the server
            reported none (see `agent_flow.llm.Usage.estimated`).
        owner: The user who created it (the server's user name); None for sessions stored
            before owners existed, or created without a user. The server treats None as its
            admin's. At most 200 characters.
        last_event_id: The highest event id stored (see `event_id`); -1 before any event.
        lease_run: The run holding the session's lease (`Lease`), None when none does; it
            may have expired, see `SessionStore.claim`. Read-only: only claims change it.
        lease_fence: The fencing number of the session's latest claim (0: never claimed).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str
    agent: str
    title: str
    created_at: AwareDatetime
    updated_at: AwareDatetime
    status: SessionStatus
    steps: int = Field(ge=0)
    entry_count: int = Field(ge=0)
    event_count: int = Field(ge=0)
    environment_version: int = Field(ge=0)
    metadata: JsonObject = Field(default_factory=dict)
    task: str | None = None
    model_calls: int = Field(default=0, ge=0)
    prompt_tokens: int = Field(default=0, ge=0)
    completion_tokens: int = Field(default=0, ge=0)
    cost_usd: float | None = Field(default=0.0, ge=0)
    unpriced_calls: int = Field(default=0, ge=0)
    estimated_calls: int = Field(default=0, ge=0)
    owner: str | None = Field(default=None, max_length=200)
    last_event_id: int = Field(default=-1, ge=-1)
    lease_run: str | None = None
    lease_fence: int = Field(default=0, ge=0)


@dataclass(frozen=True, slots=True)
class SessionState:
    """A loaded session: what `SessionStore.load` returns.

    Attributes:
        info: The session's description.
        entries: Its history entries, in order, as saved at the last step.
        environment: Its environment as saved at the last step; None before the first step.
    """

    info: SessionInfo
    entries: tuple[HistoryEntry, ...]
    environment: Environment | None

    def history(self, *, counter: TokenCounter | None = None) -> History:
        """Return a new `History` of the entries, counted with `counter` (default counter if None).

        Raises:
            UserError: The entries break the history's unit rules (never for saved entries).
        """
        return History(self.entries, counter=counter)


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """One recorded unit of a durable run's work: what a recovery replays instead of redoing it.

    A durable run (`agent_flow.durable`) records each model call and each tool call it makes;
    the store keeps them with the session, written in the transaction of the step they belong
    to (`SessionStore.save_step`) or, for a step that must be on disk before its effect
    happens, at once (`SessionStore.save_checkpoints`). They are not part of an export: they
    matter only while their run may still be recovered.

    Attributes:
        run_id: The run that made it.
        position: Its place in the run's sequence of checkpoints, from 0.
        name: What it records (``model_call``, ``tool:NAME``...): a replay checks it matches.
        result: The recorded result, as the code that made it wrote it (JSON text).
    """

    run_id: str
    position: int
    name: str
    result: str


def _check_id(session_id: str) -> str:
    if not isinstance(session_id, str) or not _ID_PATTERN.fullmatch(session_id):
        raise UserError(
            f"session id {session_id!r} is not valid; use 1 to 128 letters, digits or '._:-', "
            "starting with a letter or digit"
        )
    return session_id
