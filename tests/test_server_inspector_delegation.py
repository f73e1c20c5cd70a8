"""Delegated runs nested in the inspector (Chromium through Playwright, a real server).

A parent delegates two sub-tasks in one step (they run side by side) and one child delegates
again. The conversation shows each child's run as a block under the tool call that made it
(its run id, task, messages and end), the grandchild's inside its parent's; the steps show each
child's steps under the parent's step; the event list indents and tags a child's events and
hides them under "top level only". The page places them from each event's ``path`` and
``run_id`` alone: the same for a live run, for the page reloaded (events replayed) and for the
session read back from the store, and for any interleaving of the parallel children's events
(fed to the page's own modules). Screenshot: ``inspector-delegation.png``.
"""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

pytest.importorskip("fastapi", reason="the server tests need the 'server' extra")

from agent_flow import AgentExecutor, Delegate
from agent_flow.config import AgentConfig, ContextConfig
from agent_flow.events import AgentEvent, event_to_json
from agent_flow.llm.base import LLMRequest
from agent_flow.server import create_app
from agent_flow.sessions import InMemorySessionStore
from agent_flow.testing import FunctionLLM, Reply, call, reply
from agent_flow.tools import ToolExecutor
from tests.inspector_browser import inspector
from tests.server_harness import serving

CONFIG = AgentConfig(context=ContextConfig(counter="approx", max_tokens=4000))
ROWS = "Rows: 41 of 42 reach the sum; the last is dropped."
TOTALS = "Totals are summed before the **last row** is read."
BEDROCK = "Bedrock: parser.py line 12 stops one row early."
PARENT = "Both helpers agree: the parser drops the last row."


def _child(request: LLMRequest) -> Reply:
    """A child: "count the rows" delegates to `dig` first; "check the totals" answers."""
    last = request.messages[-1]
    if last.role == "tool":
        return reply(ROWS)
    if "rows" in str(last.content):
        return reply(
            "Digging deeper.", tool_calls=[call("dig", task="find the parser", call_id="g1")]
        )
    return reply(TOTALS)


def _parent(request: LLMRequest) -> Reply:
    if request.messages[-1].role == "tool":
        return reply(PARENT)
    return reply(
        "Asking two helpers at once.",
        tool_calls=[
            call("investigate", task="count the rows", call_id="a"),
            call("investigate", task="check the totals", call_id="b"),
        ],
    )


def _investigate() -> Delegate[Any]:
    dig = Delegate("dig", "Find where it goes wrong.", llm=FunctionLLM(lambda r: reply(BEDROCK)))
    return Delegate(
        "investigate", "Investigate a question and report.", llm=FunctionLLM(_child), tools=[dig]
    )


# What the page shows of the delegated runs, as plain data: the conversation's blocks (each
# with the run above it and the call it sits under), the top level's own texts, the steps'
# blocks, and the event rows' runs. One function for the live page and the fed modules.
SHAPE = """(root) => {
  const conversation = root.querySelector(".conversation-root");
  const bars = root.querySelector(".bars-root");
  const events = root.querySelector(".events-root");
  const above = (node, selector) => node.parentElement.closest(selector)?.dataset.run ?? "";
  const blocks = [...conversation.querySelectorAll("details.child-run")].map((b) => ({
    run: b.dataset.run, call: b.dataset.call ?? null, parent: above(b, "details.child-run"),
    under: b.parentElement.matches(".delegated")
      ? b.parentElement.previousElementSibling.dataset.call : null,
    task: b.querySelector(":scope > summary .task").textContent,
    end: b.querySelector(":scope > summary .pill").textContent,
    messages: [...b.querySelectorAll(":scope > .child-body > .msg")].map((m) => m.textContent),
  })).sort((x, y) => (x.run < y.run ? -1 : 1));
  const top = [...conversation.querySelectorAll(":scope > .msg")].map((m) =>
    [...m.querySelectorAll(":scope > .md, :scope > .text")].map((n) => n.textContent).join(""));
  const lanes = [...bars.querySelectorAll("details.child-steps")].map((l) => ({
    run: l.dataset.run, parent: above(l, "details.child-steps"),
    step: l.closest(".step-children").previousElementSibling.dataset.iteration,
    rows: [...l.querySelectorAll(":scope > .child-body > .bar-row")]
      .map((r) => r.dataset.iteration),
    end: l.querySelector(":scope > summary .pill").textContent,
  })).sort((x, y) => (x.run < y.run ? -1 : 1));
  const topSteps = bars.querySelectorAll(":scope > .bar-row").length;
  const rows = [...events.querySelectorAll("li")].filter((li) => !li.matches(".deltas"))
    .map((li) => [li.dataset.id, li.dataset.run ?? ""]);
  return { blocks, top, lanes, topSteps, rows };
}"""

