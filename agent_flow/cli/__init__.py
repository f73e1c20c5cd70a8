"""The ``agent-flow`` command: run an agent, chat, the demo, sessions and replays, tools.

::

    agent-flow run "task" [--model M] [--base-url URL] [--workspace DIR] [--mcp "cmd args"] ...
    cat notes.txt | agent-flow run "summarize" -q   piped text follows the task; -q: answer only
    agent-flow chat [same options]            a conversation over one session, line-edited
    agent-flow demo [--slow]                  a complete run offline, with a scripted model
    agent-flow sessions list | show ID | export ID [--output FILE] | import FILE | delete ID
    agent-flow sessions diff A B [--json]     two sessions' environments and budgets compared
    agent-flow replay SESSION [--speed X]     a session's events again, paced as recorded
    agent-flow tools [--workspace DIR] [--mcp "cmd args"]   what an agent is offered, in tokens
    agent-flow lab SESSION... --budget N [--strategy S] [--html FILE]   the pruning lab

A run shows a status line, then the answer as Markdown; ``--trace`` prints every event,
``-q`` only the answer, ``--json`` the events as JSON lines. ``--agent MODULE:ATTR`` runs an
agent defined in Python (`agent_flow.cli._user_agent`). Runs talk to any OpenAI-compatible
endpoint; the key comes from ``OPENAI_API_KEY`` (or the
variable named by ``--api-key-env``) and is never printed. Every run is stored as it goes in
a SQLite session store (``--db``, default `agent_flow.sessions.default_store_path`), so a run
that is interrupted can be continued with ``--session ID``.

Exit codes:

- 0: the run finished: the task was completed, answered, or the agent waits for a reply;
- 1: the run ended without finishing (iteration, token or cost limit, stuck, invalid output),
  or the session store failed;
- 2: a usage or configuration error: a bad flag, config key (named with its file) or
  ``AGENT_FLOW_*`` value (named), no API key, an unknown session, a budget too small for the
  tools, a workspace, store path or MCP server that cannot be used;
- 3: the model endpoint failed: unreachable, timed out, or it refused the key or the request;
- 130: cancelled with Ctrl-C; the session is kept;
- 143: ``run`` or ``chat`` stopped by SIGTERM; the session is kept, as with Ctrl-C.

Errors are one line on stderr, saying what is wrong and what to do.
"""

from __future__ import annotations

from agent_flow.cli._exit import (
    EXIT_CANCELLED,
    EXIT_MODEL,
    EXIT_OK,
    EXIT_RUN_FAILED,
    EXIT_USAGE,
)
from agent_flow.cli._main import main
from agent_flow.cli._parser import build_parser

__all__ = [
    "EXIT_CANCELLED",
    "EXIT_MODEL",
    "EXIT_OK",
    "EXIT_RUN_FAILED",
    "EXIT_USAGE",
    "build_parser",
    "main",
]
