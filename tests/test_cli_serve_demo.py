"""`agent-flow serve --demo` as a real process on a loopback port: no model server, no key.

The demo's scripted run starts by itself in session ``demo``; a client watches it over SSE and
approves what it asks, and so does a newcomer in the inspector (Chromium through Playwright,
at the address the process printed); the run fixes the project. Screenshot:
``inspector-demo.png``.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx2
import pytest

pytest.importorskip("fastapi", reason="the server tests need the 'server' extra")

from agent_flow._demo.scenario import DEMO_TASK, EVENT_KINDS
from agent_flow._demo.serve import DEMO_MODEL
from tests.inspector_browser import inspector
from tests.server_harness import frames, free_port


@asynccontextmanager
async def demo_process(
    tmp_path: Path, *extra: str
) -> AsyncIterator[tuple[httpx2.AsyncClient, list[str]]]:
    """Run ``serve --demo`` on a free port; yield a client and the lines it printed."""
    port = free_port()
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "agent_flow.cli",
        "serve",
        "--demo",
        "--port",
        str(port),
        "--demo-pace",
        "0",
        "--db",
        str(tmp_path / "demo.db"),
        *extra,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
        cwd=tmp_path,
    )
    assert process.stderr is not None
    printed: list[str] = []
    try:
        while not any("serving;" in line for line in printed):
            line = (await process.stderr.readline()).decode()
            assert line, f"serve --demo exited before serving: {printed}"
            printed.append(line)
        async with httpx2.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
            for _ in range(400):
                try:
                    await client.get("/endpoints")
                    break
                except httpx2.ConnectError:
                    await asyncio.sleep(0.025)  # uvicorn binds right after the banner
            yield client, printed
    finally:
        if process.returncode is None:
            process.terminate()
        await asyncio.wait_for(process.wait(), 30)


async def _watch_and_approve(
    client: httpx2.AsyncClient, session: str, *, after: int = -1
) -> list[dict[str, object]]:
    """The session's events after id `after` until a run finishes, approving each request."""
    seen: list[dict[str, object]] = []
    path = f"/sessions/{session}/events"
    async with client.stream("GET", path, params={"after": after}) as response:
        assert response.status_code == 200
        async for frame in frames(response):
            event = frame.json
            seen.append(event)
            if event["kind"] == "approval_required":
                answer = await client.post(
                    f"/sessions/{session}/approvals/{event['call_id']}",
                    json={"approved": True},
                )
                assert answer.status_code == 204, answer.text
            if event["kind"] == "run_finished":
                return seen
    raise AssertionError(f"the stream ended before run_finished: {[e['kind'] for e in seen]}")


async def test_serve_demo_runs_the_scripted_scenario_with_no_model_and_no_key(
    tmp_path: Path,
) -> None:
    async with demo_process(tmp_path, "--no-token") as (client, printed):
        banner = "".join(printed)
        assert "http://127.0.0.1:" in banner
        assert "#session=demo" in banner
        assert "scripted model" in banner
        endpoints = (await client.get("/endpoints")).json()
        assert endpoints["endpoints"] == [
            {"name": "default", "models": [DEMO_MODEL], "default": True}
        ]
        seen = await _watch_and_approve(client, "demo")
        kinds = {event["kind"] for event in seen}
        # The same scenario as `agent-flow demo`: every kind it shows but the ones only its
        # own terminal subscriber causes (a late queue that drops events).
        assert set(EVENT_KINDS) - kinds <= {"events_dropped"}, set(EVENT_KINDS) - kinds
        assert seen[0]["kind"] == "run_started"
        assert seen[0]["task"] == DEMO_TASK
        assert seen[0]["model"] == DEMO_MODEL
        assert seen[-1]["stop_reason"] == "completed"
        view = (await client.get("/sessions/demo")).json()
        assert view["status"] == "completed"
        assert view["environment"]["task"]["status"] == "completed"
        # The fix is real: the project's tests ran green after the scripted write.
        results = [e["content"] for e in seen if e["kind"] == "tool_call_completed"]
        assert any("OK" in str(content) for content in results)
        # A follow-up gets the script's last word rather than an error.
        sent = await client.post("/sessions/demo/messages", json={"message": "and now?"})
        assert sent.status_code == 202, sent.text
        more = await _watch_and_approve(client, "demo", after=sent.json()["first_event_id"] - 1)
        assert more[-1]["stop_reason"] == "answered"
        assert "script has ended" in str(more[-1]["final_text"])


async def test_serve_demo_prints_the_address_with_its_token_and_session(tmp_path: Path) -> None:
    async with demo_process(tmp_path) as (client, printed):
        line = next(line for line in printed if "open the inspector at" in line)
        address = line.split("open the inspector at ", 1)[1].strip()
        fragment = address.split("#", 1)[1]
        fields = dict(part.split("=", 1) for part in fragment.split("&"))
        assert set(fields) == {"token", "session"}
        assert fields["session"] == "demo"
        assert (await client.get("/sessions")).status_code == 401
        listed = await client.get(
            "/sessions", headers={"Authorization": f"Bearer {fields['token']}"}
        )
        assert [s["id"] for s in listed.json()["sessions"]] == ["demo"]


async def test_serve_demo_refuses_a_config(tmp_path: Path) -> None:
    config = tmp_path / "agent.toml"
    config.write_text("[agent]\nname = 'x'\n")
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "agent_flow.cli",
        "serve",
        "--demo",
        "--config",
        str(config),
        "--port",
        str(free_port()),
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode == 2
    assert "--demo serves its own scripted agent and takes no --config" in err.decode()


async def test_a_newcomer_watches_the_demo_in_the_inspector(tmp_path: Path) -> None:
    async with demo_process(tmp_path) as (_, printed):
        line = next(line for line in printed if "open the inspector at" in line)
        address = line.split("open the inspector at ", 1)[1].strip()
        async with inspector(address, height=1000) as opened:
            page = opened.page
            await page.locator("#session-title", has_text="Demo: fix the csvstats bug").wait_for()
            # Approve what the scripted model asks, as the newcomer would, until it finishes.
            approved = 0
            pending = ".approval button.approve:visible"
            next_thing = page.locator(f"{pending}, #conversation .run-end")
            while True:
                await next_thing.first.wait_for()
                if await page.locator("#conversation .run-end").count():
                    break
                # This very button, then its removal: a loaded machine may still show the one
                # clicked last time (answered, not yet re-rendered) when the loop comes back.
                button = await page.locator(pending).first.element_handle()
                await button.click()
                await button.wait_for_element_state("hidden")
                approved += 1
            assert approved >= 2
            await page.locator("#conversation .run-end", has_text="completed").wait_for()
            conversation = page.locator("#conversation")
            assert DEMO_TASK in await conversation.locator(".msg.user").first.inner_text()
            names = await conversation.locator("details.tool .tool-name").all_inner_texts()
            assert {"update_plan", "run_command", "project_lint", "write_file"} <= set(names)
            answer = await conversation.locator(".msg.answer").inner_text()
            assert "lines[1:-1] -> lines[1:]" in answer
            await page.locator("#status-pill", has_text="completed").wait_for()
            await page.locator("#task-status", has_text="completed").wait_for()
            await page.locator("#budget .bar-row").nth(9).wait_for()
            await opened.shot("inspector-demo")
