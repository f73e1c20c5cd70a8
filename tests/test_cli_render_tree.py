"""The trace view's tree: a delegated child's events under the parent's tool call, however
the parent's and its children's events interleave."""

from __future__ import annotations

import io
import itertools
import re
from collections.abc import Iterator

from hypothesis import given, settings
from hypothesis import strategies as st

from agent_flow.cli.render import EventRenderer, make_console
from agent_flow.events import (
    AgentEvent,
    IterationStarted,
    RunFinished,
    RunStarted,
    TextDelta,
    ThinkingDelta,
    ToolCallCompleted,
    ToolCallStarted,
)

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
PARENT = "p0000000-parent"
CHILDREN = ("c1111111-first", "c2222222-second")
# Streamed text: words and newlines, nothing a rendered event line could start with.
PIECES = st.text(alphabet="xyz \n", max_size=8)

ITERATION = "── iteration 1 ──"
RUNNING = "  ⚙ running grep {}"
DONE = "  ✓ grep (1 ms): found"


def finished(run: str, seq: int, path: tuple[str, ...] = ()) -> RunFinished:
    return RunFinished(
        run_id=run,
        seq=seq,
        path=path,
        stop_reason="answered",
        final_text="",
        iterations=1,
        prompt_tokens=12,
        completion_tokens=3,
        duration_ms=40,
    )


def child_events(run: str, steps: list[tuple[str, str]]) -> list[AgentEvent]:
    """A child's run: streamed text and thinking, a tool call, between its start and end."""
    path = (PARENT,)
    seq = itertools.count()
    events: list[AgentEvent] = [
        RunStarted(run_id=run, seq=next(seq), path=path, task="look", agent="a", model="m"),
        IterationStarted(run_id=run, seq=next(seq), path=path, iteration=1),
    ]
    for kind, text in steps:
        n = next(seq)
        if kind == "text":
            events.append(TextDelta(run_id=run, seq=n, path=path, text=text))
        elif kind == "thinking":
            events.append(ThinkingDelta(run_id=run, seq=n, path=path, text=text))
        else:
            events += [
                ToolCallStarted(
                    run_id=run, seq=n, path=path, call_id="k", name="grep", arguments="{}"
                ),
                ToolCallCompleted(
                    run_id=run, seq=n, path=path, call_id="k", name="grep", content="found",
                    duration_ms=1,
                ),
            ]  # fmt: skip
    return [*events, finished(run, next(seq), path)]


def parent_events(preamble: list[str], answer: list[str]) -> list[AgentEvent]:
    """The parent: text, two delegated calls (children run between start and completion), text."""
    seq = itertools.count()
    events: list[AgentEvent] = [
        RunStarted(run_id=PARENT, seq=next(seq), task="go", agent="a", model="m"),
        *(TextDelta(run_id=PARENT, seq=next(seq), text=piece) for piece in preamble),
    ]
    for number in (1, 2):
        events.append(
            ToolCallStarted(
                run_id=PARENT, seq=next(seq), call_id=f"d{number}", name="delegate", arguments="{}"
            )
        )
    for number in (1, 2):
        events.append(
            ToolCallCompleted(
                run_id=PARENT, seq=next(seq), call_id=f"d{number}", name="delegate",
                content=f"child {number} done", duration_ms=50,
            )
        )  # fmt: skip
    events += [TextDelta(run_id=PARENT, seq=next(seq), text=piece) for piece in answer]
    return [*events, finished(PARENT, next(seq))]


def interleave(
    parent: list[AgentEvent], children: list[list[AgentEvent]], choices: Iterator[int]
) -> list[AgentEvent]:
    """One order the bus can deliver them in: each child runs inside its delegated call.

    A child's events come after the parent's call that runs it started, and before it
    completed; between those the children and the parent take turns as `choices` say.
    """
    queues = [list(parent), *(list(child) for child in children)]
    started: set[str] = set()
    merged: list[AgentEvent] = []
    while any(queues):
        ready = []
        for number, queue in enumerate(queues):
            if not queue:
                continue
            head = queue[0]
            if number == 0 and isinstance(head, ToolCallCompleted) and queues[int(head.call_id[1])]:
                continue  # its child has not finished
            if number > 0 and f"d{number}" not in started:
                continue
            ready.append(number)
        number = ready[next(choices) % len(ready)]
        event = queues[number].pop(0)
        if isinstance(event, ToolCallStarted) and not event.path:
            started.add(event.call_id)
        merged.append(event)
    return merged


