"""The environment's builder and change log, its JSON round trip, and its rendering."""

from __future__ import annotations

import itertools
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent_flow._types import JsonValue
from agent_flow.environment import (
    DEFAULT_MAX_CHANGES,
    DROP_ORDER,
    RENDER_ORDER,
    Environment,
    EnvironmentChange,
    FileInfo,
    KnowledgeBase,
    RenderReport,
    SystemState,
    TaskState,
    TaskStatus,
    WorkspaceState,
)
from agent_flow.errors import EnvironmentValidationError, UserError
from agent_flow.testing import assert_render_within
from agent_flow.testing.strategies import environments
from agent_flow.tokens import TokenCounter
from tests.env_helpers import (
    COUNTERS,
    DATASET_SCHEMA,
    TIKTOKEN,
    CharCounter,
    Dataset,
    RecordingCounter,
    assert_well_formed,
    blocks,
    section_json,
)

# -- builder and change log ----------------------------------------------------------------


def test_the_builder_sets_sections_extensions_schemas_and_the_change_limit() -> None:
    env = (
        Environment.builder()
        .system(SystemState(working_directory="/srv/app", permissions=["read"]))
        .task(TaskState(objective="Analyze sales", steps_total=5))
        .knowledge({"key_concepts": ["margin"]})
        .workspace(WorkspaceState(files={"sales.csv": FileInfo(size=10)}))
        .extension("sales", Dataset(name="sales", rows=3))
        .schema({"type": "object"})
        .extension_schema("sales", DATASET_SCHEMA)
        .max_changes(2)
        .build()
    )
    assert env.version == 0
    assert env.changes() == []
    assert env.system.working_directory == "/srv/app"
    assert env.task.steps_total == 5
    assert env.knowledge.key_concepts == ["margin"]
    assert env.workspace.files["sales.csv"].size == 10
    assert env.get_extension("sales", Dataset).rows == 3
    assert env.schema == {"type": "object"}
    assert env.extension_schemas == {"sales": DATASET_SCHEMA}
    for i in range(3):
        env.set("/task/steps_completed", i)
    assert [c.version for c in env.changes()] == [2, 3]


def test_the_change_log_records_version_op_pointer_old_and_new() -> None:
    env = Environment(task=TaskState(objective="a"))
    env.set("/task/objective", "b")
    env.set("/extensions/x", {"k": [1]})
    env.delete("/extensions/x")
    assert env.changes() == [
        EnvironmentChange(version=1, op="set", pointer="/task/objective", old="a", new="b"),
        EnvironmentChange(version=2, op="set", pointer="/extensions/x", old=None, new={"k": [1]}),
        EnvironmentChange(version=3, op="delete", pointer="/extensions/x", old={"k": [1]}),
    ]
    assert env.version == 3
    assert [c.version for c in env.changes(since_version=1)] == [2, 3]
    assert env.changes(since_version=3) == []


def test_recorded_values_do_not_change_when_the_state_changes_later() -> None:
    env = Environment()
    first = env.set("/knowledge/extra/list", [1])
    env.set("/knowledge/extra/list/-", 2)
    assert first.new == [1]
    assert env.get("/knowledge/extra/list") == [1, 2]


def test_the_change_log_keeps_the_newest_changes_up_to_its_limit() -> None:
    assert DEFAULT_MAX_CHANGES == 10_000
    env = Environment(max_changes=3)
    for i in range(5):
        env.set("/task/steps_completed", i)
    assert [c.version for c in env.changes()] == [3, 4, 5]
    assert env.version == 5
    with pytest.raises(UserError, match="max_changes"):
        Environment(max_changes=-1)


# -- JSON round trip -----------------------------------------------------------------------


@settings(max_examples=100)
@given(env=environments(), limit=st.integers(0, 5))
def test_json_round_trip_is_lossless(env: Environment, limit: int) -> None:
    text = env.to_json()
    copy = Environment.from_json(text)
    assert copy.to_json() == text
    assert copy.get("") == env.get("")
    assert copy.version == env.version
    assert copy.changes() == env.changes()
    assert copy.task == env.task
    assert list(copy.workspace.files) == list(env.workspace.files)
    # a restored environment goes on exactly like the original
    env.set("/task/steps_total", limit)
    copy.set("/task/steps_total", limit)
    assert copy.to_json() == env.to_json()


