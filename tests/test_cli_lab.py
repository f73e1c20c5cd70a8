"""`agent-flow lab`, the candidates file and the HTML report, on sessions recorded here."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from agent_flow.errors import ConfigError, StoreError
from agent_flow.history import DropOldest
from agent_flow.lab import (
    LabReport,
    answer_overlap,
    load_candidates,
    load_export,
    render_html,
    render_table,
    run_lab,
)
from agent_flow.lab.candidates import Candidate
from agent_flow.sessions import SQLiteSessionStore
from tests.openai_server import (
    OpenAIServer,
    Reply,
    completion_body,
    error_reply,
    json_reply,
)
from tests.test_cli import invoke_async
from tests.test_lab import RESERVE, record

REPO = Path(__file__).resolve().parents[1]


def readme_lab_example() -> str:
    """The Python example of the README's lab section."""
    readme = (REPO / "README.md").read_text()
    section = readme.split("## The pruning lab", 1)[1].split("\n## ", 1)[0]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match is not None
    return match.group(1)


@pytest.fixture
async def recorded(tmp_path: Path) -> tuple[Path, str, Path]:
    """A store holding one recorded session, its id, and its export."""
    db = tmp_path / "s.db"
    async with SQLiteSessionStore(db) as store:
        session_id = await record(store)
        await store.export(session_id, tmp_path / "run.jsonl")
    return db, session_id, tmp_path / "run.jsonl"


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("AGENT_FLOW_HOME", str(tmp_path / "home"))


async def test_the_lab_command_prints_a_table_of_every_strategy_at_every_budget(
    recorded: tuple[Path, str, Path],
) -> None:
    db, session_id, export = recorded
    result = await invoke_async(
        ["lab", session_id, str(export), "--db", str(db), "--budget", "1500", "--budget",
         "100000", "--reserve", str(RESERVE), "--probe", "MARK-01 disk 1"]
    )  # fmt: skip
    assert (result.code, result.err) == (0, "")
    rows = [line.split()[0] for line in result.out.splitlines()[1:9]]
    assert rows == [
        f"{name}@{budget}"
        for budget in (1500, 100000)
        for name in ("elide_then_drop", "drop_oldest", "sliding_window", "summarize")
    ]
    assert re.search(r"^drop_oldest@100000 .* 14 +[\d,]+ +[\d,]+ +\$\S+ +0 +0 +0 +100% +100%$",
                     result.out, re.M)  # fmt: skip
    assert "not visible at the end: MARK-01 disk 1" in result.out
    assert "ExtractiveSummarizer" in result.out


async def test_the_lab_command_writes_json_and_an_offline_html_report(
    recorded: tuple[Path, str, Path], tmp_path: Path
) -> None:
    _, _, export = recorded
    html = tmp_path / "lab.html"
    result = await invoke_async(
        ["lab", str(export), "--budget", "1500", "--strategy", "drop_oldest", "--strategy",
         "summarize", "--reserve", str(RESERVE), "--json", "--html", str(html)]
    )  # fmt: skip
    assert (result.code, result.err) == (0, "")
    report = LabReport.model_validate_json(result.out)
    assert [c.name for c in report.candidates] == ["drop_oldest@1500", "summarize@1500"]
    # Scripts get the derived numbers too.
    session = json.loads(result.out)["candidates"][0]["sessions"][0]
    last = session["steps"][-1]
    assert last["retention"] == len(last["visible"]) / len(last["available"])
    assert session["tokens"] == sum(step["tokens"] for step in session["steps"])
    assert report.candidates[0].prunes == 2
    page = html.read_text()
    # Two line charts of two candidates each; no probe was given, so no probe chart.
    assert page.count('role="img"') == 2 and page.count("<polyline") == 4
    assert 'class="probe"' not in page
    # Offline: nothing fetched, nothing run.
    assert "<script" not in page and "<link" not in page
    assert set(re.findall(r"https?://[^\"' ]+", page)) == {"http://www.w3.org/2000/svg"}
    assert "drop_oldest@1500: step by step" in page