def expected_lines(steps: list[tuple[str, str]], kind: str) -> list[str]:
    """The lines a child's streamed `kind` shows: each stretch of it ends its line."""
    lines: list[str] = []
    stretch: list[str] = []
    for step_kind, text in [*steps, ("end", "")]:
        if step_kind == kind:
            stretch.append(text)
            continue
        if stretch:
            shown = "".join(stretch).split("\n")
            lines += shown[:-1] if shown[-1] == "" else shown
            stretch = []
    return lines


STEPS = st.lists(
    st.tuples(st.sampled_from(["text", "text", "thinking", "tool"]), PIECES), max_size=8
)


@settings(max_examples=150)
@given(
    steps=st.tuples(STEPS, STEPS),
    preamble=st.lists(st.text(alphabet="xyz ", min_size=1, max_size=6), max_size=3),
    answer=st.lists(PIECES.filter(bool), min_size=1, max_size=5),
    choices=st.lists(st.integers(0, 5), min_size=1),
)
def test_a_childs_lines_are_indented_and_its_own_however_the_runs_interleave(
    steps: tuple[list[tuple[str, str]], list[tuple[str, str]]],
    preamble: list[str],
    answer: list[str],
    choices: list[int],
) -> None:
    children = [child_events(run, script) for run, script in zip(CHILDREN, steps, strict=True)]
    events = interleave(parent_events(preamble, answer), children, itertools.cycle(choices))
    out = io.StringIO()
    renderer = EventRenderer(make_console(out), spinner=False)
    for event in events:
        renderer(event)
    lines = out.getvalue().splitlines()
    shown = out.getvalue()

    mine: set[int] = set()
    for run, script in zip(CHILDREN, steps, strict=True):
        short = run[:8]
        lead = f"    {short} │"
        start = lines.index(f"    ↳ delegated run {short} started · task: look")
        end = next(
            n for n, line in enumerate(lines) if line.startswith(f"    ■ delegated run {short} ")
        )
        own = [n for n, line in enumerate(lines) if line.startswith(lead)]
        # Its lines lie between its start and its end, each led by its indent and run id.
        assert all(start < n < end for n in own)
        assert not [line for line in lines if short in line and not line.startswith("    ")]
        mine |= {start, end, *own}
        said = [lines[n].removeprefix(lead).removeprefix(" ") for n in own]
        assert said[0] == ITERATION
        text = [line for line in said if line not in (RUNNING, DONE, ITERATION)]
        thinking_lead = "  thinking: "
        assert [line for line in text if not line.startswith(thinking_lead)] == expected_lines(
            script, "text"
        )
        assert [
            line.removeprefix(thinking_lead) for line in text if line.startswith(thinking_lead)
        ] == expected_lines(script, "thinking")
        tools = sum(kind == "tool" for kind, _ in script)
        assert (said.count(RUNNING), said.count(DONE)) == (tools, tools)

    # The parent's lines are the parent's: its streamed text whole, on lines of its own.
    parents = [line for n, line in enumerate(lines) if n not in mine]
    rest = "\n".join(parents) + "\n"
    assert "│" not in rest and "delegated run" not in rest
    if "".join(preamble).strip():
        assert f"\n{''.join(preamble)}\n  ⚙ running delegate {{}}" in "\n" + rest
    assert f"done\n{''.join(answer)}\n■ run finished: answered" in rest
    assert shown.count("".join(answer)) >= 1


