"""The README's quickstart runs as written, against a local OpenAI-compatible server."""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
from pathlib import Path

from tests.openai_server import OpenAIServer, sse_reply, text_chunks, tool_call_chunks

README = Path(__file__).resolve().parents[1] / "README.md"


def quickstart() -> str:
    text = README.read_text()
    section = text.split("## Quickstart", 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match is not None
    return match.group(1)


def test_the_readme_opens_with_the_install_and_test_commands() -> None:
    blocks = re.findall(r"```bash\n(.*?)```", README.read_text(), re.S)
    assert "agent-flow demo" in blocks[0]
    assert "pytest" in blocks[1]
    ci = (README.parent / ".ci" / "run").read_text()
    assert blocks[1].strip() in ci


async def test_the_quickstart_runs_against_an_openai_compatible_endpoint(tmp_path: Path) -> None:
    script = tmp_path / "quickstart.py"
    script.write_text(quickstart())
    async with OpenAIServer() as server:
        server.script(
            sse_reply(tool_call_chunks([("call_1", "add", json.dumps({"a": 20, "b": 22}))])),
            sse_reply(text_chunks("20 + 22 = 42.")),
        )
        env = {**os.environ, "OPENAI_BASE_URL": server.base_url, "OPENAI_API_KEY": "test"}
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            str(script),
            env=env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode == 0, err.decode()
    lines = out.decode().splitlines()
    assert lines[0] == "run_started"
    assert "tool_call_completed" in lines
    assert lines[-1] == "answered 20 + 22 = 42. in_progress"


def test_the_readme_configuration_reference_loads(tmp_path: Path) -> None:
    from agent_flow.config import load_config

    section = README.read_text().split("## Configuration reference", 1)[1]
    match = re.search(r"```toml\n(.*?)```", section, re.S)
    assert match is not None
    path = tmp_path / "agent.toml"
    path.write_text(match.group(1))
    config = load_config(path, environ={})
    assert config.resolved_llm().model == "qwen2.5-coder"
    assert config.resolved_llm().temperature == 0.1
    assert config.skill("review").allowed_tools == ("read_file", "search_text")