async def test_the_lab_command_reads_candidates_and_probes_from_a_file(
    recorded: tuple[Path, str, Path], tmp_path: Path
) -> None:
    _, _, export = recorded
    lab = tmp_path / "lab.toml"
    lab.write_text(
        'probes = ["MARK-06 disk 6"]\n'
        '[[candidate]]\nname = "tight"\nstrategy = "drop_oldest"\nmax_tokens = 1500\n'
        f"reserve_output_tokens = {RESERVE}\n"
        '[[candidate]]\nstrategy = "summarize"\nmax_tokens = 2000\nreserve_output_tokens = 300\n'
    )
    result = await invoke_async(["lab", str(export), "--candidates", str(lab), "--json"])
    assert result.code == 0, result.err
    report = json.loads(result.out)
    assert [c["name"] for c in report["candidates"]] == ["tight", "summarize@2000"]
    assert report["probes"] == ["MARK-06 disk 6"]
    assert report["candidates"][1]["summarizer"] == "ExtractiveSummarizer"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--strategy", "drop_oldest"], "--strategy needs at least one --budget"),
        ([], "nothing to compare"),
        (["--budget", "1000", "--reserve", "1000"], "--reserve 1000 must be smaller"),
        (["--budget", "0"], "0 must be at least 1"),
        (["--budget", "900", "--pricing", "cheap"], "is not IN,OUT prices"),
    ],
)
async def test_the_lab_command_refuses_bad_input_with_a_usage_error(
    recorded: tuple[Path, str, Path],
    argv: list[str],
    message: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    _, _, export = recorded
    result = await invoke_async(["lab", str(export), *argv])
    # argparse reports its own errors on sys.stderr, the command on its stream.
    errors = result.err + capsys.readouterr().err
    assert result.code == 2 and message in errors and result.out == ""


async def test_the_lab_command_names_an_unknown_session_and_a_broken_export(
    recorded: tuple[Path, str, Path], tmp_path: Path
) -> None:
    db, _, export = recorded
    result = await invoke_async(["lab", "nosuch", "--db", str(db), "--budget", "2000"])
    assert result.code == 2 and "no session 'nosuch'" in result.err
    broken = tmp_path / "broken.jsonl"
    broken.write_text(export.read_text().splitlines()[0] + "\n{not json\n")
    result = await invoke_async(["lab", str(broken), "--budget", "2000"])
    assert result.code == 2 and "line 2 of" in result.err and "not a session export" in result.err


def test_candidates_come_from_a_lab_file_or_an_agent_toml(tmp_path: Path) -> None:
    agent = tmp_path / "agent.toml"
    agent.write_text(
        '[agent]\nsystem_prompt = "Be brief. {environment}"\n'
        '[agent.context]\nmax_tokens = 6000\nstrategy = "sliding_window"\nwindow_turns = 3\n'
    )
    [candidate], probes = load_candidates(agent)
    assert (candidate.name, candidate.max_tokens, probes) == ("sliding_window@6000", 6000, [])
    assert candidate.strategy.name == "chain(sliding_window, drop_oldest)"
    assert candidate.system_prompt_template == "Be brief. {environment}"
    bad = tmp_path / "lab.toml"
    bad.write_text('[[candidate]]\nstrategy = "keep_everything"\nmax_tokens = 10\n')
    with pytest.raises(ConfigError, match=r"candidate\.0\.strategy"):
        load_candidates(bad)
    bad.write_text("[[candidate]]\nmax_tokens = 10\nreserve_output_tokens = 20\n")
    with pytest.raises(ConfigError, match="reserve_output_tokens"):
        load_candidates(bad)


async def test_the_html_report_draws_each_candidates_tokens_against_its_budget(
    recorded: tuple[Path, str, Path],
) -> None:
    _, _, export = recorded
    session = load_export(export)
    report = await run_lab(
        [session],
        [
            Candidate(
                name="a<b", max_tokens=1500, strategy=DropOldest(), reserve_output_tokens=300
            ),
            Candidate(
                name="b", max_tokens=100_000, strategy=DropOldest(), reserve_output_tokens=300
            ),
        ],
    )
    page = render_html(report)
    assert "a&lt;b" in page and "a<b" not in page
    points = re.findall(r'<polyline[^>]*data-candidate="[^"]*" points="([^"]+)"', page)
    assert len(points) == 4 and all(len(p.split()) == len(session.steps) for p in points)
    # One budget line per candidate, unless it is far above every prompt: then the legend
    # says so instead of flattening the chart.
    assert page.count('class="budget"') == 1
    assert "its budget, 99,700, is above the chart" in page


def test_an_export_that_is_not_one_is_refused(tmp_path: Path) -> None:
    empty = tmp_path / "e.jsonl"
    empty.write_text("")
    with pytest.raises(StoreError, match="no session line"):
        load_export(empty)
    with pytest.raises(StoreError, match="cannot read"):
        load_export(tmp_path / "missing.jsonl")


async def test_the_readme_lab_example_runs_as_written(
    recorded: tuple[Path, str, Path], tmp_path: Path
) -> None:
    import asyncio
    import os
    import sys

    _, _, export = recorded
    (tmp_path / "example.py").write_text(readme_lab_example())
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "example.py",
        cwd=export.parent,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), 120)
    assert process.returncode == 0, err.decode()
    assert out.decode().startswith("CANDIDATE")
    assert re.search(r"^\w+ keeps the least: \d+% of the facts at the end$", out.decode(), re.M)


