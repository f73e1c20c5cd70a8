"""What the inspector costs: the server keeping each step's prompt, and the page drawing a session.

1. The prompt tap (`agent_flow.server._prompts.PromptTap`): a scripted agent's steps; the
   tap's own work per model call timed directly, beside a whole step of the same agent without
   the tap (the baseline, same run); and what the kept prompts hold at the end of a
   long-context session (their count and characters, against their bounds).
2. The page: a stored session of N events opened in Chromium (`#session=ID`), from navigation
   to its last event drawn (the conversation, the event list, the bars), against the same page
   reading the same event stream and parsing every event without drawing (the baseline).

Usage: python benchmarks/bench_inspector.py [--steps 200] [--events 500,2000,8000]
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agent_flow._defaults import INSPECTOR_PROMPT_CHARS, INSPECTOR_PROMPTS_KEPT
from agent_flow.agent import AgentExecutor
from agent_flow.config import AgentConfig, ContextConfig
from agent_flow.events import AgentEvent
from agent_flow.server import create_app
from agent_flow.server._prompts import PromptTap
from agent_flow.sessions import InMemorySessionStore
from agent_flow.testing import ScriptedLLM, ScriptStep, call, reply


def _script(steps: int, words: int) -> list[ScriptStep]:
    text = " ".join(f"word{n}" for n in range(words))
    return [
        *(
            reply(text, tool_calls=[call("update_plan", steps=[{"description": f"step {n}"}])])
            for n in range(steps)
        ),
        reply("done"),
    ]


@dataclass
class _Live:
    """What the tap reads of a live session: its run's events with their ids."""

    id: str = "bench"
    buffer: list[tuple[int, AgentEvent]] = field(default_factory=list)


async def _agent_run(
    steps: int, *, tapped: bool, max_tokens: int
) -> tuple[float, PromptTap | None]:
    config = AgentConfig(
        context=ContextConfig(counter="approx", max_tokens=max_tokens), max_iterations=steps + 5
    )
    model = ScriptedLLM(_script(steps, 60))
    live = _Live()
    tap = PromptTap(model, live) if tapped else None  # type: ignore[arg-type]
    agent = AgentExecutor(tap if tap is not None else model, config=config)
    if tap is not None:
        tap.attach(agent.context)
    # Both arms keep the run's events as a server's live session does (its recorder).
    agent.events.on(None, lambda event: live.buffer.append((event.seq, event)))
    started = time.perf_counter()
    await agent.run("benchmark the tap")
    return time.perf_counter() - started, tap


async def bench_tap(steps: int, repeat: int) -> None:
    print(f"1. The prompt tap: a scripted agent of {steps} steps, median of {repeat} runs")
    await _agent_run(steps, tapped=True, max_tokens=200_000)  # warm-up: imports, caches
    plain = [(await _agent_run(steps, tapped=False, max_tokens=200_000))[0] for _ in range(repeat)]
    per_step = statistics.median(plain) / (steps + 1) * 1e6
    _, tap = await _agent_run(steps, tapped=True, max_tokens=200_000)
    assert tap is not None
    # The tap's own work on one call, timed directly on the run's longest prompt (an
    # end-to-end difference of two runs is smaller than their noise).
    request = tap.inner.requests[-1]  # type: ignore[attr-defined]
    built = next(e for _, e in reversed(tap.live.buffer) if e.kind == "context_built")
    own: list[float] = []
    for _ in range(repeat):
        started = time.perf_counter()
        for n in range(1000):
            tap.live.buffer.append((10**9 + n, built))
            tap._keep(request)
        own.append((time.perf_counter() - started) / 1000 * 1e6)
    print(f"   a step without the tap (baseline, instant model): {per_step:8.1f} µs")
    print(
        f"   the tap's own work per model call:                {statistics.median(own):8.1f} µs "
        f"(a prompt of {len(request.messages)} messages)"
    )
    print(
        f"   kept at the end: {len(tap.log.ids())} prompts (bound {INSPECTOR_PROMPTS_KEPT}), "
        f"{tap.log.chars:,} characters (bound {INSPECTOR_PROMPT_CHARS:,})"
    )


