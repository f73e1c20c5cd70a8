"""The CLI and model calls that fail: the --timeout flag, and how retries are rendered."""

from __future__ import annotations

import asyncio
import io
from pathlib import Path

import pytest

from agent_flow.cli import main
from agent_flow.cli.render import EventRenderer, make_console
from agent_flow.events import ModelOutputDiscarded, ModelRetrying
from tests.openai_server import OpenAIServer, Reply


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("AGENT_FLOW_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("AGENT_FLOW_MODEL_RETRIES", "0")
    monkeypatch.setenv("AGENT_FLOW_LLM_OVERRIDES__MAX_RETRIES", "0")


async def test_timeout_flag_ends_a_stalled_model_call_and_names_the_timeout(
    openai_server: OpenAIServer, tmp_path: Path
) -> None:
    openai_server.script(Reply(hang=True))
    out, err = io.StringIO(), io.StringIO()
    argv = ["run", "t", "--model", "m", "--base-url", openai_server.base_url]
    argv += ["--timeout", "0.3", "--db", str(tmp_path / "s.db")]
    code = await asyncio.to_thread(main, argv, stdin=io.StringIO(""), stdout=out, stderr=err)
    assert code != 0
    assert "timeout of 0.3 s" in out.getvalue() + err.getvalue()


def test_a_non_positive_timeout_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "t", "--model", "m", "--timeout", "0"]) == 2
    assert "--timeout: 0 must be more than 0 seconds" in capsys.readouterr().err


def test_retries_and_discarded_output_are_rendered() -> None:
    stream = io.StringIO()
    render = EventRenderer(make_console(stream), spinner=False)
    render(ModelOutputDiscarded(run_id="r", seq=1, iteration=1, attempt=1, text="half"))
    render(
        ModelRetrying(
            run_id="r", seq=2, iteration=1, attempt=1, max_attempts=3, delay=0.5, reason="HTTP 503"
        )
    )
    text = stream.getvalue()
    assert "the 4 characters above from the failed attempt are discarded" in text
    assert "attempt 1 of 3), retrying in 0.5 s: HTTP 503" in text