def test_a_grandchild_is_indented_two_levels_and_a_cancelled_childs_text_is_marked_cut() -> None:
    child, grandchild = CHILDREN
    inner = (PARENT, child)
    events: list[AgentEvent] = [
        RunStarted(run_id=PARENT, seq=0, task="go", agent="a", model="m"),
        RunStarted(run_id=child, seq=0, path=(PARENT,), task="dig", agent="a", model="m"),
        RunStarted(run_id=grandchild, seq=0, path=inner, task="deeper", agent="a", model="m"),
        TextDelta(run_id=grandchild, seq=1, path=inner, text="found it\nthe end"),
        finished(grandchild, 2, inner),
        TextDelta(run_id=child, seq=1, path=(PARENT,), text="half an ans"),
        RunFinished(
            run_id=child, seq=2, path=(PARENT,), stop_reason="cancelled", final_text="",
            iterations=1, prompt_tokens=1, completion_tokens=1, duration_ms=5, cost_usd=0.0123,
        ),
    ]  # fmt: skip
    out = io.StringIO()
    renderer = EventRenderer(make_console(out), spinner=False)
    for event in events:
        renderer(event)
    assert out.getvalue().splitlines()[2:] == [
        "    ↳ delegated run c1111111 started · task: dig",
        "        ↳ delegated run c2222222 started · task: deeper",
        "        c2222222 │ found it",
        "        c2222222 │ the end",
        "        ■ delegated run c2222222 finished: answered after 1 iteration(s) · 12 prompt + "
        "3 completion tokens · cost unknown · 0.0 s",
        "    c1111111 │ half an ans ✂ cut off",
        "    ■ delegated run c1111111 finished: cancelled after 1 iteration(s) · 1 prompt + "
        "1 completion tokens · $0.01 · 0.0 s",
    ]


def test_an_ascii_console_draws_the_tree_in_ascii() -> None:
    raw = io.BytesIO()
    stream = io.TextIOWrapper(raw, encoding="ascii")
    renderer = EventRenderer(make_console(stream), spinner=False)
    child = CHILDREN[0]
    renderer(RunStarted(run_id=child, seq=0, path=(PARENT,), task="dig", agent="a", model="m"))
    renderer(TextDelta(run_id=child, seq=1, path=(PARENT,), text="naïve\n"))
    renderer(finished(child, 2, (PARENT,)))
    stream.flush()
    assert raw.getvalue().decode("ascii").splitlines() == [
        "    -> delegated run c1111111 started · task: dig".replace("·", "?"),
        "    c1111111 | na?ve",
        "    # delegated run c1111111 finished: answered after 1 iteration(s) ? 12 prompt + "
        "3 completion tokens ? cost unknown ? 0.0 s",
    ]


def test_a_childs_held_line_is_shown_when_the_parent_ends_before_the_child_said_it_did() -> None:
    child = CHILDREN[0]
    out = io.StringIO()
    renderer = EventRenderer(make_console(out), spinner=False)
    renderer(RunStarted(run_id=PARENT, seq=0, task="go", agent="a", model="m"))
    renderer(RunStarted(run_id=child, seq=0, path=(PARENT,), task="dig", agent="a", model="m"))
    renderer(TextDelta(run_id=child, seq=1, path=(PARENT,), text="still writ"))
    renderer(
        RunFinished(
            run_id=PARENT, seq=1, stop_reason="cancelled", final_text="", iterations=1,
            prompt_tokens=1, completion_tokens=1, duration_ms=5,
        )
    )  # fmt: skip
    lines = out.getvalue().splitlines()
    assert lines[3] == "    c1111111 │ still writ ✂ cut off"
    assert lines[4].startswith("■ run finished: cancelled after 1 iteration(s)")


@given(words=st.lists(st.text(alphabet="xyz", min_size=1, max_size=9), min_size=1, max_size=30))
def test_at_a_terminal_a_childs_long_line_wraps_under_its_lead(words: list[str]) -> None:
    child = CHILDREN[0]
    out = io.StringIO()
    renderer = EventRenderer(make_console(out, force_terminal=True, width=40), spinner=False)
    renderer(RunStarted(run_id=child, seq=0, path=(PARENT,), task="dig", agent="a", model="m"))
    renderer(TextDelta(run_id=child, seq=1, path=(PARENT,), text=" ".join(words) + "\n"))
    lines = ANSI.sub("", out.getvalue()).splitlines()
    shown = lines[lines.index("    task: dig") + 1 :]  # the start line wrapped, under its indent
    lead = "    c1111111 │ "
    assert shown[0].startswith(lead)
    assert all(line.startswith(" " * len(lead)) for line in shown[1:])
    assert all(len(line) <= 40 for line in shown)
    assert " ".join(line.strip() for line in shown).removeprefix("c1111111 │ ") == " ".join(words)
