"""The pruning lab: replayed prompts match recorded ones, known answers, invariants, CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent_flow import (
    AgentConfig,
    AgentExecutor,
    Chain,
    ContextManager,
    DropOldest,
    ElideToolResults,
    Environment,
    ExtractiveSummarizer,
    History,
    SlidingWindow,
    SummarizeOldest,
    TiktokenCounter,
)
from agent_flow.config import Pricing
from agent_flow.context import default_strategy
from agent_flow.errors import UserError
from agent_flow.history import (
    AgentMessage,
    HistoryEntry,
    ToolCallEntry,
    ToolResultEntry,
    UserMessage,
)
from agent_flow.lab import (
    Candidate,
    ProbeResult,
    RecordedSession,
    load_export,
    load_session,
    render_html,
    render_table,
    run_lab,
)
from agent_flow.lab.report import format_cost
from agent_flow.llm.base import Usage
from agent_flow.messages import ToolCall
from agent_flow.pricing import price_usage
from agent_flow.sessions import SQLiteSessionStore
from agent_flow.testing import ScriptedLLM, call, reply
from agent_flow.tools import HandlerRegistry, ToolExecutor, ToolResult, tool

DAYS = 6
RESERVE = 300


def day_text(day: int) -> str:
    """A tool answer of a few hundred tokens, holding one marker line."""
    lines = [
        f"day {day:02d} {hour:02d}:00 worker-{hour % 3} processed {40 + hour} jobs"
        for hour in range(20)
    ]
    lines.insert(10, f"MARK-{day:02d} disk {day} almost full")
    return "\n".join(lines)


@tool
def read_day(day: int) -> str:
    """Read one day's log.

    Args:
        day: The day, from 1.
    """
    return day_text(day)


def fact_handler(env: Environment, call_: ToolCall, result: ToolResult) -> None:
    day = json.loads(call_.arguments)["day"]
    env.set("/knowledge/discovered_facts/-", f"day {day} has marker MARK-{day:02d}")


async def record(
    store: SQLiteSessionStore, *, max_tokens: int = 100_000, model: str = "gpt-4o-mini"
) -> str:
    """Run a scripted agent that reads DAYS logs under `max_tokens`; return its session id."""
    handlers = HandlerRegistry.with_defaults()
    handlers.register("read_day", fact_handler)
    context = ContextManager(
        Environment(),
        History(counter=TiktokenCounter()),
        max_tokens,
        reserve_output_tokens=RESERVE,
    )
    script = [reply(f"Day {d}.", tool_calls=[call("read_day", day=d)]) for d in range(1, DAYS + 1)]
    agent = AgentExecutor(
        ScriptedLLM([*script, reply("All days read.")], model=model),
        config=AgentConfig(max_iterations=DAYS + 2),
        tools=ToolExecutor([read_day], handlers=handlers),
        context=context,
        store=store,
    )
    outcome = await agent.run("Read every day's log and list the markers.")
    assert outcome.final_text == "All days read."
    assert agent.recorder is not None and agent.recorder.session_id is not None
    return agent.recorder.session_id


@pytest.fixture
async def store(tmp_path: Path):  # type: ignore[no-untyped-def]
    async with SQLiteSessionStore(tmp_path / "s.db") as opened:
        yield opened


def candidate(name: str, max_tokens: int, strategy, **options) -> Candidate:  # type: ignore[no-untyped-def]
    return Candidate(
        name=name,
        max_tokens=max_tokens,
        strategy=strategy,
        reserve_output_tokens=options.pop("reserve_output_tokens", RESERVE),
        **options,
    )


# -- replaying what was recorded ---------------------------------------------------------


async def test_replay_under_the_recorded_settings_rebuilds_every_recorded_prompt_exactly(
    store: SQLiteSessionStore,
) -> None:
    session = await load_session(store, await record(store))
    assert (session.source, session.notes, session.model) == ("history", (), "gpt-4o-mini")
    assert len(session.steps) == DAYS + 1 and session.tool_tokens > 0
    report = await run_lab([session], [candidate("as recorded", 100_000, default_strategy())])
    steps = report.candidates[0].sessions[0].steps
    recorded = [s.recorded_tokens for s in steps]
    assert None not in recorded
    assert [s.tokens for s in steps] == recorded
    assert report.candidates[0].prunes == 0 and report.candidates[0].retention_final == 1.0


async def test_the_environment_of_each_step_is_rolled_back_to_what_the_model_saw(
    store: SQLiteSessionStore,
) -> None:
    session = await load_session(store, await record(store))
    facts = [
        list(s.environment.knowledge.discovered_facts) if s.environment else None
        for s in session.steps
    ]
    assert facts == [
        [f"day {d} has marker MARK-{d:02d}" for d in range(1, k)] for k in range(1, DAYS + 2)
    ]


async def test_drop_oldest_under_a_small_budget_keeps_the_newest_answers_and_every_fact(
    store: SQLiteSessionStore,
) -> None:
    # Each day's turn costs about 340 tokens; 1,500 minus the reserve (300), the tool schemas
    # (about 310) and the system template leaves room for two turns, never three.
    session = await load_session(store, await record(store))
    report = await run_lab(
        [session],
        [candidate("drop", 1500, DropOldest()), candidate("roomy", 100_000, DropOldest())],
        probes=["MARK-01 disk 1", "MARK-06 disk 6", "never said"],
    )
    drop, roomy = report.candidates
    last = drop.sessions[0].steps[-1]
    tool_facts = sorted(i for i in last.visible if i.startswith("tool:"))
    assert tool_facts == ["tool:5", "tool:6"]
    assert {i for i in last.visible if i.startswith("env:")} == {f"env:{d}" for d in range(1, 7)}
    assert "probe:2" in last.visible and "probe:1" not in last.visible
    assert "probe:3" not in last.available  # never in the session: not counted against anyone
    assert [s.step for s in drop.sessions[0].steps if s.pruned] == [4, 6]
    assert all(s.tokens <= 1500 - RESERVE for s in drop.sessions[0].steps)
    assert drop.prunes == 2 and drop.summaries == 0
    assert last.retention == len(last.visible) / len(last.available) < 1.0
    assert roomy.retention_final == 1.0 and roomy.prunes == 0
    assert roomy.tokens > drop.tokens
    # The tokens not sent are what the dropped turns cost.
    assert drop.max_step_tokens <= 1500 - RESERVE < roomy.max_step_tokens


async def test_an_export_replays_like_the_stored_session(
    store: SQLiteSessionStore, tmp_path: Path
) -> None:
    session_id = await record(store)
    await store.export(session_id, tmp_path / "run.jsonl")
    stored = await load_session(store, session_id)
    exported = load_export(tmp_path / "run.jsonl")
    candidates = [candidate("drop", 1500, DropOldest())]
    a = await run_lab([stored], candidates)
    b = await run_lab([exported], candidates)
    assert a == b


async def test_a_session_pruned_while_it_ran_is_rebuilt_from_its_events(
    store: SQLiteSessionStore,
) -> None:
    whole = await load_session(store, await record(store))
    pruned = await load_session(store, await record(store, max_tokens=1500))
    assert pruned.source == "events" and "rebuilt from the events" in pruned.notes[0]

    def shape(entries: tuple[HistoryEntry, ...]) -> list[tuple[str, str]]:
        return [
            (
                e.kind,
                getattr(e, "content", "") or getattr(getattr(e, "call", None), "arguments", ""),
            )
            for e in entries
        ]

    assert shape(pruned.entries) == shape(whole.entries)
    assert [s.history_length for s in pruned.steps] == [s.history_length for s in whole.steps]


async def test_a_summarizing_candidate_summarizes_offline_and_says_so(
    store: SQLiteSessionStore,
) -> None:
    session = await load_session(store, await record(store))
    summarize = SummarizeOldest(ExtractiveSummarizer(), keep_last_units=1, after=DropOldest())
    report = await run_lab([session], [candidate("summ", 1500, summarize)])
    result = report.candidates[0]
    assert result.summaries > 0 and result.summarizer == "ExtractiveSummarizer"
    assert any("ExtractiveSummarizer" in note and "not by a model" in note for note in report.notes)
    assert all(s.tokens <= 1500 - RESERVE for s in result.sessions[0].steps)


async def test_cost_is_priced_per_step_and_unknown_for_an_unknown_model(
    store: SQLiteSessionStore,
) -> None:
    session = await load_session(store, await record(store))
    known = (await run_lab([session], [candidate("c", 100_000, DropOldest())])).candidates[0]
    steps = known.sessions[0].steps
    expected = sum(
        price_usage(
            "gpt-4o-mini", Usage(prompt_tokens=s.tokens, completion_tokens=c.completion_tokens)
        )
        or 0.0
        for s, c in zip(steps, session.steps, strict=True)
    )
    assert known.cost_usd is not None and known.cost_usd == pytest.approx(expected) and expected > 0
    unknown = await run_lab(
        [session], [candidate("c", 100_000, DropOldest())], model="no-such-model-anywhere"
    )
    assert unknown.candidates[0].cost_usd is None
    assert "unknown" in render_table(unknown)
    priced = await run_lab(
        [session],
        [candidate("c", 100_000, DropOldest())],
        model="no-such-model-anywhere",
        pricing=Pricing(input_per_million=1.0, output_per_million=0.0),
    )
    assert priced.candidates[0].cost_usd == pytest.approx(known.tokens / 1_000_000)


async def test_one_unpriced_session_leaves_the_known_part_of_the_cost_in_view(
    store: SQLiteSessionStore,
) -> None:
    priced = await load_session(store, await record(store))
    local = await load_session(store, await record(store, model="my-local-gguf"))
    alone = (await run_lab([priced], [candidate("c", 100_000, DropOldest())])).candidates[0]
    both = (await run_lab([priced, local], [candidate("c", 100_000, DropOldest())])).candidates[0]
    assert alone.cost_usd is not None and alone.unpriced_steps == 0
    # The total is not known, but the part that is still is, and how much is missing.
    assert both.cost_usd is None
    assert both.cost_known_usd == pytest.approx(alone.cost_usd)
    assert both.unpriced_steps == len(local.steps)
    shown = format_cost(both.cost_known_usd, both.unpriced_steps, both.steps)
    assert shown == f"≥ {format_cost(alone.cost_usd, 0, alone.steps)} + unknown"
    report = await run_lab([priced, local], [candidate("c", 100_000, DropOldest())])
    assert shown in render_table(report) and shown in render_html(report)
    only_local = await run_lab([local], [candidate("c", 100_000, DropOldest())])
    row = render_table(only_local).splitlines()[1]
    assert " unknown " in row and "≥" not in row


@given(
    known=st.floats(0, 1000, allow_nan=False),
    steps=st.integers(0, 50),
    data=st.data(),
)
def test_a_cost_says_unknown_only_for_what_is_unknown(
    known: float, steps: int, data: st.DataObject
) -> None:
    unpriced = data.draw(st.integers(0, steps))
    text = format_cost(known, unpriced, steps)
    if steps == 0:
        assert text == "-"
    elif unpriced == steps:
        assert text == "unknown"
    else:
        amount = float(text.removeprefix("≥ ").removeprefix("$").split(" ")[0])
        assert amount == pytest.approx(known, rel=1e-3, abs=1e-6)
        assert text.startswith("≥ $") == (unpriced > 0)
        assert text.endswith(" + unknown") == (unpriced > 0)


async def test_each_probe_is_followed_on_its_own_under_each_candidate(
    store: SQLiteSessionStore,
) -> None:
    session = await load_session(store, await record(store))
    report = await run_lab(
        [session],
        [candidate("drop", 1500, DropOldest()), candidate("roomy", 100_000, DropOldest())],
        probes=["MARK-01 disk 1", "MARK-06 disk 6", "never said"],
    )
    drop, roomy = report.candidates
    # Day 1's answer arrives before step 2: the session holds it at steps 2-7 (six steps).
    assert roomy.probes[0] == ProbeResult(
        probe="MARK-01 disk 1", steps_available=6, steps_visible=6, sessions=1, visible_at_end=1
    )
    steps = drop.sessions[0].steps
    shown = [s.step for s in steps if "probe:1" in s.visible]
    assert drop.probes[0].steps_visible == len(shown) and shown == [2, 3]  # pruned at step 4
    assert (drop.probes[0].sessions, drop.probes[0].visible_at_end) == (1, 0)
    assert drop.probes[1].visible_at_end == 1
    assert drop.probes[2] == ProbeResult(
        probe="never said", steps_available=0, steps_visible=0, sessions=0, visible_at_end=0
    )
    table = render_table(report)
    header, *rows = table.split("\n\nPROBE", 1)[1].split("\n\n", 1)[0].splitlines()
    assert header.split() == ["drop", "roomy"]
    assert rows == [
        '"MARK-01 disk 1"  2/6 steps, lost at end  6/6 steps, kept at end',
        '"MARK-06 disk 6"  1/1 steps, kept at end  1/1 steps, kept at end',
        '"never said"      never present           never present',
    ]


# -- sessions and candidates built in code ------------------------------------------------


def turns(sizes: list[int]) -> list[HistoryEntry]:
    """A task, then one tool call per size answered by `size` words holding a marker."""
    entries: list[HistoryEntry] = [UserMessage(content="Collect the markers.")]
    for number, size in enumerate(sizes, 1):
        call_id = f"c{number}"
        entries += [
            AgentMessage(content=f"Step {number}."),
            ToolCallEntry(call=ToolCall(id=call_id, name="fetch", arguments="{}")),
            ToolResultEntry(
                call_id=call_id,
                tool_name="fetch",
                content=f"marker-{number} " + " ".join(["word"] * size),
            ),
        ]
    entries.append(AgentMessage(content="Done."))
    return entries


def test_a_session_built_from_entries_has_one_step_per_model_turn() -> None:
    session = RecordedSession.from_entries(turns([5, 5, 5]))
    assert [s.history_length for s in session.steps] == [1, 4, 7, 10]
    assert session.title == "Collect the markers."
    with pytest.raises(UserError):
        RecordedSession.from_entries(
            [ToolResultEntry(call_id="x", tool_name="fetch", content="orphan")]
        )


async def test_the_lab_refuses_duplicate_names_no_candidates_and_no_sessions() -> None:
    session = RecordedSession.from_entries(turns([5]))
    with pytest.raises(UserError, match="two candidates are named 'a'"):
        await run_lab([session], [candidate("a", 4000, DropOldest())] * 2)
    with pytest.raises(UserError, match="at least one candidate"):
        await run_lab([session], [])
    with pytest.raises(UserError, match="at least one recorded session"):
        await run_lab([], [candidate("a", 4000, DropOldest())])
    with pytest.raises(UserError, match="max_tokens=0"):
        candidate("a", 0, DropOldest())


async def test_a_budget_too_small_for_the_fixed_costs_ends_that_replay_with_a_note() -> None:
    session = RecordedSession.from_entries(turns([5, 5]), tool_tokens=650)
    report = await run_lab(
        [session], [candidate("tiny", 700, DropOldest(), reserve_output_tokens=100)]
    )
    result = report.candidates[0].sessions[0]
    assert result.steps == () and "no step fits 'tiny'" in result.notes[-1]
    tiny = report.candidates[0]
    assert (tiny.steps, tiny.cost_usd, tiny.retention_final, tiny.retention_mean) == (0, None, 0, 0)
    assert "note: session: no step fits 'tiny'" in render_table(report)


async def test_environment_facts_count_when_the_rendered_environment_shows_them() -> None:
    env = Environment()
    env.set("/knowledge/discovered_facts/-", 'the key is "blue" — 42°F')
    session = RecordedSession.from_entries(turns([5]), environment=env)
    report = await run_lab([session], [candidate("c", 4000, DropOldest())])
    last = report.candidates[0].sessions[0].steps[-1]
    assert "env:1" in last.visible  # found although the environment renders it JSON-escaped


# -- invariants --------------------------------------------------------------------------

STRATEGIES = st.sampled_from(["drop", "elide", "window", "summarize"])


def make_strategy(name: str):  # type: ignore[no-untyped-def]
    return {
        "drop": DropOldest(),
        "elide": Chain(ElideToolResults(), DropOldest()),
        "window": Chain(SlidingWindow(2), DropOldest()),
        "summarize": SummarizeOldest(ExtractiveSummarizer(), keep_last_units=1, after=DropOldest()),
    }[name]


@given(
    sizes=st.lists(st.integers(1, 300), min_size=1, max_size=8),
    budget=st.integers(900, 4000),
    strategy=STRATEGIES,
    tool_tokens=st.integers(0, 200),
)
async def test_no_replayed_prompt_exceeds_its_candidates_budget(
    sizes: list[int], budget: int, strategy: str, tool_tokens: int
) -> None:
    session = RecordedSession.from_entries(turns(sizes), tool_tokens=tool_tokens)
    report = await run_lab(
        [session], [candidate("c", budget, make_strategy(strategy), counter="approx")]
    )
    result = report.candidates[0].sessions[0]
    assert len(result.steps) == len(session.steps)
    for step in result.steps:
        assert step.tokens == step.breakdown.total <= budget - RESERVE
        assert set(step.visible) <= set(step.available)
        assert step.units_omitted >= 0


@given(
    sizes=st.lists(st.integers(1, 300), min_size=1, max_size=8),
    budgets=st.lists(st.integers(900, 5000), min_size=2, max_size=2, unique=True),
    strategy=st.sampled_from(["drop", "elide"]),
)
async def test_a_bigger_budget_never_retains_fewer_answers_when_pruning_to_the_budget(
    sizes: list[int], budgets: list[int], strategy: str
) -> None:
    # With prune_target 1.0 a non-summarizing strategy keeps the largest newest part that
    # fits, so more room never shows less. (With the default target of 0.8 this does not
    # hold: a bigger budget prunes later but deeper, and may show less at that step.)
    small, big = sorted(budgets)
    session = RecordedSession.from_entries(turns(sizes))
    report = await run_lab(
        [session],
        [
            candidate("small", small, make_strategy(strategy), counter="approx", prune_target=1.0),
            candidate("big", big, make_strategy(strategy), counter="approx", prune_target=1.0),
        ],
    )
    few, many = (c.sessions[0].steps for c in report.candidates)
    for a, b in zip(few, many, strict=True):
        assert set(a.visible) <= set(b.visible)


@given(
    sizes=st.lists(st.integers(1, 300), min_size=1, max_size=8),
    budget=st.integers(900, 4000),
    strategy=STRATEGIES,
    data=st.data(),
)
async def test_a_probe_is_present_from_the_step_after_its_answer_and_visible_at_most_then(
    sizes: list[int], budget: int, strategy: str, data: st.DataObject
) -> None:
    numbers = data.draw(st.lists(st.integers(1, len(sizes)), min_size=1, max_size=3))
    probes = [f"marker-{n} word" for n in numbers]
    session = RecordedSession.from_entries(turns(sizes))
    report = await run_lab(
        [session],
        [
            candidate("c", budget, make_strategy(strategy), counter="approx"),
            candidate("roomy", 1_000_000, DropOldest(), counter="approx"),
        ],
        probes=probes,
    )
    tight, roomy = report.candidates
    steps = len(session.steps)
    for number, result, everything in zip(numbers, tight.probes, roomy.probes, strict=True):
        # Call `number`'s answer is in the history from step number + 1 on, whatever the budget.
        assert result.steps_available == everything.steps_available == steps - number
        assert everything.steps_visible == everything.steps_available
        assert result.steps_visible <= result.steps_available
        assert result.sessions == everything.sessions == 1
        last = tight.sessions[0].steps[-1]
        assert result.visible_at_end == (f"probe:{numbers.index(number) + 1}" in last.visible)


async def test_a_step_whose_pinned_history_outgrows_the_budget_ends_the_replay_there() -> None:
    entries = turns([5, 5])
    session = RecordedSession(
        id="s",
        title="t",
        entries=(UserMessage(content="task " + "word " * 400), *entries[1:]),
        steps=RecordedSession.from_entries(entries).steps,
    )
    report = await run_lab([session], [candidate("tiny", 600, DropOldest(), counter="approx")])
    result = report.candidates[0].sessions[0]
    assert result.steps == () and "step 1 does not fit 'tiny'" in result.notes[-1]


async def test_with_the_default_prune_target_a_bigger_budget_can_show_less() -> None:
    # Found by hypothesis: 1,209 tokens prunes one step later than 1,204 but down to 80% of a
    # larger share, so at step 7 it shows one answer fewer. Why the invariant above pins 1.0.
    session = RecordedSession.from_entries(turns([111, 1, 153, 241, 86, 1]))
    report = await run_lab(
        [session],
        [
            candidate("small", 1204, DropOldest(), counter="approx"),
            candidate("big", 1209, DropOldest(), counter="approx"),
        ],
    )
    few, many = (c.sessions[0].steps[6] for c in report.candidates)
    assert set(many.visible) < set(few.visible)


# -- the environment of each step ----------------------------------------------------------

VALUES = st.one_of(st.integers(-5, 5), st.text(max_size=8), st.lists(st.integers(0, 3), max_size=3))
OPERATIONS = st.lists(
    st.one_of(
        st.tuples(st.just("fact"), st.text(min_size=1, max_size=10)),
        st.tuples(st.just("replace_fact"), st.integers(0, 5), st.text(max_size=10)),
        st.tuples(st.just("delete_fact"), st.integers(0, 5)),
        st.tuples(
            st.just("extension"), st.sampled_from(["a", "b"]), st.sampled_from(["x", "y"]), VALUES
        ),
        st.tuples(
            st.just("delete_extension"), st.sampled_from(["a", "b"]), st.sampled_from(["x", "y"])
        ),
        st.tuples(st.just("step"), st.text(min_size=1, max_size=10)),
        st.tuples(st.just("drop_extension"), st.sampled_from(["a", "b"])),
    ),
    max_size=12,
)


@given(operations=OPERATIONS)
def test_rolling_the_environment_back_gives_its_state_at_every_version(
    operations: list[tuple[object, ...]],
) -> None:
    from agent_flow.lab._rollback import environment_at as _environment_at

    env = Environment()
    snapshots = {0: json.loads(env.to_json())["state"]}
    for operation in operations:
        kind, *args = operation
        facts = env.knowledge.discovered_facts
        if kind == "fact":
            env.set("/knowledge/discovered_facts/-", args[0])
        elif kind == "replace_fact" and facts:
            env.set(f"/knowledge/discovered_facts/{int(args[0]) % len(facts)}", args[1])
        elif kind == "delete_fact" and facts:
            env.delete(f"/knowledge/discovered_facts/{int(args[0]) % len(facts)}")
        elif kind == "extension":
            env.set(f"/extensions/{args[0]}/{args[1]}", args[2])
        elif kind == "delete_extension" and env.has(f"/extensions/{args[0]}/{args[1]}"):
            env.delete(f"/extensions/{args[0]}/{args[1]}")
        elif kind == "drop_extension" and env.has(f"/extensions/{args[0]}"):
            env.delete(f"/extensions/{args[0]}")
        elif kind == "step":
            env.update_section("task", current_step=args[0])
        snapshots[env.version] = json.loads(env.to_json())["state"]
    for version, state in snapshots.items():
        rolled, reached = _environment_at(env, version)
        assert reached
        assert json.loads(rolled.to_json())["state"] == state, version
