"""`agent-flow serve --demo`: the offline run of `agent-flow demo`, served with the inspector.

A newcomer starts it with no model server and no key, opens the inspector and watches a run:
the same generated project, scripted model (`agent_flow._demo.scenario.demo_script`),
workspace tools and MCP server over stdio as `agent-flow demo`, built by the server as any
session's agent (the scripted model comes through `create_app`'s ``llm_factory``). The
approvals are the user's, in the inspector.

At start `start_demo_session` creates the session ``demo`` and sends it the demo's task, so
its run is under way when the page opens, streamed at a pace a person can follow; it stops at
the first command that needs approval until someone answers. A new session plays the script
again (whatever its first message says) after the project is put back as it was, the bug
included: sessions share the one project directory, so the demo is for one run at a time.
A follow-up message gets a scripted reply saying that the script has ended.
"""

from __future__ import annotations

import shlex
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from agent_flow._defaults import DEMO_SERVE_PACE
from agent_flow._demo.scenario import (
    DEMO_TASK,
    _python_path,
    create_project,
    demo_config,
    demo_script,
    mcp_command,
)
from agent_flow.config import AgentConfig
from agent_flow.llm.base import Completion, LLMRequest, StreamEvent
from agent_flow.testing import ScriptedLLM, reply

if TYPE_CHECKING:
    from fastapi import FastAPI

__all__ = [
    "DEMO_MODEL",
    "DEMO_SESSION",
    "DemoServer",
    "demo_server",
    "start_demo_session",
]

#: The id of the session `start_demo_session` creates (another id if the store has one).
DEMO_SESSION = "demo"
#: Its title.
DEMO_TITLE = "Demo: fix the csvstats bug (scripted model)"
#: The name the scripted model goes by (the one model ``GET /endpoints`` offers).
DEMO_MODEL = "scripted-coder"

_SCRIPT_ENDED = (
    "This is the demo's **scripted** model, and its script has ended: it cannot answer "
    "follow-ups. To watch the run again, open a *New session* and send any message. To talk "
    "to a real model, serve one: `agent-flow serve --config agent.toml` (see the README's "
    "*Connecting a model*)."
)


class _DemoModel(ScriptedLLM):
    """The demo's script, then, for every later call, a reply saying that it has ended."""

    async def complete(self, request: LLMRequest) -> Completion:
        self._extend()
        return await super().complete(request)

    def stream(self, request: LLMRequest) -> AsyncIterator[StreamEvent]:
        self._extend()
        return super().stream(request)

    def _extend(self) -> None:
        if not self.remaining:
            self.add(reply(_SCRIPT_ENDED))


@dataclass(frozen=True)
class DemoServer:
    """What `agent-flow serve --demo` serves: its agent config and scripted model.

    Attributes:
        base: The directory of the demo (the project, and the session store by default).
        project: The generated project the agent works on.
        config: The agent config (the demo's, with the project as its workspace and the demo
            MCP server over it).
        pace: Seconds between two streamed chunks of the scripted model.
    """

    base: Path
    project: Path
    config: AgentConfig
    pace: float

    def llm(self, config: AgentConfig) -> ScriptedLLM:
        """A new session agent's model: the script from its start, on a fresh project.

        The server's ``llm_factory``: called when a session's agent is built.
        """
        create_project(self.base)  # the bug back in, for a run that starts from the script's top
        test_command = f"{shlex.quote(sys.executable)} -m unittest discover -s tests -t ."
        model = config.resolved_llm().model if config.llm is not None else DEMO_MODEL
        return _DemoModel(demo_script(test_command), model=model, delay=self.pace)


def demo_server(base: Path, *, pace: float = DEMO_SERVE_PACE) -> DemoServer:
    """Write the demo project into `base` and describe the agent that works on it."""
    base.mkdir(parents=True, exist_ok=True)
    project = create_project(base)
    command = mcp_command(project)
    data = demo_config().model_dump(mode="json", exclude_unset=True)
    data.update(
        workspace=str(project),
        mcp_servers=[
            {
                "kind": "stdio",
                "name": "project",
                "command": command[0],
                "args": command[1:],
                "env": _python_path(),
            }
        ],
        # Never called (the scripted model stands in for it): it names the model sessions
        # see in GET /endpoints and in their events.
        llm={"model": DEMO_MODEL},
    )
    return DemoServer(
        base=base, project=project, config=AgentConfig.model_validate(data), pace=pace
    )


async def start_demo_session(app: FastAPI) -> str:
    """Create the demo session in `app`'s server and start its run; return its id."""
    from agent_flow.server._errors import ApiError
    from agent_flow.server._manager import SessionManager
    from agent_flow.server.models import CreateSession

    manager: SessionManager = app.state.manager
    try:
        info = await manager.create(CreateSession(session_id=DEMO_SESSION, title=DEMO_TITLE))
    except ApiError as err:
        if err.status != 409:
            raise
        info = await manager.create(CreateSession(title=DEMO_TITLE))  # a store used before
    await manager.send(info.id, DEMO_TASK)
    return info.id
