"""A failure nothing expects is a JSON 500 ``internal_error``; its cause stays in the log.

Starlette answers an exception no handler takes with the plain text "Internal Server Error".
The service answers it with an `ErrorBody` like every other refusal, and says nothing of the
cause (it may name a host, a path or a secret); the server's log has it.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest

pytest.importorskip("fastapi", reason="the server tests need the 'server' extra")

from agent_flow.config import AgentConfig, ContextConfig
from agent_flow.server import create_app
from agent_flow.sessions import InMemorySessionStore
from agent_flow.testing import ScriptedLLM
from tests.server_harness import serving

SECRET = "postgresql://admin:hunter2@db.internal/agents"


class BrokenStore(InMemorySessionStore):
    """A store whose listing fails with what no handler expects (not a `StoreError`)."""

    async def list(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"bug while listing {SECRET}")


async def test_an_unexpected_failure_is_a_json_500_that_keeps_its_cause_in_the_log(
    caplog: pytest.LogCaptureFixture,
) -> None:
    config = AgentConfig(context=ContextConfig(counter="approx"))
    app = create_app(config, store=BrokenStore(), llm_factory=lambda config: ScriptedLLM([]))
    with caplog.at_level(logging.ERROR):
        async with serving(app) as client:
            answer = await client.get("/sessions")
            assert answer.status_code == 500
            assert answer.headers["content-type"] == "application/json"
            assert answer.json() == {
                "code": "internal_error",
                "message": "the server failed while answering (its log says why)",
                "field": None,
                "run_id": None,
            }
            assert "hunter2" not in answer.text and "db.internal" not in answer.text
            # The server goes on answering.
            assert (await client.get("/endpoints")).status_code == 200
    logged = "\n".join(
        f"{record.getMessage()} {record.exc_info[1] if record.exc_info else ''}"
        for record in caplog.records
    )
    assert "bug while listing" in logged
