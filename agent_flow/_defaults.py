"""The library's defaults, in one place: every config field and constructor reads them here.

`AgentConfig` / `ContextConfig` and the classes they configure (`ContextManager`,
`ToolExecutor`, `SummarizeOldest`, MCP server configs) take their defaults from here, so a
part built directly and the same part built from a config behave alike. The module imports
nothing from the library.
"""

from __future__ import annotations

import os
from typing import Final

# -- the prompt budget (ContextConfig, ContextManager) ----------------------------------------

DEFAULT_MAX_TOKENS: Final = 32_000
"""The prompt budget of an agent whose config does not set one (``context.max_tokens``)."""

DEFAULT_RESERVE_OUTPUT_TOKENS: Final = 2048
"""Tokens kept free for the model's answer, when the budget is large enough (see below)."""

RESERVE_OUTPUT_DIVISOR: Final = 4
"""A small budget gives at most ``1 / RESERVE_OUTPUT_DIVISOR`` of itself to the default reserve.

An unset reserve is ``min(DEFAULT_RESERVE_OUTPUT_TOKENS, max_tokens // 4)``, so that
``ContextConfig(max_tokens=1000)`` works (its reserve is 250) instead of failing on a field
the user never set. An explicit reserve is taken as given.
"""

DEFAULT_ENVIRONMENT_ALLOCATION: Final = 0.3
"""The environment's share of what the fixed costs leave of the budget."""

DEFAULT_ENVIRONMENT_PLACEMENT: Final = "system"
"""Where the rendered environment goes in a prompt: at the system template's ``{environment}``
(``"last"``: a system message of its own after the history; see `ContextConfig`)."""

DEFAULT_PRUNE_TARGET: Final = 0.8
"""Pruning shrinks the history to this fraction of its budget, so it does not run every step."""

DEFAULT_WINDOW_TURNS: Final = 8
"""Turns kept by the ``sliding_window`` pruning strategy."""

DEFAULT_SUMMARY_TOKENS: Final = 512
"""The most prompt tokens one summary (``History.summarize``, ``SummarizeOldest``) may cost."""

DEFAULT_SYSTEM_PROMPT_TEMPLATE: Final = (
    "You are a capable assistant that completes tasks by calling tools when they help.\n"
    "{task}\n"
    "The environment below is your working memory: the current state of the task, what is "
    "known, and the workspace. Trust it over older messages.\n\n"
    "{environment}"
)
"""The system message of an agent without its own prompt.

``{task}`` becomes a "Current task: ..." line (the task's objective), ``{environment}`` the
rendered environment.
"""

# -- the loop (AgentConfig) --------------------------------------------------------------------

DEFAULT_MAX_ITERATIONS: Final = 25
"""Model calls per run before the run stops."""

DEFAULT_MAX_TOOL_CALLS_PER_TURN: Final = 64
"""Tool calls of one answer that run; each one past them gets an error result saying so (a
model server that answers with thousands would otherwise start them all at once)."""

# -- model calls (OpenAIClient, LLMConfig) ------------------------------------------------------

DEFAULT_CONNECT_TIMEOUT: Final = 10.0
"""Seconds to wait for the model server to accept a connection."""

DEFAULT_FIRST_BYTE_TIMEOUT: Final = 120.0
"""Seconds a streamed answer may take to start (the response and its first chunk)."""

DEFAULT_CHUNK_TIMEOUT: Final = 60.0
"""Seconds a streamed answer may go silent between two chunks."""

DEFAULT_REQUEST_TIMEOUT: Final = 600.0
"""Seconds one attempt at a model call may take in all (a non-streamed answer included)."""

DEFAULT_MODEL_RETRIES: Final = 2
"""Retries of a model call that failed in a way that may pass (so 3 attempts in all)."""

RETRY_BASE_DELAY: Final = 0.5
"""Seconds before the first retry when the server gives no ``Retry-After`` (doubling, jittered)."""

RETRY_MAX_DELAY: Final = 30.0
"""The longest wait between attempts; a longer ``Retry-After`` is not waited for."""

# -- tools (AgentConfig, ToolExecutor, MCP servers) --------------------------------------------

DEFAULT_TOOL_TIMEOUT: Final = 60.0
"""Seconds one tool call (an MCP server's included) may run unless its tool says otherwise."""

