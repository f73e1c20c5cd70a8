"""The inspector page in a real browser: Debian's chromium driven by Playwright, against a real
server on a loopback port with a scripted model.

Open a session, send a task, watch the events arrive, approve a tool from the page, and see the
environment tree and the budget bars update. A screenshot is kept in ``test-artifacts/``.
Without chromium the test skips with the reason, except under CI (CI=true), where it fails.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest

pytest.importorskip("fastapi", reason="the server tests need the 'server' extra")

from agent_flow.config import AgentConfig, ContextConfig
from agent_flow.server import create_app
from agent_flow.sessions import InMemorySessionStore
from agent_flow.testing import ScriptedLLM, call, reply
from agent_flow.tools import RiskLevel, ToolExecutor, ToolPolicy, tool
from tests.server_harness import serving

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARTIFACTS = Path(__file__).resolve().parent.parent / "test-artifacts"


@tool(policy=ToolPolicy(requires_approval=True, risk=RiskLevel.HIGH))
def deploy(target: str) -> str:
    """Deploy somewhere.

    Args:
        target: Where.
    """
    return f"deployed to {target}"


def _browser_or_skip() -> None:
    if Path(CHROMIUM).exists():
        return
    reason = "the inspector test needs Debian's chromium (apt-get install chromium)"
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason}; CI must install it (.ci/run does)")
    pytest.skip(reason)


async def test_the_inspector_shows_a_run_live_and_approves_a_tool() -> None:
    _browser_or_skip()
    playwright_api = pytest.importorskip("playwright.async_api")
    model = ScriptedLLM(
        [
            reply(
                "planning",
                tool_calls=[
                    call(
                        "update_plan",
                        steps=[{"description": "deploy"}, {"description": "report"}],
                        call_id="p1",
                    ),
                    call("deploy", target="staging", call_id="c1"),
                ],
            ),
            reply("deployed and reported"),
        ]
    )
    tools = ToolExecutor()
    tools.register(deploy)
    app = create_app(
        # A small budget, so the bars show its parts.
        AgentConfig(context=ContextConfig(counter="approx", max_tokens=1500)),
        store=InMemorySessionStore(),
        llm_factory=lambda config: model,
        tools_factory=lambda config: tools,
    )
    async with serving(app) as client, playwright_api.async_playwright() as playwright:
        # Playwright gives every launch a fresh temporary profile (its own --user-data-dir).
        browser = await playwright.chromium.launch(
            executable_path=CHROMIUM,
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--no-first-run",
            ],
        )
        try:
            page = await browser.new_page(viewport={"width": 1280, "height": 900})
            errors: list[str] = []
            page.on("pageerror", lambda err: errors.append(str(err)))
            await page.goto(str(client.base_url) + "/")
            await page.click("#new-session")
            await page.wait_for_selector("#session-pane:not([hidden])")
            await page.fill("#message", "deploy to staging")
            await page.click("#send")
            approve = page.locator(".approval[data-call='c1'] button.approve")
            await approve.wait_for()
            await page.locator("#events li.approval_required").wait_for()
            await approve.click()
            await page.locator("#events li.run_finished").wait_for()
            await page.locator("#session-status", has_text="completed").wait_for()
            assert await page.locator(".approval").count() == 0
            events = await page.locator("#events li").all_inner_texts()
            assert any("deployed to staging" in text for text in events)
            # Cost beside tokens: the scripted model has no price, so it is unknown, not $0.
            calls = [text for text in events if text.startswith("model_responded")]
            assert len(calls) == 2
            assert all(re.search(r"\d+\+\d+ tokens · cost unknown$", text) for text in calls)
            spent = await page.locator("#session-cost").inner_text()
            assert re.fullmatch(r"2 model calls · \d+ tokens · cost unknown", spent), spent
            assert await page.locator("#budget .bar-row").count() == 2
            segments = await page.locator("#budget .bar-row").first.locator(".seg").count()
            assert segments == 6
            objective = page.locator("#environment li[data-pointer='/task/objective']")
            assert "deploy to staging" in await objective.inner_text()
            plan = await page.locator("#plan li").all_inner_texts()
            assert plan == ["deploy", "report"]
            ARTIFACTS.mkdir(exist_ok=True)
            await page.screenshot(path=str(ARTIFACTS / "inspector.png"), full_page=True)
            assert errors == []
        finally:
            await browser.close()
