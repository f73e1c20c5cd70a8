"""The server against its own OpenAPI document: schemathesis with all of its checks finds nothing.

The server is a real uvicorn on a loopback port (in a thread: schemathesis calls it with the
blocking `requests`), once without tokens and once with one. schemathesis runs as
``schemathesis run URL/openapi.json --checks all`` does, with the repository's
``schemathesis.toml``: its coverage, fuzzing and stateful phases and every check (no 5xx;
status codes, content types, headers and bodies as documented, SSE events included; invalid
data refused, valid data accepted; 405 with ``Allow`` for undocumented methods; no route
answering without the token; deleted sessions gone). Bounded for CI: at most `EXAMPLES`
generated requests per operation and phase, a fixed seed, no time budget (which would make
the fuzzing and stateful phases repeat until it is spent).
"""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("fastapi", reason="the server tests need the 'server' extra")

import schemathesis
import uvicorn
from schemathesis.config import CacheConfig, SchemathesisConfig
from schemathesis.engine import Status, from_schema
from schemathesis.engine import events as engine_events

from agent_flow.config import AgentConfig, ContextConfig
from agent_flow.server import ServerSettings, create_app
from agent_flow.sessions import InMemorySessionStore
from agent_flow.testing import FunctionLLM, reply

EXAMPLES = 25
SEED = 1
TOKEN = "schemathesis-token-0123456789"
#: Seconds an event stream is read (it stays open for live events) and a request may take.
REQUEST_TIMEOUT = 5.0
SETTINGS_FILE = Path(__file__).resolve().parents[1] / "schemathesis.toml"


@pytest.fixture(scope="module", params=[None, TOKEN], ids=["without-token", "with-token"])
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, dict[str, str]]]:
    """A live server's address, and the headers every request to it carries (its token)."""
    token: str | None = request.param
    root = tmp_path_factory.mktemp("roots")
    app = create_app(
        AgentConfig(context=ContextConfig(counter="approx")),
        store=InMemorySessionStore(),
        settings=ServerSettings(max_body_bytes=20_000, workspace_roots=(root,), token=token),
        llm_factory=lambda config: FunctionLLM(lambda request: reply("ok")),
    )
    # IPPROTO_TCP: asyncio sets TCP_NODELAY only where the socket's proto says TCP (without,
    # each answer waits out the client's delayed ACK: 40 ms a request).
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=lambda: asyncio.run(server.serve(sockets=[sock])))
    thread.start()
    try:
        headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
        yield f"http://127.0.0.1:{sock.getsockname()[1]}", headers
    finally:
        server.should_exit = True
        thread.join()
        sock.close()


def _config(headers: dict[str, str]) -> SchemathesisConfig:
    """The repository's settings with what ``--checks all -n EXAMPLES --seed SEED`` adds."""
    config = SchemathesisConfig.from_path(SETTINGS_FILE)
    config.update(seed=SEED, max_failures=None)
    # No replay of failures from earlier runs (nor a .schemathesis/ directory): the same run
    # every time.
    config.cache = CacheConfig(enabled=False)
    project = config.projects.override
    # A followed event stream never ends: schemathesis would read each one until the request
    # timeout. Here the streams hold the stored events only (`schemathesis run` reads live
    # ones too, for as long as --request-timeout says).
    project.update(
        headers=headers, request_timeout=REQUEST_TIMEOUT, parameters={"query.follow": "false"}
    )
    project.checks.update(included_check_names=["all"], excluded_check_names=None)
    project.generation.update(max_examples=EXAMPLES, database="none")
    return config


# Hypothesis warns (an error here: filterwarnings) when it builds a very large example's
# text; that says nothing about the API, and which example grows that large varies by run.
@pytest.mark.filterwarnings(
    "ignore:Generating overly large repr:hypothesis.errors.HypothesisWarning"
)
def test_schemathesis_with_all_checks_finds_no_failure(
    server: tuple[str, dict[str, str]],
) -> None:
    url, headers = server
    schema = schemathesis.openapi.from_url(
        f"{url}/openapi.json", config=_config(headers), headers=headers
    )
    operations = sum(1 for _ in schema.get_all_operations())
    problems: list[str] = []
    phases: dict[str, Status] = {}
    requests = 0
    for event in from_schema(schema).execute():
        if isinstance(event, engine_events.ScenarioFinished):
            requests += len(event.recorder.interactions)
            for checks in event.recorder.checks.values():
                problems.extend(
                    f"{event.recorder.label}: {check.failure_info.failure.title}: "
                    f"{check.failure_info.failure.message}"
                    for check in checks
                    if check.status == Status.FAILURE and check.failure_info is not None
                )
        elif isinstance(event, engine_events.NonFatalError):
            problems.append(f"{event.label}: {event.info.title}: {event.info}")
        elif isinstance(event, engine_events.FatalError):
            raise event.exception
        elif isinstance(event, engine_events.PhaseFinished):
            phases[event.phase.name.value] = event.status
        elif isinstance(event, engine_events.EngineFinished):
            problems.extend(f"{failure.title}: {failure.message}" for failure in event.failures)
    assert list(dict.fromkeys(problems)) == []
    # Every phase ran, so the checks had requests to judge.
    assert {phases[name] for name in ("coverage", "fuzzing", "stateful")} == {Status.SUCCESS}
    assert operations >= 13 and requests > operations * EXAMPLES