def test_the_example_lab_file_loads() -> None:
    candidates, probes = load_candidates(REPO / "examples" / "lab.toml")
    assert [c.name for c in candidates] == [
        "drop-4k",
        "elide-4k",
        "window-4k",
        "summarize-4k",
        "elide-8k",
    ]
    assert probes == ["ERROR disk"] and candidates[3].summarizer == "ExtractiveSummarizer"


# -- re-asking the final question (model-dependent) ----------------------------------------


def test_answer_overlap_is_the_f1_of_the_words() -> None:
    assert answer_overlap("All days read.", "all days READ") == 1.0
    assert answer_overlap("nothing in common", "All days read.") == 0.0
    assert answer_overlap("All days", "All days read.") == pytest.approx(0.8)
    assert answer_overlap("", "") == 1.0 and answer_overlap("", "x") == 0.0


async def test_the_lab_re_asks_the_final_question_of_each_candidate_over_real_http(
    recorded: tuple[Path, str, Path],
    openai_server: OpenAIServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "test")
    _, _, export = recorded
    openai_server.script(
        json_reply(completion_body("I only see days 5 and 6.")),
        json_reply(completion_body("All days read.")),
    )
    result = await invoke_async(
        ["lab", str(export), "--budget", "1500", "--budget", "100000", "--strategy",
         "drop_oldest", "--reserve", str(RESERVE), "--ask", "--model", "test-model",
         "--base-url", openai_server.base_url, "--json"]
    )  # fmt: skip
    assert result.code == 0, result.err
    report = LabReport.model_validate_json(result.out)
    tight, roomy = report.answers
    assert (tight.candidate, tight.step, tight.recorded) == (
        "drop_oldest@1500",
        7,
        "All days read.",
    )
    assert tight.answer == "I only see days 5 and 6." and tight.score is not None
    assert tight.score < 0.5 and roomy.score == 1.0 and roomy.model == "test-model"
    assert any("depend on the model" in note for note in report.notes)
    # Each candidate's own last prompt went to the model: the tight one left days 1-4 out.
    sent = [json.dumps(body["messages"]) for body in openai_server.bodies]
    assert "MARK-01" not in sent[0].replace("day 1 has marker MARK-01", "")
    assert "MARK-01 disk 1" in sent[1] and "MARK-06 disk 6" in sent[0]
    assert [body["max_tokens"] for body in openai_server.bodies] == [RESERVE, RESERVE]


async def test_a_failed_re_ask_is_reported_and_the_lab_run_goes_on(
    recorded: tuple[Path, str, Path], openai_server: OpenAIServer
) -> None:
    from agent_flow.llm import OpenAIClient

    _, _, export = recorded
    openai_server.script(error_reply(400, "context too long"))
    report = await run_lab(
        [load_export(export)],
        [Candidate(name="c", max_tokens=1500, strategy=DropOldest(), reserve_output_tokens=300)],
        llm=OpenAIClient("m", base_url=openai_server.base_url, api_key="k", max_retries=0),
    )
    [answer] = report.answers
    assert answer.answer is None and answer.error is not None and "context too long" in answer.error
    assert report.candidates[0].steps == 7
    assert "re-asked final question (MODEL-DEPENDENT" in render_table(report)
    assert "Re-asked final question (model-dependent)" in render_html(report)


async def test_the_labs_re_ask_takes_the_timeout_its_error_names(
    recorded: tuple[Path, str, Path],
    openai_server: OpenAIServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A model that never answers costs --timeout, the flag its error names (it had none)."""
    monkeypatch.setenv("OPENAI_API_KEY", "test")
    _, _, export = recorded
    openai_server.script(Reply(hang=True))
    started = time.monotonic()
    result = await invoke_async(
        ["lab", str(export), "--budget", "1500", "--strategy", "drop_oldest", "--ask",
         "--model", "test-model", "--base-url", openai_server.base_url, "--timeout", "1",
         "--json"]
    )  # fmt: skip
    assert result.code == 0, result.err
    assert time.monotonic() - started < 30
    (answer,) = LabReport.model_validate_json(result.out).answers
    assert answer.answer is None and "--timeout" in (answer.error or "")