# The page itself: its panes marked as SHAPE finds them.
MARK_PAGE = """async () => {
  document.getElementById("conversation").classList.add("conversation-root");
  document.getElementById("budget").classList.add("bars-root");
  document.getElementById("events").classList.add("events-root");
  for (const d of document.querySelectorAll("#events li.deltas details")) d.open = true;
  await new Promise((resolve) => setTimeout(resolve, 0));  // the groups' toggle handlers
}"""

# Feed each list of [id, event] to fresh instances of the page's modules; SHAPE of each.
FEED = """async ([feeds, shapeSource]) => {
  const shape = eval(shapeSource);
  const base = new URL("static/", location.href);
  const { Conversation } = await import(new URL("conversation.js", base));
  const { Steps } = await import(new URL("steps.js", base));
  const { EventList } = await import(new URL("events.js", base));
  const make = (tag, cls) => {
    const node = document.createElement(tag);
    if (cls) node.className = cls;
    return node;
  };
  const shapes = [];
  for (const feed of feeds) {
    const root = make("div");
    const conversationRoot = root.appendChild(make("div", "conversation-root"));
    const bars = root.appendChild(make("div", "bars-root"));
    const list = root.appendChild(make("ol", "events-root"));
    const conversation = new Conversation(conversationRoot, make("button"));
    const notKept = () => Promise.reject(new Error("not kept"));
    const steps = new Steps(bars, make("div"), notKept, () => true);
    const events = new EventList(list, make("button"));
    for (const [id, event] of feed) {
      conversation.onEvent(event); steps.onEvent(id, event); events.add(id, event);
    }
    for (const d of list.querySelectorAll("li.deltas details")) d.open = true;
    await new Promise((resolve) => setTimeout(resolve, 0));  // the groups' toggle handlers
    shapes.push(shape(root));
  }
  return shapes;
}"""


def _check_nesting(shape: dict[str, Any], events: list[dict[str, Any]]) -> None:
    """The shape's blocks are the runs `events` delegated, each where it belongs."""
    paths: dict[str, tuple[str, ...]] = {}
    for event in events:
        paths.setdefault(event["run_id"], tuple(event.get("path", ())))
    (top,) = [run for run, path in paths.items() if not path]
    children = {run for run, path in paths.items() if path == (top,)}
    (grand,) = [run for run, path in paths.items() if len(path) == 2]
    tasks = {e["run_id"]: e["task"] for e in events if e["kind"] == "run_started"}
    ends = {e["run_id"]: e["stop_reason"] for e in events if e["kind"] == "run_finished"}
    child_of = {"count the rows": "a", "check the totals": "b", "find the parser": "g1"}
    rows_run = next(r for r, t in tasks.items() if t == "count the rows")
    blocks = {b["run"]: b for b in shape["blocks"]}
    assert set(blocks) == {*children, grand}
    for run, block in blocks.items():
        assert block["call"] == block["under"] == child_of[tasks[run]]
        assert block["task"] == tasks[run]
        assert block["end"] == ends[run]
        assert block["parent"] == (rows_run if run == grand else "")
    assert blocks[rows_run]["messages"][-1].endswith(ROWS)
    totals_run = next(r for r, t in tasks.items() if t == "check the totals")
    assert "Totals are summed before the last row is read." in "".join(
        blocks[totals_run]["messages"]
    )
    assert any(BEDROCK in m for m in blocks[grand]["messages"])
    # The top level holds its own texts only: no child's answer reads as the parent's.
    top_text = " ".join(shape["top"])
    assert PARENT in top_text
    for text in ("Rows: 41", "Totals are summed", "Bedrock", "Digging deeper"):
        assert text not in top_text
    lanes = {lane["run"]: lane for lane in shape["lanes"]}
    assert set(lanes) == {*children, grand}
    assert lanes[grand]["parent"] == rows_run
    assert lanes[grand]["step"] == "1"  # the child's delegating step
    for child in children:
        assert lanes[child]["parent"] == ""
        assert lanes[child]["step"] == "1"  # the parent's delegating step
    assert lanes[rows_run]["rows"] == ["1", "2"]
    assert lanes[totals_run]["rows"] == ["1"]
    assert shape["topSteps"] == 2


