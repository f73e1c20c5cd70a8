"""The CLI and model calls that fail: the --timeout flag, how retries are rendered, what is kept."""

from __future__ import annotations

import asyncio
import io
import socket
import sqlite3
from pathlib import Path

import pytest

from agent_flow.cli import main
from agent_flow.cli.render import EventRenderer, make_console
from agent_flow.events import ModelOutputDiscarded, ModelRetrying
from agent_flow.sessions import SQLiteSessionStore
from tests.openai_server import OpenAIServer, Reply, sse_reply, text_chunks


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


async def run_cli(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = await asyncio.to_thread(main, argv, stdin=io.StringIO(""), stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


async def test_a_run_cut_off_mid_answer_keeps_its_session_and_events(
    openai_server: OpenAIServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The model answers three times, each answer cut off mid-stream, then the run gives up.
    monkeypatch.setenv("AGENT_FLOW_LLM_OVERRIDES__MAX_RETRIES", "2")
    cut = sse_reply(text_chunks("half an answer", chunk_size=4), drop_after=3)
    openai_server.script(cut, cut, cut)
    db = tmp_path / "s.db"
    argv = ["run", "t", "--model", "m", "--base-url", openai_server.base_url, "--db", str(db)]
    code, out, err = await run_cli(argv)
    assert code == 3 and "lost mid-answer" in err
    assert openai_server.remaining == 0

    async with SQLiteSessionStore(db) as store:
        (info,) = await store.list()
        events = await store.events(info.id)
        state = await store.load(info.id)
    assert info.status == "failed"
    kinds = [event.kind for event in events]
    assert kinds.count("model_output_discarded") == 2  # the third attempt's ends the run
    assert kinds.count("text_delta") == 6  # what the model did send, kept
    # The error, the task marked failed (`TASK_STATUS_AFTER`), the end.
    assert kinds[-3:] == ["execution_error", "environment_updated", "run_finished"]
    assert [entry.kind for entry in state.entries] == ["user_message"]
    # Kept, so the hint to continue it is printed.
    assert f"--session {info.id}" in out


async def test_a_run_that_stored_nothing_leaves_no_session(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    async with SQLiteSessionStore(db):
        pass  # the tables exist
    with sqlite3.connect(db) as conn:
        # The store fails at the run's only save (its end), after the session was created.
        conn.execute(
            "CREATE TRIGGER full BEFORE INSERT ON events "
            "BEGIN SELECT RAISE(ABORT, 'disk full'); END"
        )
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}/v1"  # closed: nothing answers
    code, out, err = await run_cli(["run", "t", "--model", "m", "--base-url", url, "--db", str(db)])
    assert code != 0 and "disk full" in err
    assert "--session" not in out
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT count(*) FROM sessions").fetchone() == (0,)
