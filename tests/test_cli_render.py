"""The terminal renderer: the budget bar by section, and the ASCII fallback."""

from __future__ import annotations

import io

from agent_flow.cli.render import EventRenderer, make_console
from agent_flow.events import RunStarted, TextDelta, ToolCallFailed
from agent_flow.prompt import PromptBreakdown


def breakdown(**fields: int) -> PromptBreakdown:
    values = {
        "budget": 1000,
        "reserve": 100,
        "system_template": 100,
        "environment": 200,
        "tools": 300,
        "history": 100,
        "priming": 3,
        "total": 703,
        "history_units_sent": 2,
        "history_units_omitted": 1,
    }
    values.update(fields)
    return PromptBreakdown(environment_degraded=False, **values)


def test_the_budget_bar_splits_the_budget_by_section() -> None:
    out = io.StringIO()
    renderer = EventRenderer(make_console(out))
    bar = renderer.budget_bar(breakdown())
    assert bar.plain == (
        "  context [ssseeeeeettttttttthhh······rrr] 703/1,000 tokens: system 100 · "
        "environment 200 · tools 300 · history 100 · reserve 100 (1 history unit(s) left out)"
    )
    full = renderer.budget_bar(breakdown(history=300, total=903, history_units_omitted=0))
    assert full.plain.startswith("  context [ssseeeeeettttttttthhhhhhhhhrrr] 903/1,000 tokens")
    over = renderer.budget_bar(breakdown(system_template=520, history=300, total=1123))
    assert over.plain.startswith("  context [" + "s" * 16 + "e" * 6 + "t" * 5 + "rrr]")


def test_an_ascii_console_gets_ascii_glyphs_and_text() -> None:
    raw = io.BytesIO()
    stream = io.TextIOWrapper(raw, encoding="ascii")
    renderer = EventRenderer(make_console(stream))
    renderer(RunStarted(run_id="abcdef123456", seq=0, task="résumé ☃", agent="a", model="m"))
    renderer(TextDelta(run_id="abcdef123456", seq=1, text="naïve"))
    renderer(
        ToolCallFailed(
            run_id="abcdef123456", seq=2, call_id="c", name="t", error="x", duration_ms=1
        )
    )
    renderer.line(renderer.budget_bar(breakdown()))
    stream.flush()
    text = raw.getvalue().decode("ascii")
    assert "> run abcdef12 started" in text and "task: r?sum? ?" in text
    assert "na?ve\n  x t failed: x" in text
    assert "[ssseeeeeettttttttthhh......rrr]" in text