def test_json_round_trip_keeps_schemas_and_the_change_limit() -> None:
    env = Environment(
        schema={"type": "object"},
        extension_schemas={"sales": DATASET_SCHEMA},
        extensions={"sales": {"rows": 1}},
        max_changes=2,
    )
    for i in range(3):
        env.set("/extensions/sales/rows", i)
    copy = Environment.from_json(env.to_json())
    assert copy.schema == {"type": "object"}
    assert [c.version for c in copy.changes()] == [2, 3]
    with pytest.raises(EnvironmentValidationError):
        copy.set("/extensions/sales/rows", -5)
    copy.set("/task/steps_total", 1)
    assert [c.version for c in copy.changes()] == [3, 4]


@pytest.mark.parametrize(
    "text",
    [
        "not json",
        "[]",
        '{"format": 2, "version": 0, "state": {}}',
        '{"format": 1, "version": 0, "state": {"task": {"status": "bogus"}}}',
        '{"format": 1, "version": -1, "state": {}}',
    ],
)
def test_from_json_rejects_what_to_json_did_not_write(text: str) -> None:
    with pytest.raises(UserError):
        Environment.from_json(text)


# -- rendering -----------------------------------------------------------------------------


def test_an_empty_environment_renders_as_nothing() -> None:
    env = Environment()
    assert env.render(10_000, TIKTOKEN) == ""
    report = env.render_report(10_000, TIKTOKEN)
    assert report.tokens == 0
    assert report.sections == ()


def test_render_puts_each_section_under_a_header_as_compact_json_without_empty_fields() -> None:
    env = Environment(
        task=TaskState(objective="Fix the parser", status=TaskStatus.IN_PROGRESS),
        workspace=WorkspaceState(files={"src/a.py": FileInfo(size=10)}),
        extensions={"notes": {"todo": []}},
    )
    text = env.render(10_000, TIKTOKEN)
    assert text == (
        "## task\n"
        '{"objective":"Fix the parser","status":"in_progress","steps_completed":0,'
        '"steps_total":0}\n\n'
        "## workspace\n"
        '{"files":{"src/a.py":{"kind":"file","size":10}}}\n\n'
        "## extensions\n"
        '{"notes":{"todo":[]}}'
    )
    report = env.render_report(10_000, TIKTOKEN)
    assert report.tokens == TIKTOKEN.count(text)
    assert [s.name for s in report.sections] == ["task", "workspace", "extensions"]
    assert not report.degraded


def test_a_text_that_fits_exactly_is_not_degraded_even_if_its_parts_add_up_to_more() -> None:
    env = Environment(
        task=TaskState(objective="Fix the parser"),
        knowledge=KnowledgeBase(discovered_facts=["a", "b"]),
        extensions={"x": {"y": [1]}},
    )
    full = env.render(1 << 40, TIKTOKEN)
    whole = TIKTOKEN.count(full)
    parts = sum(TIKTOKEN.count(block) for block in blocks(full))
    assert parts + 2 * TIKTOKEN.count("\n\n") > whole  # "}\n\n" is one token
    assert env.render(whole, TIKTOKEN) == full


def test_a_report_is_reused_within_its_version_and_dropped_once_the_version_moves() -> None:
    env = Environment(task=TaskState(objective="Fix the parser"))
    first = env.render_report(10_000, TIKTOKEN)
    assert env.render_report(10_000, TIKTOKEN) is first
    for n in range(50):
        env.set("/extensions/step", n)
        env.render_report(10_000, TIKTOKEN)
        env.render_report(5_000, TIKTOKEN)
    # Only the newest version's reports are held: a long run keeps two, not a history.
    assert len(env._renderer._reports) == 2
    assert env.render_report(10_000, TIKTOKEN).text.endswith('{"step":49}')


@pytest.mark.parametrize("counter", COUNTERS, ids=lambda c: c.name)
def test_a_budget_of_zero_renders_as_nothing(counter: TokenCounter) -> None:
    env = Environment(task=TaskState(objective="x"))
    assert env.render(0, counter) == ""
    assert env.render(-5, counter) == ""
    assert env.render_report(0, counter).dropped == ["task"]


