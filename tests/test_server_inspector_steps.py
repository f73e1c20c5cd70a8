"""Per step, what the model saw, in the inspector (Chromium through Playwright, a real server).

Each step's budget bar opens the step: its tokens per section, the environment's changes since
the previous step, and the prompt as sent (every message with its tokens, the environment's
part of the system message marked). A session reloaded from the store still shows the counts
and the changes, and says why its prompts are gone. Screenshots: ``inspector-step.png``,
``inspector-step-stored.png``.
"""

from __future__ import annotations

import re

import pytest

pytest.importorskip("fastapi", reason="the server tests need the 'server' extra")

from agent_flow.config import AgentConfig, ContextConfig
from agent_flow.server import create_app
from agent_flow.sessions import InMemorySessionStore
from agent_flow.testing import ScriptedLLM, call, reply
from tests.inspector_browser import inspector
from tests.server_harness import serving


def _plan(done: int) -> list[dict[str, object]]:
    return [{"description": d, "completed": i < done} for i, d in enumerate(("read", "fix"))]


def _number(text: str) -> int:
    return int(text.replace(",", ""))


async def test_each_step_shows_the_prompt_as_sent_and_the_environments_changes() -> None:
    model = ScriptedLLM(
        [
            reply("Planning.", tool_calls=[call("update_plan", steps=_plan(0), call_id="p1")]),
            reply("Read it.", tool_calls=[call("update_plan", steps=_plan(1), call_id="p2")]),
            reply("All **fixed**."),
        ]
    )
    store = InMemorySessionStore()
    app = create_app(
        AgentConfig(context=ContextConfig(counter="approx", max_tokens=3000)),
        store=store,
        llm_factory=lambda config: model,
    )
    async with serving(app) as client:
        session = (await client.post("/sessions", json={"title": "Fix it"})).json()["id"]
        url = f"{client.base_url}/#session={session}"
        async with inspector(url, height=1000) as opened:
            page = opened.page
            await page.locator("#session-title", has_text="Fix it").wait_for()
            await page.fill("#message", "fix the parser")
            await page.click("#send")
            await page.locator("#conversation .run-end").wait_for()
            rows = page.locator("#budget .bar-row")
            assert await rows.count() == 3
            # The latest step is shown until another is chosen; choose the second.
            await rows.nth(1).click()
            detail = page.locator("#step-detail")
            await detail.locator(".step-title", has_text="Step 2 of run 1").wait_for()
            built = [
                event for event in await store.events(session) if event.kind == "context_built"
            ]
            breakdown = built[1].breakdown
            sections = {
                row.split("\t")[0].split(" (")[0]: _number(row.split("\t")[-1])
                for row in await detail.locator("table.sections tr").all_inner_texts()
            }
            assert sections["environment"] == breakdown.environment
            assert sections["tool schemas"] == breakdown.tools
            assert sections["history"] == breakdown.history
            assert sections["reserved for the answer"] == breakdown.reserve
            assert sections["sent to the model"] == breakdown.total

            # The environment's changes since step 1: the plan step 1's call made.
            changes = detail.locator("ul.env-diff > li:not(.after)")
            pointers = await changes.evaluate_all("nodes => nodes.map(n => n.dataset.pointer)")
            assert "/task/plan" in pointers
            assert "/task/steps_total" in pointers
            total = detail.locator("ul.env-diff li[data-pointer='/task/steps_total']")
            assert re.match(
                r"/task/steps_total 0 → 2 \(.*update_plan.*\)", await total.inner_text()
            )

            # The prompt as sent: every message with its tokens; the environment marked.
            messages = detail.locator("details.prompt-message")
            await messages.first.wait_for()
            roles = await messages.evaluate_all("nodes => nodes.map(n => n.className)")
            assert roles == [
                "prompt-message system",
                "prompt-message user",
                "prompt-message assistant",
                "prompt-message tool",
            ]
            tokens = [
                _number(re.match(r"([\d,]+) tokens", text).group(1))  # type: ignore[union-attr]
                for text in await messages.locator(".tokens").all_inner_texts()
            ]
            assert sum(tokens) + breakdown.tools + breakdown.priming == breakdown.total
            environment = messages.first.locator("mark.env")
            assert '"objective":"fix the parser"' in await environment.inner_text()
            assert '"steps_total":2' in await environment.inner_text()
            system_tokens = await messages.first.locator(".tokens").inner_text()
            assert f"template {breakdown.system_template}" in system_tokens
            assert f"environment {breakdown.environment}" in system_tokens
            await messages.nth(2).locator("summary").click()
            assert "→ update_plan(" in await messages.nth(2).locator("pre").inner_text()
            offered = await detail.locator(".offered").inner_text()
            assert f"Tools offered ({breakdown.tools} tokens, native format):" in offered
            assert "update_plan" in offered
            await detail.locator("h4", has_text="Environment changes").scroll_into_view_if_needed()
            await opened.shot("inspector-step")

        # Evicted as an idle session is; opened again, it is read from the store.
        assert session in await app.state.manager.evict(now=float("inf"))
        async with inspector(url, height=1000) as opened:
            page = opened.page
            rows = page.locator("#budget .bar-row")
            await rows.nth(2).wait_for()
            await rows.nth(1).click()
            detail = page.locator("#step-detail")
            await detail.locator(".step-title", has_text="Step 2 of run 1").wait_for()
            gone = detail.locator(".not-kept")
            await gone.wait_for()
            assert "keeps no prompt" in await gone.inner_text()
            assert "reloaded from the store" in await gone.inner_text()
            pointers = await detail.locator("ul.env-diff > li").evaluate_all(
                "nodes => nodes.map(n => n.dataset.pointer)"
            )
            assert "/task/plan" in pointers
            await opened.shot("inspector-step-stored")
