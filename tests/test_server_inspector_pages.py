"""The inspector's event list following the run, its new-session dialog and its token prompt, in
Chromium through Playwright against a real server with a scripted model.

Screenshots: ``inspector-follow.png`` (scrolled up, new events waiting below),
``inspector-new-session.png``, ``inspector-token.png``.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytest.importorskip("fastapi", reason="the server tests need the 'server' extra")

from agent_flow.config import AgentConfig, ContextConfig
from agent_flow.llm import LLMConfig
from agent_flow.server import ServerSettings, create_app
from agent_flow.sessions import InMemorySessionStore
from agent_flow.testing import ScriptedLLM, call, reply
from agent_flow.tools import RiskLevel, ToolExecutor, ToolPolicy, tool
from tests.inspector_browser import inspector, scrolled_to_end
from tests.server_harness import serving


@tool
def note(text: str) -> str:
    """Write a note down.

    Args:
        text: The note.
    """
    return f"noted: {text}"


@tool(policy=ToolPolicy(requires_approval=True, risk=RiskLevel.HIGH))
def deploy(target: str) -> str:
    """Deploy somewhere.

    Args:
        target: Where.
    """
    return f"deployed to {target}"


def _notes(first: int) -> list[object]:
    return [call("note", text=f"note {n}", call_id=f"n{n}") for n in range(first, first + 30)]


#: Ends the promise after two animation frames: whatever the page scrolls, it has scrolled.
_FRAMES = "() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))"
#: Whether the element `id` is more than a screen long and scrolled to its end.
_AT_END = """id => { const el = document.getElementById(id);
  const end = el.scrollHeight - el.scrollTop - el.clientHeight < 4;
  return el.scrollHeight > 1.5 * el.clientHeight && end; }"""


async def test_the_event_list_follows_the_run_unless_the_user_scrolled_up() -> None:
    model = ScriptedLLM(
        [
            reply("Taking notes.", tool_calls=_notes(0)),
            reply("Deploying.", tool_calls=[call("deploy", target="staging", call_id="d1")]),
            reply("More notes.", tool_calls=_notes(30)),
            reply("Done."),
        ]
    )
    tools = ToolExecutor()
    tools.register(note)
    tools.register(deploy)
    app = create_app(
        AgentConfig(context=ContextConfig(counter="approx", max_tokens=20_000)),
        store=InMemorySessionStore(),
        llm_factory=lambda config: model,
        tools_factory=lambda config: tools,
    )
    async with serving(app) as client:
        session = (await client.post("/sessions", json={"title": "Notes"})).json()["id"]
        url = f"{client.base_url}/#session={session}"
        async with inspector(url, height=760) as opened:
            page = opened.page
            await page.locator("#session-title", has_text="Notes").wait_for()
            await page.click(".tab[data-tab='events']")
            await page.fill("#message", "take notes, then deploy")
            await page.click("#send")
            await page.locator(".approval[data-call='d1']").wait_for()
            # Following: the list, many screens long by now, shows its last event.
            await page.wait_for_function(_AT_END, arg="events")
            await page.wait_for_function(_AT_END, arg="conversation")
            events = page.locator("#events")
            last = await events.locator(":scope > li").last.inner_text()
            assert last.endswith("approval_required deploy: tool 'deploy' requires approval")

            # The user scrolls up to read: new events no longer move the list.
            await events.hover()
            await page.mouse.wheel(0, -100_000)
            await page.wait_for_function("() => document.getElementById('events').scrollTop === 0")
            await page.click(".approval[data-call='d1'] button.approve")
            await events.locator("li.run_finished").wait_for(state="attached")
            await page.evaluate(_FRAMES)
            assert await events.evaluate("el => el.scrollTop") == 0
            more = page.locator("#events-more")
            await more.wait_for()
            waiting = await more.inner_text()
            assert re.fullmatch(r"↓ \d+ new events", waiting), waiting
            assert int(re.sub(r"\D", "", waiting)) >= 60  # 30 notes, each started and done
            await opened.shot("inspector-follow")

            # Back to the end: following again, the button gone.
            await more.click()
            await page.evaluate(_FRAMES)
            assert await scrolled_to_end(events)
            assert await more.is_hidden()
            # The conversation followed all along: nobody scrolled it.
            assert await scrolled_to_end(page.locator("#conversation"))


async def test_a_new_session_chooses_its_model_workspace_and_title(tmp_path: Path) -> None:
    project = tmp_path / "projects" / "api"
    project.mkdir(parents=True)
    config = AgentConfig(
        llm=LLMConfig(model="small", models=["large"], base_url="http://127.0.0.1:9/v1"),
        llms={"local": LLMConfig(model="qwen", base_url="http://127.0.0.1:9/v1")},
        context=ContextConfig(counter="approx"),
    )
    app = create_app(
        config,
        store=InMemorySessionStore(),
        settings=ServerSettings(workspace_roots=(tmp_path / "projects",)),
        llm_factory=lambda config: ScriptedLLM(["hello"]),
    )
    async with serving(app) as client, inspector(str(client.base_url) + "/") as opened:
        page = opened.page
        await page.click("#new-session")
        dialog = page.locator("#new-dialog")
        await dialog.locator("optgroup").first.wait_for(state="attached")
        # The server's allowed models, by endpoint; its default endpoint's first chosen.
        groups = await dialog.locator("optgroup").evaluate_all(
            "gs => gs.map(g => [g.label, [...g.children].map(o => o.textContent)])"
        )
        assert groups == [["default (default)", ["small", "large"]], ["local", ["qwen"]]]
        chosen = await dialog.locator("#new-model").evaluate(
            "s => s.options[s.selectedIndex].textContent"
        )
        assert chosen == "small"

        # A workspace outside the server's roots: its refusal, in the dialog, which stays.
        await page.select_option("#new-model", label="large")
        await page.fill("#new-workspace", str(tmp_path))
        await page.fill("#new-title", "Big job")
        await page.click("#new-create")
        error = dialog.locator("#new-error")
        await error.wait_for()
        assert "is not under an allowed root" in await error.inner_text()
        assert await dialog.is_visible()

        await page.fill("#new-workspace", str(project))
        await opened.shot("inspector-new-session")
        await page.click("#new-create")
        await page.locator("#session-title", has_text="Big job").wait_for()
        assert await dialog.is_hidden()
        listed = (await client.get("/sessions")).json()["sessions"]
        assert [s["title"] for s in listed] == ["Big job"]
        view = (await client.get(f"/sessions/{listed[0]['id']}")).json()
        assert view["options"]["llm"] == "default"
        assert view["options"]["model"] == "large"
        assert view["options"]["workspace"] == str(project)

        # Another endpoint's model.
        await page.click("#new-session")
        await dialog.locator("optgroup").first.wait_for(state="attached")
        await page.select_option("#new-model", label="qwen")
        await page.click("#new-create")
        await page.locator("#sessions li").nth(1).wait_for()
        newest = (await client.get("/sessions")).json()["sessions"][0]
        options = (await client.get(f"/sessions/{newest['id']}")).json()["options"]
        assert (options["llm"], options["model"], options["workspace"]) == ("local", "qwen", None)


async def test_the_token_prompt_says_what_the_token_is_for_and_where_to_find_it() -> None:
    token = "s3cret-inspector-token"
    app = create_app(
        AgentConfig(context=ContextConfig(counter="approx")),
        store=InMemorySessionStore(),
        settings=ServerSettings(token=token),
        llm_factory=lambda config: ScriptedLLM(["hello"]),
    )
    auth = {"Authorization": f"Bearer {token}"}
    async with serving(app) as client:
        made = await client.post("/sessions", json={"title": "Mine"}, headers=auth)
        assert made.status_code == 201
        async with inspector(str(client.base_url) + "/") as opened:
            page = opened.page
            box = page.locator("#token-box")
            await box.wait_for()
            text = " ".join((await box.inner_text()).split())
            # What it is for, and where to find it.
            assert "lets this page list, read and run the agent sessions" in text
            assert "agent-flow serve" in text
            assert "printed this page's address with the token after #token=" in text
            assert "--token" in text
            assert "AGENT_FLOW_SERVER_TOKEN" in text
            assert "--tokens-file" in text
            assert await page.locator("#token-refused").is_hidden()
            await opened.shot("inspector-token")

            await page.fill("#token", "not-the-token")
            await page.click("#token-form button[type='submit']")
            await page.locator("#token-refused").wait_for()
            await page.fill("#token", token)
            await page.click("#token-form button[type='submit']")
            await page.locator("#sessions li", has_text="Mine").wait_for()
            assert await box.is_hidden()

        # The address serve prints: the token is taken, then dropped from the address bar.
        async with inspector(f"{client.base_url}/#token={token}") as opened:
            page = opened.page
            await page.locator("#sessions li", has_text="Mine").wait_for()
            assert await page.locator("#token-box").is_hidden()
            assert "token" not in await page.evaluate("() => location.href")