_BASELINE = """async (path) => {
  const started = performance.now();
  const response = await fetch(path);
  const text = await response.text();
  let count = 0;
  for (const frame of text.split("\\n\\n")) {
    const lines = frame.split("\\n").filter(l => l.startsWith("data:"));
    const data = lines.map(l => l.slice(5)).join("");
    if (data) { JSON.parse(data); count += 1; }
  }
  return [performance.now() - started, count];
}"""


async def _stored_session(
    client: Any, app: Any, models: list[ScriptedLLM], events: int
) -> tuple[str, int]:
    """A session of about `events` events: runs of ten tool steps with 60-word answers."""
    session = (await client.post("/sessions", json={"title": "bench"})).json()["id"]
    made = 0
    while made < events:
        models.append(ScriptedLLM(_script(10, 60)))
        sent = (await client.post(f"/sessions/{session}/messages", json={"message": "go"})).json()
        async with client.stream(
            "GET", f"/sessions/{session}/events", params={"after": sent["first_event_id"] - 1}
        ) as response:
            async for line in response.aiter_lines():
                if line.startswith("event:"):
                    made += 1
                if line == "event: run_finished":
                    break
        # A new agent (and model) for the next run: the session reloads from the store.
        await app.state.manager.evict(now=float("inf"))
    return session, made


async def bench_page(sizes: list[int], repeat: int) -> None:
    from playwright.async_api import async_playwright

    from tests.server_harness import serving

    chromium = shutil.which("chromium") or "/usr/bin/chromium"
    print(f"2. The page: a stored session opened in Chromium, median of {repeat}")
    models: list[ScriptedLLM] = []
    app = create_app(
        AgentConfig(context=ContextConfig(counter="approx", max_tokens=200_000), max_iterations=20),
        store=InMemorySessionStore(),
        llm_factory=lambda config: models.pop(0),
    )
    async with serving(app) as client, async_playwright() as playwright:
        browser = await playwright.chromium.launch(
            executable_path=chromium, args=["--no-sandbox", "--disable-gpu", "--no-first-run"]
        )
        try:
            print(
                "   events | read and parsed (baseline) | drawn by the inspector | events/s drawn"
            )
            # Warm-up: the browser's first page, its first module loads.
            warm = await browser.new_page()
            await warm.goto(f"{client.base_url}/")
            await warm.close()
            for size in sizes:
                session, made = await _stored_session(client, app, models, size)
                base: list[float] = []
                drawn: list[float] = []
                for _ in range(repeat):
                    page = await browser.new_page(viewport={"width": 1400, "height": 900})
                    await page.goto(f"{client.base_url}/static/dom.js")
                    took, count = await page.evaluate(
                        _BASELINE, f"/sessions/{session}/events?follow=false"
                    )
                    assert count == made, (count, made)
                    base.append(took)
                    started = time.perf_counter()
                    await page.goto(f"{client.base_url}/#session={session}")
                    # Every event drawn: a row each, or one row for a run of deltas.
                    await page.wait_for_function(
                        "n => document.querySelectorAll('#events li[data-id]').length "
                        "+ [...document.querySelectorAll('#events li.deltas')]"
                        ".reduce((s, g) => s + Number(g.querySelector('summary').textContent"
                        ".split(' ')[0]) - 1, 0) >= n",
                        arg=made,
                        timeout=120_000,
                    )
                    drawn.append((time.perf_counter() - started) * 1e3)
                    await page.close()
                b, d = statistics.median(base), statistics.median(drawn)
                print(f"   {made:6d} | {b:20.0f} ms | {d:17.0f} ms | {made / d * 1e3:12,.0f}")
        finally:
            await browser.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--events", default="500,2000,8000")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    asyncio.run(bench_tap(args.steps, args.repeat))
    asyncio.run(bench_page([int(n) for n in args.events.split(",")], args.repeat))


if __name__ == "__main__":
    main()