@settings(max_examples=200)
@given(
    env=environments(max_items=12, max_text=120),
    budget=st.one_of(st.integers(0, 40), st.integers(0, 600)),
    counter=st.sampled_from(COUNTERS),
)
def test_render_never_exceeds_the_budget_and_every_block_is_valid_json(
    env: Environment, budget: int, counter: TokenCounter
) -> None:
    assert_render_within(env, budget, counter)
    report = env.render_report(budget, counter)
    assert counter.count(report.text) <= budget
    assert report.tokens == (counter.count(report.text) if report.text else 0)
    assert_well_formed(report.text)
    assert env.render(budget, counter) == report.text
    # what fits is never degraded
    full = env.render(1 << 40, counter)
    if counter.count(full) <= budget:
        assert report.text == full
        assert not report.degraded
    # the stages run in order: strings are shortened only once lists keep one item
    if report.string_cap is not None:
        assert report.item_cap in (None, 1)
    # sections are dropped in the documented priority
    present = [s.name for s in report.sections]
    dropped = report.dropped
    assert dropped == [n for n in RENDER_ORDER if n in dropped]
    in_drop_order = [n for n in DROP_ORDER if n in present]
    assert set(dropped) == set(in_drop_order[: len(dropped)])


def test_long_lists_lose_their_oldest_items_behind_a_marker() -> None:
    facts = [f"fact number {i} about the parser" for i in range(200)]
    env = Environment(
        task=TaskState(objective="Fix it"), knowledge=KnowledgeBase(discovered_facts=facts)
    )
    report = env.render_report(300, TIKTOKEN)
    assert report.tokens <= 300
    kept = section_json(report.text, "knowledge")
    assert isinstance(kept, dict)
    shown = kept["discovered_facts"]
    assert isinstance(shown, list)
    assert shown[0] == f"… {200 - (len(shown) - 1)} earlier items"
    assert shown[1:] == facts[-(len(shown) - 1) :]
    assert len(shown) > 10
    assert report.item_cap == len(shown) - 1
    assert report.string_cap is None
    assert report.dropped == []
    (knowledge,) = [s for s in report.sections if s.name == "knowledge"]
    assert knowledge.elided_items == 200 - report.item_cap


def test_the_files_dict_loses_its_earliest_added_paths_first() -> None:
    env = Environment()
    for i in range(300):
        env.set(f"/workspace/files/src~1m{i}.py", {"size": i})
    env.set("/workspace/files/src~1m0.py/size", 999)  # an update keeps the insertion place
    report = env.render_report(400, TIKTOKEN)
    files = section_json(report.text, "workspace")
    assert isinstance(files, dict)
    shown = files["files"]
    assert isinstance(shown, dict)
    keys = list(shown)
    assert keys[0] == "…"
    assert shown["…"] == f"{300 - (len(keys) - 1)} earlier entries"
    assert keys[1:] == [f"src/m{i}.py" for i in range(300 - (len(keys) - 1), 300)]


def test_the_elision_marker_key_never_collides_with_a_real_key() -> None:
    env = Environment(extensions={"notes": {f"k{i}": i for i in range(50)} | {"…": "real"}})
    text = env.render(100, CharCounter())
    extensions = section_json(text, "extensions")
    assert isinstance(extensions, dict)
    body = extensions["notes"]
    assert isinstance(body, dict)
    assert body["…"] == "real"
    assert "……" in body


def test_strings_are_shortened_only_after_lists_are_down_to_one_item() -> None:
    env = Environment(
        task=TaskState(objective="Summarize the report. " * 200),
        knowledge=KnowledgeBase(discovered_facts=[f"fact {i}" for i in range(30)]),
    )
    report = env.render_report(250, TIKTOKEN)
    assert report.tokens <= 250
    assert report.item_cap == 1
    assert report.string_cap is not None
    task = section_json(report.text, "task")
    assert isinstance(task, dict)
    objective = task["objective"]
    assert isinstance(objective, str)
    assert re.search(r"… \[\+\d+ chars\]$", objective)
    assert objective.startswith("Summarize the report.")
    assert report.dropped == []


def test_degrading_goes_lists_then_strings_then_sections_as_the_budget_shrinks() -> None:
    env = Environment(
        system=SystemState(working_directory="/srv/app", permissions=["read", "write"]),
        task=TaskState(objective="Analyze the sales data " * 20, status=TaskStatus.IN_PROGRESS),
        knowledge=KnowledgeBase(discovered_facts=[f"fact {i} " * 5 for i in range(40)]),
        workspace=WorkspaceState(files={f"data/f{i}.csv": FileInfo(size=i) for i in range(60)}),
        extensions={"datasets": {"sales": {"rows": 1250, "columns": ["date", "region"]}}},
    )
    first_seen: dict[str, int] = {}
    for budget in range(1500, -1, -5):
        report = env.render_report(budget, TIKTOKEN)
        assert report.tokens <= budget
        for stage, happened in (
            ("elided", report.item_cap is not None),
            ("shortened", report.string_cap is not None),
            ("dropped", bool(report.dropped)),
        ):
            if happened:
                first_seen.setdefault(stage, budget)
    assert first_seen["elided"] > first_seen["shortened"] > first_seen["dropped"]