async def _events_of_one_run() -> list[dict[str, Any]]:
    """The events of one real run of the parent, as the server sends them (JSON)."""
    agent = AgentExecutor(FunctionLLM(_parent), config=CONFIG)
    _investigate().add_to(agent)
    subscription = agent.subscribe()
    await agent.run("why are totals low?")
    got: list[AgentEvent] = [event async for event in subscription]
    return [json.loads(event_to_json(event)) for event in got]


def _interleavings(events: list[dict[str, Any]], count: int) -> list[list[dict[str, Any]]]:
    """`events` with the two parallel children's events merged in other orders.

    Each child's chain (the parent's call that made it, its events and its grandchild's, the
    call's end) keeps its order; the chains are merged first one then the other, alternately,
    and at random (a fixed seed), uniformly among all merges.
    """
    top = events[0]["run_id"]
    starts = [
        i for i, e in enumerate(events) if e["kind"] == "tool_call_started" and e["run_id"] == top
    ]
    ends = [
        i for i, e in enumerate(events) if e["kind"] == "tool_call_completed" and e["run_id"] == top
    ]
    low, high = min(starts), max(ends)
    chains: dict[str, list[dict[str, Any]]] = {"a": [], "b": []}
    owner: dict[str, str] = {}
    for event in events[low : high + 1]:
        if event["run_id"] == top:
            key = event["call_id"]
        else:
            path = event.get("path", [])
            child = path[1] if len(path) > 1 else event["run_id"]
            if child not in owner:  # a child's run starts while its call is the latest open
                assert event["kind"] == "run_started"
                owner[child] = next(k for k in ("a", "b") if event["task"] in _TASKS[k])
            key = owner[child]
        chains[key].append(event)
    prefix, suffix = events[:low], events[high + 1 :]
    a, b = chains["a"], chains["b"]
    merges = [a + b, b + a, _alternate(a, b), _alternate(b, a)]
    rng = random.Random(28)
    for _ in range(count):
        left, right, merged = list(a), list(b), []
        while left or right:
            pick = left if rng.random() < len(left) / (len(left) + len(right)) else right
            merged.append(pick.pop(0))
        merges.append(merged)
    return [prefix + merged + suffix for merged in merges]


_TASKS = {"a": ("count the rows", "find the parser"), "b": ("check the totals",)}


def _alternate(first: list[Any], second: list[Any]) -> list[Any]:
    out: list[Any] = []
    for i in range(max(len(first), len(second))):
        out += first[i : i + 1] + second[i : i + 1]
    return out


def _app() -> tuple[Any, InMemorySessionStore]:
    tools = ToolExecutor()
    tools.register(_investigate())
    store = InMemorySessionStore()
    app = create_app(
        CONFIG,
        store=store,
        llm_factory=lambda c: FunctionLLM(_parent),
        tools_factory=lambda c: tools,
    )
    return app, store


