"""Every route of the OpenAPI document FastAPI generates, fuzzed with schemathesis: no 5xx.

The server is a real uvicorn on a loopback port (in a thread: schemathesis calls it with the
blocking `requests`); each route gets a bounded number of generated requests so CI stays fast.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Iterator

import pytest

pytest.importorskip("fastapi", reason="the server tests need the 'server' extra")

import schemathesis
import uvicorn
from hypothesis import HealthCheck, Phase, given, settings

from agent_flow.config import AgentConfig, ContextConfig
from agent_flow.server import ServerSettings, create_app
from agent_flow.sessions import InMemorySessionStore
from agent_flow.testing import FunctionLLM, reply

EXAMPLES_PER_ROUTE = 30


@pytest.fixture(scope="module")
def base_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root = tmp_path_factory.mktemp("roots")
    app = create_app(
        AgentConfig(context=ContextConfig(counter="approx")),
        store=InMemorySessionStore(),
        settings=ServerSettings(max_body_bytes=20_000, workspace_roots=(root,)),
        llm_factory=lambda config: FunctionLLM(lambda request: reply("ok")),
    )
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=lambda: asyncio.run(server.serve(sockets=[sock])))
    thread.start()
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join()
        sock.close()


def test_no_route_answers_5xx_to_generated_requests(base_url: str) -> None:
    schema = schemathesis.openapi.from_url(f"{base_url}/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 11
    failures: list[str] = []
    for operation in operations:

        @given(case=operation.as_strategy())
        @settings(
            max_examples=EXAMPLES_PER_ROUTE,
            phases=[Phase.explicit, Phase.generate],
            suppress_health_check=list(HealthCheck),
            deadline=None,
        )
        def fuzz(case: object) -> None:
            response = case.call(base_url=base_url, timeout=30)  # type: ignore[attr-defined]
            if response.status_code >= 500:
                failures.append(f"{case.method} {case.formatted_path}: {response.status_code}")  # type: ignore[attr-defined]

        fuzz()
    assert failures == []