DEFAULT_MAX_TOOL_OUTPUT_TOKENS: Final = 4000
"""Token limit of one tool result as the model sees it (the full result is kept)."""

LARGE_TEXT_CHARS: Final = 64 * 1024
"""A text longer than this (characters) is counted on the tool threads, not on the event loop:
a tool result (redacted and cut to its token limit there) and a run's user message. Counting
a megabyte of new text takes most of a second, which every other run on the loop would wait;
a shorter text costs less than the hand-off."""

MCP_RESTART_WINDOW_SECONDS: Final = 600.0
"""Seconds a restart of an MCP server (or a new HTTP session) counts against its
``max_restarts``: a server that crash-loops is given up on, one that restarts now and then (a
deploy, a nightly restart) keeps its tools for the life of the process."""

MCP_HTTP_MAX_MESSAGE_BYTES: Final = 64 * 1024 * 1024
"""The largest message an MCP server may stream over HTTP (one SSE event). The SDK's own
limit, 1 MiB, read every larger tool result as a lost connection and restarted the server for
it; a bound remains, so that a server cannot make the agent buffer without end."""

TOOL_THREADS_MAX: Final = min(32, (os.cpu_count() or 1) + 4)
"""The most threads sync tools run on at once (`asyncio.to_thread`'s default pool's size)."""

TOOL_THREAD_PATIENCE_SECONDS: Final = 0.02
"""How long every tool thread must have been inside one call, while calls wait, before one
more starts (a thread may wait 5 ms for the GIL between two calls: well above that)."""

TOOL_THREAD_LINGER_SECONDS: Final = 10.0
"""Idle seconds after which a tool thread beyond the first leaves."""

MIN_OUTPUT_TOKENS: Final = 32
"""The smallest tool output limit accepted: room for the truncation marker and some content.

`AgentConfig.max_tool_output_tokens` validates against it too, so a config that loads never
fails later when its tool executor is built.
"""


DEFAULT_REPLAY_MAX_WAIT: Final = 5.0
"""The longest pause (seconds, after `--speed`) `agent-flow replay` makes between two events.

Runs of one session can be hours apart; a replay shows such a gap as this pause instead.
"""