def test_sections_are_dropped_extensions_first_and_task_last() -> None:
    env = Environment(
        system=SystemState(working_directory="/w"),
        task=TaskState(objective="t"),
        knowledge=KnowledgeBase(discovered_facts=["f"]),
        workspace=WorkspaceState(files={"a": FileInfo()}),
        extensions={"e": 1},
    )
    seen: list[list[str]] = []
    for budget in range(120, -1, -1):
        report = env.render_report(budget, TIKTOKEN)
        if report.dropped not in seen:
            seen.append(report.dropped)
    dropped_sets = [set(d) for d in seen]
    assert dropped_sets[0] == set()
    assert dropped_sets[-1] == set(RENDER_ORDER)
    for smaller, larger in itertools.pairwise(dropped_sets):
        assert smaller <= larger
    order = []
    for d in seen:
        order.extend(n for n in DROP_ORDER if n in d and n not in order)
    assert order == list(DROP_ORDER)


def test_a_dropped_section_leaves_a_marker_line_when_it_fits() -> None:
    env = Environment(
        task=TaskState(objective="Fix the parser"),
        extensions={"k" * 400: 1},  # keys are never shortened: only dropping helps
    )
    report = env.render_report(40, TIKTOKEN)
    assert report.dropped == ["extensions"]
    assert report.text.endswith("## extensions: omitted to fit the token budget")
    assert section_json(report.text, "task") == {
        "objective": "Fix the parser",
        "status": "not_started",
        "steps_completed": 0,
        "steps_total": 0,
    }


def test_the_report_gives_tokens_per_section() -> None:
    env = Environment(
        task=TaskState(objective="Fix the parser"),
        knowledge=KnowledgeBase(discovered_facts=["a", "b"]),
    )
    report = env.render_report(1000, TIKTOKEN)
    assert isinstance(report, RenderReport)
    by_name = {s.name: s.tokens for s in report.sections}
    task_block, knowledge_block = report.text.split("\n\n")
    assert by_name == {
        "task": TIKTOKEN.count(task_block),
        "knowledge": TIKTOKEN.count(knowledge_block),
    }


def test_a_large_workspace_renders_within_a_small_budget() -> None:
    files: dict[str, JsonValue] = {
        f"src/pkg{i % 50}/module_{i}.py": {"size": 100 + i} for i in range(10_000)
    }
    env = Environment(task=TaskState(objective="Find the parser bug"), workspace={"files": files})
    for budget in (2000, 200, 20):
        report = env.render_report(budget, TIKTOKEN)
        assert TIKTOKEN.count(report.text) <= budget
        assert_well_formed(report.text)
    report = env.render_report(2000, TIKTOKEN)
    files = section_json(report.text, "workspace")
    assert isinstance(files, dict)
    shown = files["files"]
    assert isinstance(shown, dict)
    assert "src/pkg49/module_9999.py" in shown
    assert len(shown) > 20


def test_rendering_an_unchanged_environment_again_counts_nothing() -> None:
    counter = RecordingCounter()
    env = Environment(
        task=TaskState(objective="x"),
        knowledge=KnowledgeBase(discovered_facts=[f"fact {i}" for i in range(100)]),
    )
    first = env.render_report(120, counter)
    counted = len(counter.texts)
    assert counted > 0
    assert env.render_report(120, counter) is first
    assert len(counter.texts) == counted


def test_a_change_to_one_section_re_renders_only_that_section() -> None:
    counter = RecordingCounter()
    env = Environment(
        task=TaskState(objective="x"),
        workspace=WorkspaceState(files={f"f{i}.py": FileInfo(size=i) for i in range(500)}),
    )
    env.render(300, counter)
    env.set("/task/objective", "y")
    counter.texts.clear()
    text = env.render(300, counter)
    assert counter.texts  # the task block and the final text are counted
    workspace_block = text.split("\n\n")[1]
    assert workspace_block.startswith("## workspace")
    assert not any(t.startswith("## workspace") for t in counter.texts)
