"""The terminal renderer: the budget bar by section, the ASCII fallback, and a cut answer."""

from __future__ import annotations

import io
import itertools

from hypothesis import given
from hypothesis import strategies as st

from agent_flow.cli._reading import ReadingRenderer
from agent_flow.cli.render import EventRenderer, make_console
from agent_flow.events import (
    AgentEvent,
    IterationStarted,
    ModelOutputDiscarded,
    ModelResponded,
    RunFinished,
    RunStarted,
    TextDelta,
    ToolCallFailed,
)
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


# -- an answer cut off by Ctrl-C -------------------------------------------------------------

CUT = "[cut off here: the answer was cancelled]"
PIECES = st.text(alphabet="abc xyz.,\n", min_size=1, max_size=8)


def cancelled_run(attempts: list[list[str]], *, answered: bool) -> list[AgentEvent]:
    """A run cancelled in its first model call: `attempts` streamed (all but the last failed)."""
    seq = itertools.count()
    events: list[AgentEvent] = [
        RunStarted(run_id="r", seq=next(seq), task="t", agent="a", model="m"),
        IterationStarted(run_id="r", seq=next(seq), iteration=1),
    ]
    for number, attempt in enumerate(attempts, 1):
        events += [TextDelta(run_id="r", seq=next(seq), text=piece) for piece in attempt]
        if number < len(attempts):
            events.append(
                ModelOutputDiscarded(
                    run_id="r", seq=next(seq), iteration=1, attempt=number, text="".join(attempt)
                )
            )
    if answered:
        events.append(
            ModelResponded(
                run_id="r",
                seq=next(seq),
                iteration=1,
                finish_reason="stop",
                prompt_tokens=5,
                completion_tokens=2,
                tool_calls=1,
                duration_ms=10,
            )
        )
    events.append(
        RunFinished(
            run_id="r",
            seq=next(seq),
            stop_reason="cancelled",
            final_text="",
            iterations=1,
            prompt_tokens=0,
            completion_tokens=0,
            duration_ms=100,
        )
    )
    return events


@given(
    attempts=st.lists(st.lists(PIECES, max_size=6), min_size=1, max_size=4),
    answered=st.booleans(),
)
def test_a_cancelled_answer_shows_what_was_written_and_that_it_was_cut(
    attempts: list[list[str]], answered: bool
) -> None:
    out = io.StringIO()
    renderer = ReadingRenderer(make_console(out))
    for event in cancelled_run(attempts, answered=answered):
        renderer(event)
    written = "".join(attempts[-1]).strip()  # the failed attempts' text was void
    shown = out.getvalue()
    if written and not answered:
        assert shown.startswith(f"{written}\n{CUT}\n")
    else:
        # Nothing written, or the model's answer was whole when the run was cancelled.
        assert CUT not in shown and shown.startswith("cancelled · ")
    assert shown.splitlines()[-1].startswith("cancelled · 1 step")


def test_a_cut_answer_is_dimmed_at_a_terminal_and_marked_in_the_trace() -> None:
    out = io.StringIO()
    renderer = ReadingRenderer(make_console(out, force_terminal=True, width=60))
    for event in cancelled_run([["Once upon ", "a time"]], answered=False):
        renderer(event)
    assert "\x1b[2mOnce upon a time\x1b[0m" in out.getvalue()  # dim
    trace = io.StringIO()
    tracer = EventRenderer(make_console(trace), spinner=False)
    for event in cancelled_run([["Once upon ", "a time"]], answered=False):
        tracer(event)
    assert "Once upon a time ✂ cut off\n■ run finished: cancelled" in trace.getvalue()