def default_reserve_output_tokens(max_tokens: int) -> int:
    """The output reserve of a budget of `max_tokens` whose reserve is not set.

    ``min(DEFAULT_RESERVE_OUTPUT_TOKENS, max_tokens // RESERVE_OUTPUT_DIVISOR)``: the usual
    2,048 tokens, or a quarter of a budget too small for that. Always smaller than a positive
    `max_tokens`.
    """
    return min(DEFAULT_RESERVE_OUTPUT_TOKENS, max_tokens // RESERVE_OUTPUT_DIVISOR)


# -- durable runs (agent_flow.durable) ---------------------------------------------------

DURABLE_QUEUE: Final = "agent_flow_runs"
"""The DBOS queue durable runs are enqueued on."""

DURABLE_APP_NAME: Final = "agent_flow"
"""The DBOS application name the processes of one deployment share."""

DURABLE_POLL_SECONDS: Final = 0.2
"""On a SQLite system database, how often a worker looks for queued runs (and, every fifth
look, for the runs of workers that died)."""

DURABLE_IDLE_SECONDS: Final = 5.0
"""On a PostgreSQL system database, where enqueuing a run notifies the workers (LISTEN/NOTIFY),
how often an idle worker still looks for queued runs (a notification lost while its connection
was down) and for the runs of workers that died."""

DURABLE_NOTIFY_COALESCE_SECONDS: Final = 0.25
"""How often DBOS pushes its own events' notifications from a worker (DBOS: every 10 ms)."""

DURABLE_DBOS_HOUSEKEEPING_SECONDS: Final = 30.0
"""How often a worker lets DBOS sweep for what agent_flow does not use: delayed workflows,
DBOS workflow timeouts, its internal queue (DBOS: every second; `agent_flow.durable._wake`)."""

DURABLE_CANCEL_CHECK_SECONDS: Final = 0.5
"""How often, at most, a running durable run reads whether it was cancelled (one status read)."""

DURABLE_CANCEL_SETTLE_SECONDS: Final = 600.0
"""How long `RunHandle.outcome` waits for a cancelled run's execution to stop and store its
end (it stops at its next model or tool call; a call under way finishes first)."""

DURABLE_STORE_OUTAGE_SECONDS: Final = 300.0
"""How long a durable run whose session store fails (a step not recorded, a claim lost to an
outage, a read refused) keeps being recovered in place before its workflow fails."""

DURABLE_RECORD_RETRY_SECONDS: Final = 0.5
"""The pause before the first such recovery; each next pause doubles, up to
`DURABLE_RECORD_RETRY_MAX_SECONDS`."""

DURABLE_RECORD_RETRY_MAX_SECONDS: Final = 10.0
"""The longest pause between two recoveries of a run whose store fails."""

DURABLE_CLAIM_WAIT_SECONDS: Final = 600.0
"""How long a durable run waits for its session's claim (another execution of the run, or
another run of the session, holding it) before it fails; a dead holder's claim expires within
`SESSION_LEASE_SECONDS`."""

DURABLE_SQLITE_FILE: Final = "durable.sqlite"
"""DBOS's system database beside the session store when ``[durable]`` names none."""


# -- following a session's events (SessionStore.wait_for_events / follow_events) -----------

EVENTS_POLL_SECONDS: Final = 0.1
"""How often a follower re-reads a SQLite or memory store for events other processes saved."""

EVENTS_NOTIFIED_POLL_SECONDS: Final = 2.0
"""A PostgreSQL follower's re-read when no notification came (a safety net, not the path)."""

EVENTS_RECONNECT_SECONDS: Final = 1.0
"""How long a PostgreSQL store's LISTEN connection waits before reconnecting after a loss."""

DURABLE_STATE_SECONDS: Final = 5.0
"""A server following a durable run asks DBOS for its state after this long without events."""

#: The pruning strategies by name (`agent_flow.config.StrategyName` spells the same names).
PRUNING_STRATEGIES: Final = ("elide_then_drop", "drop_oldest", "sliding_window", "summarize")


# -- session ownership (SessionRecorder, the stores' leases) ----------------------------------

SESSION_LEASE_SECONDS: Final = 30.0
"""How long a run's claim on its session lasts unless renewed (every third of it).

A process that dies leaves its claim to expire: another may run the session after at most
this long. A run that cannot renew within it stops (its writes would be refused anyway).
"""

SESSION_DELETE_WAIT_SECONDS: Final = 5.0
"""How long a server's ``DELETE`` of a session whose run it has just cancelled waits for that
run to give the session's claim back (a durable worker stops within a moment of its cancel)
before it answers 409 ``run_in_progress``."""

SERVER_CONTEXT_PROBE_SECONDS: Final = 2.0
"""How long `run` and `chat` wait for a local model server to report its context size (a local
server answers in milliseconds; one that does not answer leaves the budget as configured)."""


# -- the inspector (agent-flow serve) ---------------------------------------------------------

INSPECTOR_PROMPTS_KEPT: Final = 16
"""Prompts a live session of the server keeps, as sent, for the inspector (its latest steps)."""

INSPECTOR_PROMPT_CHARS: Final = 2_000_000
"""Characters those prompts may hold together per session (the oldest go first; the latest
one is always kept), so a long-context session costs a bounded amount of memory."""

DEMO_SERVE_PACE: Final = 0.1
"""Seconds between two chunks the scripted model of ``agent-flow serve --demo`` streams: its run
takes about 40 s (besides the time its approvals wait), a pace a person can follow."""


# -- delegation (agent_flow.delegation) -------------------------------------------------------

DEFAULT_DELEGATION_TIMEOUT: Final = 600.0
"""Seconds a delegated child run may take (its tool call's timeout): a child makes several
model calls, so the tool default (`DEFAULT_TOOL_TIMEOUT`) would cut most of them short."""

DEFAULT_MAX_CONCURRENT_CHILDREN: Final = 4
"""Children of one `Delegate` running at once (more calls in one step wait for a slot)."""

DELEGATION_PARENT_TASK: Final = "/extensions/parent_task"
"""Where a child finds the parent's ``/task`` pointers it was given (its own ``/task`` is its
sub-task): ``/task/objective`` is projected to ``/extensions/parent_task/objective``."""