async def test_any_interleaving_of_parallel_children_nests_the_same() -> None:
    events = await _events_of_one_run()
    feeds = _interleavings(events, 40)
    # The seq of a child's event comes from the top-level run: these orders break it, as a
    # stream may; the page must not care.
    assert any([e["seq"] for e in feed] != sorted(e["seq"] for e in feed) for feed in feeds)
    numbered = {id(e): i for i, e in enumerate(events)}
    app, _ = _app()
    async with serving(app) as client, inspector(str(client.base_url) + "/") as opened:
        shapes = await opened.page.evaluate(
            FEED, [[[[numbered[id(e)], e] for e in feed] for feed in feeds], SHAPE]
        )
    _check_nesting(shapes[0], events)
    for feed, shape in zip(feeds, shapes, strict=True):
        assert shape["blocks"] == shapes[0]["blocks"]
        assert shape["lanes"] == shapes[0]["lanes"]
        assert shape["top"] == shapes[0]["top"]
        # Every event row, a folded delta's too, is tagged with its own run (none: top level).
        run_of = {numbered[id(e)]: (e["run_id"] if e.get("path") else "") for e in feed}
        assert len(shape["rows"]) == len(feed)
        for row_id, run in shape["rows"]:
            assert run == run_of[int(row_id)]


async def test_a_live_run_shows_delegated_runs_nested_and_a_reload_the_same() -> None:
    app, store = _app()
    async with serving(app) as client:
        session = (await client.post("/sessions", json={"title": "Totals"})).json()["id"]
        url = f"{client.base_url}/#session={session}"
        async with inspector(url, height=1000) as opened:
            page = opened.page
            await page.locator("#session-title", has_text="Totals").wait_for()
            await page.fill("#message", "why are totals low?")
            await page.click("#send")
            await page.locator("#conversation > .run-end", has_text="answered").wait_for()
            await page.click(".tab[data-tab='events']")
            await page.evaluate(MARK_PAGE)
            live = await page.evaluate(f"({SHAPE})(document.body)")
            stored = [json.loads(event_to_json(e)) for e in await store.events(session)]
            _check_nesting(live, stored)
            # One user message and one end: a child's task and end are its block's heading.
            assert await page.locator("#conversation > .msg.user").count() == 1
            assert await page.locator("#conversation > .run-end").count() == 1
            assert await page.locator("#conversation .run-end").count() == 1

            # "top level only" hides every child's event row, and only those.
            children = page.locator("#events > li.child")
            shown = await children.count()
            assert shown > 0
            everything = await page.locator("#events > li").count()
            await page.check("#events-top-only")
            assert await page.locator("#events > li:visible").count() == everything - shown
            assert await page.locator("#events > li.child:visible").count() == 0
            await page.uncheck("#events-top-only")
            assert await page.locator("#events > li.child:visible").count() == shown

            await page.click(".tab[data-tab='steps']")
            child_step = page.locator("#budget details.child-steps .bar-row").first
            await child_step.click()
            title = page.locator("#step-detail .step-title")
            assert "of delegated run" in await title.inner_text()
            assert "(investigate)" in await title.inner_text()
            await page.locator("#conversation details.tool").first.scroll_into_view_if_needed()
            await opened.shot("inspector-delegation")

        # The page opened again: the events come back from the session (stored, with ids).
        assert await _shape_when_opened(url) == live

        # Evicted as an idle session is; opened again, it is read from the store.
        assert session in await app.state.manager.evict(now=float("inf"))
        assert await _shape_when_opened(url) == live


async def _shape_when_opened(url: str) -> object:
    """The nesting the page shows, opened anew at `url`, once the run's end is shown."""
    async with inspector(url, height=1000) as opened:
        page = opened.page
        await page.locator("#conversation > .run-end", has_text="answered").wait_for()
        await page.evaluate(MARK_PAGE)
        return await page.evaluate(f"({SHAPE})(document.body)")
