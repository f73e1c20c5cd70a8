"""Every example runs as a script, offline (OPENAI_* unset: the scripted model), and says so;
and against a model that makes other calls than the script, without crashing."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.openai_server import (
    OpenAIServer,
    sse_reply,
    text_chunks,
    tool_call_chunks,
)

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = (
    "coding_agent",
    "data_analysis",
    "custom_tool",
    "event_consumers",
    "pruning_strategies",
    "delegation",
)


@pytest.fixture(scope="module")
def outputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Run all examples at once (they are independent) and collect their output."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "AGENT_FLOW_"))}
    env["PYTHONPATH"] = str(REPO)
    cwd = tmp_path_factory.mktemp("examples")
    env["TMPDIR"] = str(cwd)  # the examples' temporary directories go away with the test's
    processes = {
        name: subprocess.Popen(
            [sys.executable, str(REPO / "examples" / f"{name}.py")],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            cwd=cwd,
        )
        for name in EXAMPLES
    }
    results: dict[str, str] = {}
    for name, process in processes.items():
        out, err = process.communicate(timeout=120)
        assert process.returncode == 0, f"{name} failed:\n{err}"
        assert err == "", f"{name} wrote to stderr:\n{err}"
        assert out.startswith("model: ScriptedLLM"), f"{name} did not use the scripted model"
        results[name] = out
    return results


def test_every_example_is_tested() -> None:
    assert sorted(p.stem for p in (REPO / "examples").glob("*.py")) == sorted(EXAMPLES)


def test_the_coding_agent_maps_the_project_records_a_design_and_writes_code(
    outputs: dict[str, str],
) -> None:
    out = outputs["coding_agent"]
    assert "approval: write_file src/agent_flow/environment.rs -> True" in out
    assert "outcome: completed: Added src/agent_flow/environment.rs per the design." in out
    assert (
        "files known to the environment: Cargo.toml, docs/agent-loop.md, src/agent_flow/mod.rs, "
        "src/coder/executor.rs, src/coder/session.rs, src/lib.rs\n"
    ) in out
    assert "designing struct: Environment (Observer pattern for tool result updates)" in out
    assert "wrote src/agent_flow/environment.rs: True" in out


def test_the_coder_delegates_to_a_read_only_researcher_whose_findings_it_then_uses(
    outputs: dict[str, str],
) -> None:
    out = outputs["delegation"]
    assert "outcome: completed: Fixed total() to sum every price." in out
    assert "coder tool calls: investigate, write_file, task_completion" in out
    # The researcher tried to write and was refused; it cannot have asked for approval.
    assert "tools search_text, read_file, task_completion; refused: write_file" in out
    assert out.count("approval asked:") == 1
    assert (
        "known facts: ['tests/test_totals.py fails', "
        "'total() iterates prices[1:], so it skips the first price']"
    ) in out
    assert "sources: {'src/totals.py': 'researcher'}" in out
    assert "model calls in the coder's totals: 7 " in out  # 3 of the coder's, 4 of the child's
    assert "src/totals.py fixed: True" in out


def test_the_data_analysis_agent_keeps_its_dataset_in_a_typed_extension(
    outputs: dict[str, str],
) -> None:
    out = outputs["data_analysis"]
    assert "Analyzing 1250 rows of sales data; columns: date, product, region, sales, profit" in out
    stats = json.loads(out.split("summary stats: ", 1)[1].splitlines()[0])
    assert stats["total_sales"] == sum(stats["sales_by_region"].values())
    assert set(stats["sales_by_region"]) == {"North", "South", "East", "West"}
    best = max(stats["sales_by_region"], key=stats["sales_by_region"].get)
    assert (
        f"outcome: completed: Total sales {stats['total_sales']:,}, average profit margin "
        f"{stats['avg_profit_margin']:.1%}; {best} sells the most." in out
    )
    assert "task status: completed" in out


def test_the_custom_tool_updates_the_environment_through_its_handler(
    outputs: dict[str, str],
) -> None:
    out = outputs["custom_tool"]
    assert "set /extensions/weather/paris" in out and "set /extensions/weather/tokyo" in out
    assert "set /knowledge/discovered_facts/1" in out
    assert "answer: Right now: Paris: 72°F, sunny; Tokyo: 64°F, light rain." in out
    assert "'paris': {'temperature': 72, 'conditions': 'sunny', 'location': 'Paris'}" in out
    assert "facts: ['weather in Paris: sunny, 72°F', 'weather in Tokyo: light rain, 64°F']" in out


def test_the_event_consumers_each_see_the_run(outputs: dict[str, str]) -> None:
    out = outputs["event_consumers"]
    assert "[log] INFO #0 run_started" in out
    assert "[progress] iteration 3" in out and "[progress] finished: completed" in out
    assert "[progress]   multiply done, 0 still running" in out
    counted = re.search(r"logger saw (\d+) events; the file has (\d+) lines", out)
    assert counted is not None and counted.group(1) == counted.group(2)
    assert (
        f"read back from events.jsonl: {counted.group(1)} events, run_started ... run_finished"
        in out
    )
    assert "outcome: completed: (2+3) * (4+6) = 50" in out


def test_the_pruning_strategies_example_is_a_lab_run_over_the_sessions_it_records(
    outputs: dict[str, str],
) -> None:
    out = outputs["pruning_strategies"]
    assert len(re.findall(r"^recorded \S+: answered, ", out, re.M)) == 2
    assert out.splitlines()[3].split()[:4] == ["CANDIDATE", "STRATEGY", "BUDGET", "STEPS"]
    sections = {part.splitlines()[0]: part for part in out.split("== ")[1:]}
    assert list(sections) == ["drop_oldest", "elide_then_drop", "summarize"]

    def pruning(section: str) -> tuple[int, int, int]:
        found = re.search(r"pruned before (\d+) of (\d+) steps \((\d+) with a summary\)", section)
        assert found is not None
        return int(found.group(1)), int(found.group(2)), int(found.group(3))

    drop, elide, summarize = sections.values()
    for section in (drop, elide, summarize):
        prunes, steps, _ = pruning(section)
        assert prunes > 0 and steps == 16  # 11 + 5 model calls in the two sessions
        total = re.search(r"last prompt: ([\d,]+)/3,000 tokens", section)
        assert total is not None and int(total.group(1).replace(",", "")) <= 3000 - 300
        # Every strategy keeps the newest answers.
        assert re.search(r"error lines visible for days (\d\d, )*08, 09, 10$", section, re.M)
    assert pruning(drop)[2] == pruning(elide)[2] == 0 < pruning(summarize)[2]
    assert "days 01" not in drop  # the oldest turns are gone
    assert "summaries were written offline by ExtractiveSummarizer" in out
    html = Path(out.split("HTML report with plots: ", 1)[1].split()[0])
    page = html.read_text()
    # Two line charts per session, and a lane chart per probe the session held.
    assert page.count('role="img" aria-label=') == 4 and "<script" not in page
    assert 'class="probe"' in page


# -- against a model that does not follow the script ---------------------------------------
#
# The strict scripted server of `tests.openai_server` plays a real model that makes other
# calls than the examples' own scripts (and answers 500 to anything unscripted): an example
# must read what it got with defaults and say what is missing, never crash with a traceback.


async def run_against(server: OpenAIServer, example: str, tmp_path: Path) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "AGENT_FLOW_"))}
    env.update(
        PYTHONPATH=str(REPO),
        TMPDIR=str(tmp_path),
        OPENAI_BASE_URL=server.base_url,
        OPENAI_API_KEY="test",
        AGENT_FLOW_MODEL_RETRIES="0",
    )
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        str(REPO / "examples" / f"{example}.py"),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
        cwd=tmp_path,
    )
    out, err = await asyncio.wait_for(process.communicate(), 120)
    assert process.returncode == 0, err.decode()
    assert err.decode() == ""
    assert server.unexpected == [], "the example asked the model more than was scripted"
    text = out.decode()
    assert text.startswith("model: OpenAIClient")
    return text


async def test_the_custom_tool_example_reports_a_model_that_never_calls_the_tool(
    openai_server: OpenAIServer, tmp_path: Path
) -> None:
    openai_server.script(sse_reply(text_chunks("I cannot look up the weather.")))
    out = await run_against(openai_server, "custom_tool", tmp_path)
    assert "answer: I cannot look up the weather." in out
    assert "environment /extensions/weather: {}" in out
    assert "not checked by the model: paris, tokyo" in out


async def test_the_custom_tool_example_keeps_what_other_calls_returned(
    openai_server: OpenAIServer, tmp_path: Path
) -> None:
    calls = [
        ("w1", "get_weather", json.dumps({"location": "Reykjavik"})),
        ("w2", "get_weather", json.dumps({"location": "Atlantis"})),  # unknown: an error result
    ]
    openai_server.script(
        sse_reply(tool_call_chunks(calls)),
        sse_reply(text_chunks("Windy in Reykjavik; Atlantis is unknown.")),
    )
    out = await run_against(openai_server, "custom_tool", tmp_path)
    assert "answer: Windy in Reykjavik; Atlantis is unknown." in out
    weather = next(line for line in out.splitlines() if line.startswith("environment /ext"))
    assert "'reykjavik': {'temperature': 41" in weather and "atlantis" not in weather.lower()
    assert "not checked by the model: paris, tokyo" in out
    assert "facts: ['weather in Reykjavik: windy, 41°F']" in out


async def test_the_data_analysis_example_handles_analysis_without_loading_first(
    openai_server: OpenAIServer, tmp_path: Path
) -> None:
    openai_server.script(
        sse_reply(tool_call_chunks([("a1", "analyze_data", '{"dataset": "sales_data.csv"}')])),
        sse_reply(text_chunks("Sales are spread evenly across regions.")),
    )
    out = await run_against(openai_server, "data_analysis", tmp_path)
    assert "outcome: answered: Sales are spread evenly across regions." in out
    assert "Analyzing 1250 rows of sales data; columns: date, product, region" in out
    stats = json.loads(out.split("summary stats: ", 1)[1].splitlines()[0])
    assert stats["total_sales"] == sum(stats["sales_by_region"].values())


async def test_the_data_analysis_example_says_what_a_model_that_read_the_wrong_file_missed(
    openai_server: OpenAIServer, tmp_path: Path
) -> None:
    openai_server.script(
        sse_reply(tool_call_chunks([("r1", "read_csv", '{"path": "sales.csv"}')])),
        sse_reply(text_chunks("There is no sales.csv.")),
    )
    out = await run_against(openai_server, "data_analysis", tmp_path)
    assert "outcome: answered: There is no sales.csv." in out
    assert "the model did not load sales_data.csv (datasets known: [])" in out
    assert "Traceback" not in out


async def test_the_custom_tool_agent_runs_from_the_command_line(
    openai_server: OpenAIServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.test_cli import invoke_async

    for name in list(os.environ):
        if name.startswith(("OPENAI_", "AGENT_FLOW_")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("OPENAI_BASE_URL", openai_server.base_url)
    monkeypatch.setenv("OPENAI_API_KEY", "test")
    openai_server.script(
        sse_reply(tool_call_chunks([("w1", "get_weather", '{"location": "Paris"}')])),
        sse_reply(text_chunks("Sunny in Paris.")),
    )
    spec = f"{REPO / 'examples' / 'custom_tool.py'}:build_agent"
    result = await invoke_async(
        ["run", "weather in Paris?", "-q", "--agent", spec, "--db", str(tmp_path / "d")]
    )
    assert (result.code, result.out, result.err) == (0, "Sunny in Paris.\n", "")
    assert openai_server.bodies[1]["messages"][-1]["content"] == "Paris: 72°F, sunny"
