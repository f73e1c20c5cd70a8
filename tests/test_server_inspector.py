"""The inspector page in a real browser: Debian's chromium driven by Playwright, against a real
server on a loopback port with a scripted model.

A run as people read it: the user's message, the model's answers rendered as Markdown (safely),
tool calls folded with their results, text deltas folded in the event list, an approval
answered from the page, and the header's statuses agreeing with the environment tree.
Screenshots: ``inspector.png``, ``inspector-conversation.png``, ``inspector-statuses.png``.
"""

from __future__ import annotations

import re

import pytest

pytest.importorskip("fastapi", reason="the server tests need the 'server' extra")

from agent_flow.config import AgentConfig, ContextConfig
from agent_flow.server import create_app
from agent_flow.sessions import InMemorySessionStore
from agent_flow.testing import ScriptedLLM, call, reply
from agent_flow.tools import RiskLevel, ToolExecutor, ToolPolicy, tool
from tests.inspector_browser import inspector
from tests.server_harness import serving

#: The answer: Markdown a model writes, with HTML it must not get to run.
ANSWER = """## Deployed

The service runs on **staging** now:

- build `1.4.2` passed its checks
- the health probe answers in *40 ms*

| check | result |
|---|---|
| smoke | ok |

See [the runbook](https://example.org/runbook), not [this](javascript:alert(1)).
<script>alert(1)</script><img src=x onerror="alert(2)">
"""


@tool(policy=ToolPolicy(requires_approval=True, risk=RiskLevel.HIGH))
def deploy(target: str) -> str:
    """Deploy somewhere.

    Args:
        target: Where.
    """
    return f"deployed to {target}"


def _app(model: ScriptedLLM) -> object:
    tools = ToolExecutor()
    tools.register(deploy)
    return create_app(
        # A small budget, so the bars show its parts.
        AgentConfig(context=ContextConfig(counter="approx", max_tokens=1500)),
        store=InMemorySessionStore(),
        llm_factory=lambda config: model,
        tools_factory=lambda config: tools,
    )


async def test_the_inspector_shows_the_conversation_of_a_run_and_approves_a_tool() -> None:
    model = ScriptedLLM(
        [
            reply(
                "I'll plan it, then deploy.",
                thinking="Staging first; report after.",
                tool_calls=[
                    call(
                        "update_plan",
                        steps=[{"description": "deploy"}, {"description": "report"}],
                        call_id="p1",
                    ),
                    call("deploy", target="staging", call_id="c1"),
                ],
            ),
            reply(ANSWER),
        ]
    )
    async with serving(_app(model)) as client, inspector(str(client.base_url) + "/") as opened:
        page = opened.page
        await page.click("#new-session")
        await page.fill("#new-title", "Deploy to staging")
        await page.click("#new-create")
        await page.locator("#session-title", has_text="Deploy to staging").wait_for()
        await page.fill("#message", "deploy to staging")
        await page.click("#send")
        approve = page.locator(".approval[data-call='c1'] button.approve")
        await approve.wait_for()
        # The folded call says it waits, in the conversation too.
        waiting = page.locator("details.tool[data-call='c1'] .status")
        await waiting.filter(has_text="waiting for approval").wait_for()
        await approve.click()
        await page.locator("#conversation .run-end", has_text="answered").wait_for()
        assert await page.locator(".approval").count() == 0

        conversation = page.locator("#conversation")
        assert await conversation.locator(".msg.user .text").all_inner_texts() == [
            "deploy to staging"
        ]
        # Tool calls folded with their results: closed, their status in the summary.
        calls = conversation.locator("details.tool")
        assert await calls.count() == 2
        assert await calls.evaluate_all("nodes => nodes.map(n => n.open)") == [False, False]
        deployed = conversation.locator("details.tool[data-call='c1']")
        assert re.fullmatch(
            r"deploy \{\"target\": \"staging\"\} ✓ \d+ ms",
            await deployed.locator("summary").inner_text(),
        )
        await opened.shot("inspector")
        await deployed.locator("summary").click()
        assert await deployed.locator("pre.result").inner_text() == "deployed to staging"
        assert '"target": "staging"' in await deployed.locator("pre.arguments").inner_text()
        # The thinking is folded too.
        assert await conversation.locator("details.thinking").evaluate("n => n.open") is False

        # The answer as Markdown: structure, a safe link only, and no markup from the text.
        answer = conversation.locator(".msg.assistant .md").last
        assert await answer.locator("h2").inner_text() == "Deployed"
        assert await answer.locator("strong").inner_text() == "staging"
        assert await answer.locator("li").all_inner_texts() == [
            "build 1.4.2 passed its checks",
            "the health probe answers in 40 ms",
        ]
        assert await answer.locator("li code").inner_text() == "1.4.2"
        assert await answer.locator("td").all_inner_texts() == ["smoke", "ok"]
        links = answer.locator("a")
        assert await links.count() == 1
        assert await links.get_attribute("href") == "https://example.org/runbook"
        assert await links.get_attribute("rel") == "noopener noreferrer"
        assert await conversation.locator("script, img, [onerror]").count() == 0
        text = await answer.inner_text()
        assert "<script>alert(1)</script>" in text
        assert "[this](javascript:alert(1))" in text
        assert "## Deployed" not in text

        # Cost beside tokens: the scripted model has no price, so it is unknown, not $0.
        spent = await page.locator("#session-cost").inner_text()
        assert re.fullmatch(r"2 model calls · \d+ tokens · cost unknown", spent), spent
        assert await page.locator("#budget .bar-row").count() == 2
        assert await page.locator("#budget .bar-row").first.locator(".seg").count() == 6
        await opened.shot("inspector-conversation")

        # The event list: each run of deltas is one folded row until opened.
        await page.click(".tab[data-tab='events']")
        events = page.locator("#events")
        await events.locator("li.run_finished").wait_for()
        groups = events.locator("li.deltas")
        assert await groups.count() == 2
        assert await events.locator("li.text_delta").count() == 0
        summary = await groups.last.locator("summary").inner_text()
        assert re.match(r"\d+ deltas \(text_delta\): \"## Deployed", summary), summary
        folded = int(summary.split(" ", 1)[0])
        await groups.last.locator("summary").click()
        opened_rows = groups.last.locator("li.text_delta")
        await opened_rows.nth(folded - 1).wait_for()
        assert await opened_rows.count() == folded
        rows = await events.locator(":scope > li").all_inner_texts()
        calls_made = [row for row in rows if "model_responded" in row]
        assert len(calls_made) == 2
        assert all(re.search(r"\d+\+\d+ tokens · cost unknown$", row) for row in calls_made)
        assert any("deployed to staging" in row for row in rows)

        # The plan and the environment.
        await page.click(".tab[data-tab='environment']")
        assert await page.locator("#plan li").all_inner_texts() == ["deploy", "report"]
        objective = page.locator("#environment li[data-pointer='/task/objective']")
        assert "deploy to staging" in await objective.inner_text()


