"""Durable runs on DBOS: runs as workflows, model and tool calls as steps, worker processes.

Optional (``pip install 'agent-flow[durable]'``): nothing imports this package unless a
config says ``[durable] enabled = true`` or a program imports it. See the README's
"Deployment" section for the picture, the configuration, and what recovery guarantees.

- `DurableClient` enqueues a run and returns a `RunHandle` to await or poll its outcome.
- `DurableWorker` executes queued runs in this process and recovers those of dead workers.
- `DurableConfig` is the ``[durable]`` table (`load_durable_config` reads it).
"""

from __future__ import annotations

from agent_flow.durable.client import DurableClient, RunHandle, RunState
from agent_flow.durable.config import DurableConfig, load_durable_config
from agent_flow.durable.worker import DurableWorker

__all__ = [
    "DurableClient",
    "DurableConfig",
    "DurableWorker",
    "RunHandle",
    "RunState",
    "load_durable_config",
]
