"""Durable runs on DBOS: runs as workflows, model and tool calls checkpointed, worker processes.

Optional (``pip install 'agent-flow[durable]'``): nothing imports this package unless a
config says ``[durable] enabled = true`` or a program imports it. See the README's
"Deployment" section for the picture, the configuration, and what recovery guarantees.

- `DurableClient` enqueues a run and returns a `RunHandle` to await or poll its outcome.
- `DurableWorker` executes queued runs in this process and recovers those of dead workers.
- `DurableConfig` is the ``[durable]`` table (`load_durable_config` reads it); it needs no
  DBOS, so reading a config never does (the other names import ``dbos`` on first use).
- `StepRecordError` stops a run whose step could not be recorded (the store failed);
  `DurableReplayError`, one of them, a recovered run whose steps differ from the records.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from agent_flow._checkpoints import StepRecordError
from agent_flow.durable.config import DurableConfig, load_durable_config

if TYPE_CHECKING:
    from agent_flow.durable._steps import DurableReplayError
    from agent_flow.durable.client import DurableClient, RunHandle, RunState
    from agent_flow.durable.worker import DurableWorker

__all__ = [
    "DurableClient",
    "DurableConfig",
    "DurableReplayError",
    "DurableWorker",
    "RunHandle",
    "RunState",
    "StepRecordError",
    "load_durable_config",
]

_LAZY = {
    "DurableClient": "agent_flow.durable.client",
    "RunHandle": "agent_flow.durable.client",
    "RunState": "agent_flow.durable.client",
    "DurableWorker": "agent_flow.durable.worker",
    "DurableReplayError": "agent_flow.durable._steps",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