async def test_the_header_and_the_tree_agree_on_statuses() -> None:
    model = ScriptedLLM(
        [
            reply("Done: it is deployed."),
            reply(tool_calls=[call("ask_question", question="Which region next?")]),
        ]
    )
    async with serving(_app(model)) as client, inspector(str(client.base_url) + "/") as opened:
        page = opened.page
        await page.click("#new-session")
        await page.click("#new-create")
        await page.wait_for_selector("#session-pane:not([hidden])")
        await page.click(".tab[data-tab='environment']")
        tree_status = page.locator("#environment li[data-pointer='/task/status'] > .value")

        async def statuses() -> tuple[str, str, str]:
            return (
                await page.locator("#status-pill").inner_text(),
                await page.locator("#task-status").inner_text(),
                await tree_status.inner_text(),
            )

        # An answered run: the session completed, and so did its task.
        await page.fill("#message", "is it deployed?")
        await page.click("#send")
        await page.locator("#conversation .run-end", has_text="answered").wait_for()
        await page.locator("#status-pill", has_text="completed").wait_for()
        await page.locator("#task-status", has_text="completed").wait_for()
        assert await statuses() == ("completed", "completed", '"completed"')
        await opened.shot("inspector-statuses")

        # A question: both wait for the user.
        await page.fill("#message", "and next?")
        await page.click("#send")
        await page.locator("#conversation .run-end", has_text="waiting_for_user").wait_for()
        await page.locator("#status-pill", has_text="waiting").wait_for()
        await page.locator("#task-status", has_text="waiting").wait_for()
        assert await statuses() == ("waiting", "waiting", '"waiting"')
        listed = page.locator("#sessions li.selected .pill")
        assert await listed.inner_text() == "waiting"


async def test_a_delegated_sub_task_shows_as_a_block_under_the_call_that_made_it() -> None:
    from agent_flow.delegation import Delegate

    child = ScriptedLLM(["The parser drops the last row."])
    investigate = Delegate("investigate", "Investigate a question and report.", llm=child)
    parent = ScriptedLLM(
        [
            reply(tool_calls=[call("investigate", task="why are totals low?", call_id="d1")]),
            reply("The parser drops the last row; fixing it next."),
        ]
    )
    tools = ToolExecutor()
    tools.register(investigate)
    app = create_app(
        AgentConfig(context=ContextConfig(counter="approx", max_tokens=4000)),
        store=InMemorySessionStore(),
        llm_factory=lambda config: parent,
        tools_factory=lambda config: tools,
    )
    async with serving(app) as client, inspector(str(client.base_url) + "/") as opened:
        page = opened.page
        await page.click("#new-session")
        await page.click("#new-create")
        await page.wait_for_selector("#session-pane:not([hidden])")
        await page.fill("#message", "find out why totals are low")
        await page.click("#send")
        await page.locator("#conversation .run-end", has_text="answered").wait_for()
        conversation = page.locator("#conversation")
        # One user message (the child's sub-task is no message of the user's), one run end.
        assert await conversation.locator(".msg.user").count() == 1
        assert await conversation.locator(".run-end").count() == 1
        # The child's run: a block under the call d1, its task and end in the heading, its
        # answer inside (tests/test_server_inspector_delegation.py checks the nesting in depth).
        block = conversation.locator(".delegated[data-call='d1'] > details.child-run")
        assert await block.count() == 1
        assert await block.locator("summary .task").inner_text() == "why are totals low?"
        assert await block.locator("summary .pill").inner_text() == "answered"
        assert "The parser drops the last row." in await block.locator(".child-body").inner_text()
        assert await page.locator("#budget > .bar-row").count() == 2  # the parent's steps
        assert await page.locator("#budget details.child-steps .bar-row").count() == 1
        await page.click(".tab[data-tab='events']")
        child_rows = page.locator("#events > li", has_text="↳")
        assert await child_rows.count() >= 2
