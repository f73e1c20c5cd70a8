"""The README's quickstart runs as written, against a local OpenAI-compatible server."""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
from pathlib import Path

import pytest

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
    assert lines[-1] == "answered 20 + 22 = 42. completed"


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


# Repository paths: a folder of the project, then more path; or a file at the top level.
_PATH = re.compile(
    r"(?<![\w/.$~<-])((?:agent_flow|examples|tests|benchmarks|\.ci)/[\w./-]*[\w]"
    r"|[\w-]+\.(?:toml|md|cfg|ini))(?![\w/])"
)


def named_paths(text: str) -> set[str]:
    return {match.group(1) for match in _PATH.finditer(text)}


def test_every_path_the_readme_names_exists() -> None:
    text = README.read_text()
    names = named_paths(text)
    # The check sees what it should: examples, modules, scripts, CI (and not URLs or pointers).
    assert {"examples/pruning_strategies.py", "agent_flow/config.py", ".ci/run"} <= names
    assert not any(name.startswith(("http", "/")) for name in names)
    root = README.parent
    # Files the reader creates themselves, named as examples of a flag's value.
    theirs = {"agent.toml", "notes.txt", "summary.md", "tokens.toml"}
    missing = sorted(name for name in names - theirs if not (root / name).exists())
    assert missing == [], f"the README names paths that do not exist: {missing}"


def test_the_path_check_catches_a_missing_example() -> None:
    assert named_paths("see `examples/tuning_pruning.py` and agent_flow/llm/config.py.") == {
        "examples/tuning_pruning.py",
        "agent_flow/llm/config.py",
    }


def test_every_flag_the_readme_names_is_a_real_flag() -> None:
    from agent_flow.cli import build_parser

    parser = build_parser()
    known: set[str] = set()
    stack = [parser]
    while stack:
        current = stack.pop()
        for action in current._actions:
            known.update(action.option_strings)
            choices = getattr(action, "choices", None)
            if isinstance(choices, dict):
                stack.extend(choices.values())
    section = README.read_text().split("## The command", 1)[1].split("\n## ", 1)[0]
    named = set(re.findall(r"(?<![\w-])(--[a-z][a-z-]*|-q)\b", section))
    assert {"--trace", "-q", "--json", "--agent"} <= named
    assert named - known == set()


def test_the_readme_property_test_for_your_own_code_passes(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    section = README.read_text().split("## Testing your own code", 1)[1].split("\n## ", 1)[0]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match is not None
    pytester.makepyfile(test_mine=match.group(1))
    # The reader's file exactly as copied: it loads the kit's settings profile itself.
    # Only pytest itself: the plugins installed for the suite (schemathesis, ...) take seconds
    # to import and play no part here.
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    result = pytester.runpytest_subprocess("-q", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=4)
