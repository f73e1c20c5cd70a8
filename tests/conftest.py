"""Test settings, shared fixtures, and the guard that keeps every test off the real model APIs.

Shared fixtures: ``openai_server``, a started scripted OpenAI-compatible server on
127.0.0.1. Shared helper functions are in ``tests/helpers.py``.

Tests talk to loopback servers they start (``tests/openai_server.py``, the MCP servers in
``tests/mcp_servers/``) or to scripted models. `_no_real_network_requests` makes anything
else fail loudly: it removes the variables that point clients at a real API (keys, base
URLs), and patches httpx2's transports, which the openai SDK and the MCP SDK send through, so
that a request to a host that is not loopback fails the test with a message saying where it
went. The failure is a `pytest.fail`, which no ``except Exception`` in the code under test
can swallow; the attempt is also recorded, and `_fail_on_real_network_requests` fails the
test at teardown should the code under test have swallowed even that.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import AsyncIterator, Iterator

import httpx2
import pytest
from hypothesis import HealthCheck, settings

from tests.openai_server import OpenAIServer

# Fixtures that live with their harnesses: `fleet` and `store_url` (two `agent-flow serve`
# processes on one PostgreSQL store), `private_cluster` (a PostgreSQL server of the test's own).
pytest_plugins = ["pytester", "tests.fleet_harness", "tests.private_postgres"]

# CI has 2 cores shared with other jobs: no deadlines, and no complaints about slow data.
settings.register_profile("default", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("default")

# Variables that would send a client to a real API or authenticate it there, and the
# AGENT_FLOW_* config overrides (a developer's shell must not change what tests load).
_REMOVED_VARIABLES = ("OPENAI_", "AZURE_OPENAI_", "GEMINI_API_KEY", "AGENT_FLOW_")
_KEPT_VARIABLES = frozenset({"AGENT_FLOW_HOME", "AGENT_FLOW_TEST_POSTGRES"})

_ATTEMPTS: list[str] = []


def _is_loopback(host: str) -> bool:
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _refuse_if_remote(request: httpx2.Request) -> None:
    if _is_loopback(request.url.host):
        return
    where = f"{request.method} {request.url.copy_with(query=None)}"
    _ATTEMPTS.append(where)
    pytest.fail(
        f"a test made a real network request ({where}); tests must talk to a loopback "
        "server they start (tests/openai_server.py) or a scripted model "
        "(agent_flow.testing.ScriptedLLM)",
        pytrace=False,
    )


@pytest.fixture(scope="session", autouse=True)
def _no_real_network_requests() -> Iterator[None]:
    """For the whole session: no model credentials, and only loopback HTTP."""
    sync_send = httpx2.HTTPTransport.handle_request
    async_send = httpx2.AsyncHTTPTransport.handle_async_request

    def guarded_sync(self: httpx2.HTTPTransport, request: httpx2.Request) -> httpx2.Response:
        _refuse_if_remote(request)
        return sync_send(self, request)

    async def guarded_async(
        self: httpx2.AsyncHTTPTransport, request: httpx2.Request
    ) -> httpx2.Response:
        _refuse_if_remote(request)
        return await async_send(self, request)

    with pytest.MonkeyPatch.context() as patch:
        for name in list(os.environ):
            if name.startswith(_REMOVED_VARIABLES) and name not in _KEPT_VARIABLES:
                patch.delenv(name)
        patch.setattr(httpx2.HTTPTransport, "handle_request", guarded_sync)
        patch.setattr(httpx2.AsyncHTTPTransport, "handle_async_request", guarded_async)
        yield


@pytest.fixture(autouse=True)
def _fail_on_real_network_requests() -> Iterator[None]:
    """Fail a test during which a real request was attempted, even if it was swallowed."""
    before = len(_ATTEMPTS)
    yield
    if len(_ATTEMPTS) > before:
        pytest.fail(f"real network requests were attempted: {_ATTEMPTS[before:]}", pytrace=False)


@pytest.fixture
def real_request_attempts() -> list[str]:
    """The attempts the guard refused so far (a test that provokes one removes it again)."""
    return _ATTEMPTS


@pytest.fixture
async def openai_server() -> AsyncIterator[OpenAIServer]:
    """A started scripted OpenAI-compatible server on 127.0.0.1, stopped after the test."""
    async with OpenAIServer() as server:
        yield server
