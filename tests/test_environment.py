from __future__ import annotations

import copy
import itertools
import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError

from agent_flow._types import JsonValue
from agent_flow.environment import (
    DEFAULT_MAX_CHANGES,
    DROP_ORDER,
    RENDER_ORDER,
    ArtifactInfo,
    Environment,
    EnvironmentChange,
    FileInfo,
    KnowledgeBase,
    PlanStep,
    RenderReport,
    SystemState,
    TaskState,
    TaskStatus,
    WorkspaceState,
)
from agent_flow.errors import EnvironmentValidationError, PointerError, UserError
from agent_flow.testing import assert_render_within
from agent_flow.testing.strategies import environments, pointer_writes
from agent_flow.tokens import ApproxCounter, BaseTokenCounter, TokenCounter, default_counter

APPROX = ApproxCounter()
TIKTOKEN = default_counter()


class CharCounter(BaseTokenCounter):
    """One token per character."""

    name = "chars"

    def count(self, text: str) -> int:
        return len(text)


class WordCounter(BaseTokenCounter):
    """Whitespace-separated words: compact JSON is a handful of very long 'tokens'."""

    name = "words"

    def count(self, text: str) -> int:
        return len(text.split())


class SeamCounter(BaseTokenCounter):
    """Charges extra where blocks meet, so adding up parts underestimates the whole."""

    name = "seams"

    def count(self, text: str) -> int:
        return (len(text) + 3) // 4 + 7 * text.count("\n\n##")


class RecordingCounter(BaseTokenCounter):
    """Counts like ApproxCounter and remembers every text it was asked about."""

    name = "recording"

    def __init__(self) -> None:
        self.texts: list[str] = []

    def count(self, text: str) -> int:
        self.texts.append(text)
        return (len(text) + 3) // 4


COUNTERS: list[TokenCounter] = [APPROX, TIKTOKEN, CharCounter(), WordCounter(), SeamCounter()]


def snapshot(env: Environment) -> str:
    """Everything observable about an environment's data: state, version, log, schemas."""
    return env.to_json()


def blocks(text: str) -> list[str]:
    return text.split("\n\n") if text else []


def assert_well_formed(text: str) -> None:
    """Every block is `## <section>` + one line of valid JSON, or a one-line drop marker."""
    for block in blocks(text):
        header, _, body = block.partition("\n")
        if body:
            assert re.fullmatch(r"## (system|task|knowledge|workspace|extensions)", header)
            json.loads(body)
            assert "\n" not in body
        else:
            assert re.fullmatch(
                r"## (system|task|knowledge|workspace|extensions): omitted to fit the token "
                r"budget",
                header,
            )


def section_json(text: str, name: str) -> JsonValue:
    for block in blocks(text):
        header, _, body = block.partition("\n")
        if header == f"## {name}" and body:
            return json.loads(body)
    raise AssertionError(f"no {name} block in {text!r}")


# -- pointers ------------------------------------------------------------------------------


def test_get_reads_typed_fields_and_the_whole_state_by_pointer() -> None:
    env = Environment(task=TaskState(objective="Fix the parser", status=TaskStatus.IN_PROGRESS))
    assert env.get("/task/status") == "in_progress"
    assert env.get("/task/objective") == "Fix the parser"
    assert env.get("/task/plan") == []
    whole = env.get("")
    assert isinstance(whole, dict)
    assert list(whole) == ["system", "task", "knowledge", "workspace", "extensions"]


def test_set_with_dash_appends_and_records_the_index_the_value_got() -> None:
    env = Environment()
    first = env.set("/knowledge/discovered_facts/-", "the parser splits on commas")
    second = env.set("/knowledge/discovered_facts/-", "quotes are not handled")
    assert env.get("/knowledge/discovered_facts") == [
        "the parser splits on commas",
        "quotes are not handled",
    ]
    assert first.pointer == "/knowledge/discovered_facts/0"
    assert second.pointer == "/knowledge/discovered_facts/1"
    assert env.get(second.pointer) == "quotes are not handled"


def test_set_creates_missing_parent_objects() -> None:
    env = Environment()
    change = env.set("/extensions/datasets/sales/rows", 1250)
    assert env.get("/extensions/datasets") == {"sales": {"rows": 1250}}
    assert change.old is None
    assert change.new == 1250
    env.set("/extensions/datasets/sales/columns", ["date", "region"])
    assert env.get("/extensions/datasets/sales") == {"rows": 1250, "columns": ["date", "region"]}


def test_created_parent_in_a_typed_section_gets_the_model_defaults() -> None:
    env = Environment()
    env.set("/workspace/files/src~1main.py/size", 120)
    assert env.get("/workspace/files/src~1main.py") == {
        "kind": "file",
        "size": 120,
        "summary": None,
    }
    assert env.workspace.files["src/main.py"] == FileInfo(size=120)


def test_pointers_unescape_tilde_and_slash() -> None:
    env = Environment()
    env.set("/extensions/a~1b/c~0d", 1)
    assert env.get("/extensions") == {"a/b": {"c~d": 1}}
    assert env.get("/extensions/a~1b/c~0d") == 1
    change = env.set_extension("x/y~z", [1])
    assert change.pointer == "/extensions/x~1y~0z"
    assert env.get("/extensions/x~1y~0z/0") == 1


@pytest.mark.parametrize("pointer", ["task/status", "/task/~2", "/task~"])
def test_a_malformed_pointer_raises_pointer_error_naming_it(pointer: str) -> None:
    env = Environment()
    for action in (
        lambda: env.get(pointer),
        lambda: env.set(pointer, "x"),
        lambda: env.delete(pointer),
        lambda: env.has(pointer),
    ):
        with pytest.raises(PointerError, match=re.escape(repr(pointer))):
            action()


@pytest.mark.parametrize(
    "pointer",
    [
        "/nothing",
        "/task/plan/0",
        "/extensions/missing",
        "/knowledge/discovered_facts/-",
        "/task/objective/deeper",
    ],
)
def test_reading_a_missing_location_raises_pointer_error_naming_it(pointer: str) -> None:
    env = Environment()
    with pytest.raises(PointerError, match=re.escape(repr(pointer))):
        env.get(pointer)
    assert not env.has(pointer)


def test_array_indexes_must_be_plain_decimals_in_range() -> None:
    env = Environment(knowledge=KnowledgeBase(discovered_facts=["a", "b"]))
    assert env.get("/knowledge/discovered_facts/1") == "b"
    for bad in ("01", "2", "-1", "x", "\u0661"):  # the last is an Arabic-Indic digit one
        pointer = f"/knowledge/discovered_facts/{bad}"
        with pytest.raises(PointerError, match=re.escape(repr(pointer))):
            env.get(pointer)
        with pytest.raises(PointerError, match=re.escape(repr(pointer))):
            env.set(pointer, "c")
    with pytest.raises(PointerError, match="only valid as the last token"):
        env.set("/task/plan/-/description", "x")
    assert env.version == 0


def test_writing_below_a_scalar_raises_pointer_error() -> None:
    env = Environment(task=TaskState(objective="x"))
    env.set("/extensions/n", 5)
    with pytest.raises(PointerError, match="/extensions/n/deeper"):
        env.set("/extensions/n/deeper", 1)
    with pytest.raises(PointerError, match="/task/objective/deeper"):
        env.set("/task/objective/deeper", 1)
    assert env.version == 1


def test_a_field_the_section_lacks_raises_pointer_error_listing_the_fields() -> None:
    env = Environment()
    with pytest.raises(PointerError, match="'bogus', which is not a field of TaskState"):
        env.set("/task/bogus", 1)
    with pytest.raises(PointerError, match="'memory', which is not a section"):
        env.set("/memory", {})
    assert env.version == 0


@pytest.mark.parametrize("value", [{1, 2}, float("nan"), float("inf"), {1: "a"}, object()])
def test_a_value_that_is_not_json_raises_user_error(value: object) -> None:
    env = Environment()
    with pytest.raises(UserError, match="/extensions/x"):
        env.set("/extensions/x", value)  # type: ignore[arg-type]
    assert env.version == 0


def test_delete_removes_dict_entries_and_array_items() -> None:
    env = Environment(
        knowledge=KnowledgeBase(discovered_facts=["a", "b", "c"], sources={"x": "1", "y": "2"})
    )
    change = env.delete("/knowledge/discovered_facts/1")
    assert env.get("/knowledge/discovered_facts") == ["a", "c"]
    assert (change.op, change.pointer, change.old, change.new) == (
        "delete",
        "/knowledge/discovered_facts/1",
        "b",
        None,
    )
    env.delete("/knowledge/sources/x")
    assert env.get("/knowledge/sources") == {"y": "2"}
    env.set_extension("tmp", {"a": 1})
    env.delete("/extensions/tmp")
    assert env.get("/extensions") == {}
    with pytest.raises(PointerError, match="/extensions/tmp"):
        env.delete("/extensions/tmp")


@pytest.mark.parametrize("pointer", ["", "/task", "/extensions", "/task/objective"])
def test_delete_refuses_sections_and_typed_fields(pointer: str) -> None:
    env = Environment(task=TaskState(objective="x"))
    with pytest.raises(UserError):
        env.delete(pointer)
    assert env.version == 0
    assert env.get("/task/objective") == "x"


def test_delete_of_a_field_inside_a_typed_item_is_refused() -> None:
    env = Environment(task=TaskState(plan=[PlanStep(description="read", result="ok")]))
    with pytest.raises(UserError, match="field of PlanStep"):
        env.delete("/task/plan/0/result")
    env.delete("/task/plan/0")
    assert env.task.plan == []


def test_get_returns_a_copy_that_cannot_change_the_state() -> None:
    env = Environment(knowledge=KnowledgeBase(discovered_facts=["a"]))
    facts = env.get("/knowledge/discovered_facts")
    assert isinstance(facts, list)
    facts.append("sneaky")
    value: dict[str, JsonValue] = {"rows": [1, 2]}
    env.set_extension("d", value)
    rows = value["rows"]
    assert isinstance(rows, list)
    rows.append(3)
    assert env.get("/knowledge/discovered_facts") == ["a"]
    assert env.get("/extensions/d") == {"rows": [1, 2]}


@settings(max_examples=100)
@given(env=environments(), write=pointer_writes())
def test_set_then_get_returns_the_value(env: Environment, write: tuple[str, JsonValue]) -> None:
    pointer, value = write
    try:
        change = env.set(pointer, value)
    except PointerError:
        # Only a drawn extension path can run into an existing scalar or array.
        assert pointer.startswith("/extensions/")
        return
    assert env.get(change.pointer) == value
    assert change.new == value
    assert env.changes()[-1] == change


# -- typed sections ------------------------------------------------------------------------


def test_typed_views_reflect_pointer_writes() -> None:
    env = Environment()
    env.set("/task/status", "in_progress")
    env.set("/task/plan/-", {"description": "read the code"})
    env.set("/workspace/artifacts/-", ArtifactInfo(name="report", path="out/report.md"))
    env.set("/system/permissions", ["read", "write"])
    assert env.task.status is TaskStatus.IN_PROGRESS
    assert env.task.plan == [PlanStep(description="read the code")]
    assert env.workspace.artifacts[0].path == "out/report.md"
    assert env.system.permissions == ["read", "write"]
    assert env.knowledge == KnowledgeBase()


def test_typed_view_is_cached_until_its_own_section_changes() -> None:
    env = Environment(task=TaskState(objective="x"))
    task = env.task
    assert env.task is task
    env.set("/knowledge/discovered_facts/-", "fact")
    assert env.task is task
    env.set("/task/steps_total", 3)
    assert env.task is not task
    assert env.task.steps_total == 3


def test_typed_views_are_read_only_all_the_way_down() -> None:
    env = Environment(
        task=TaskState(plan=[PlanStep(description="read")]),
        knowledge=KnowledgeBase(extra={"notes": {"todo": ["a"]}}),
        workspace=WorkspaceState(files={"a.py": FileInfo()}),
    )
    with pytest.raises(ValidationError, match="frozen"):
        env.task.objective = "changed"  # type: ignore[misc]
    todo = env.knowledge.extra["notes"]
    assert isinstance(todo, dict)
    for mutate in (
        lambda: env.task.plan.append(PlanStep(description="sneaky")),
        lambda: env.task.plan.__setitem__(0, PlanStep(description="sneaky")),
        lambda: env.workspace.files.pop("a.py"),
        lambda: env.workspace.files.__setitem__("b.py", FileInfo()),
        lambda: todo.clear(),
    ):
        with pytest.raises(TypeError, match="read-only environment snapshot"):
            mutate()
    assert env.task.plan == [PlanStep(description="read")]
    assert list(env.workspace.files) == ["a.py"]
    assert env.version == 0


def test_a_deep_copy_of_a_typed_view_is_an_ordinary_mutable_model() -> None:
    env = Environment(task=TaskState(plan=[PlanStep(description="read")]))
    for copied in (copy.deepcopy(env.task), env.task.model_copy(deep=True)):
        copied.plan.append(PlanStep(description="fix"))
        assert type(copied.plan) is list
        assert len(copied.plan) == 2
    assert len(env.task.plan) == 1
    env.task = env.task.model_copy(update={"plan": [*env.task.plan, PlanStep(description="x")]})
    assert [step.description for step in env.task.plan] == ["read", "x"]


def test_assigning_a_section_property_records_a_set() -> None:
    env = Environment()
    env.task = env.task.model_copy(update={"objective": "Ship it", "steps_total": 2})
    assert env.get("/task/objective") == "Ship it"
    (change,) = env.changes()
    assert change.pointer == "/task"
    assert isinstance(change.new, dict)
    assert change.new["steps_total"] == 2
    env.system = SystemState(working_directory="/srv")
    env.knowledge = KnowledgeBase(key_concepts=["BPE"])
    env.workspace = WorkspaceState(files={"a.py": FileInfo()})
    assert env.version == 4
    assert env.workspace.files == {"a.py": FileInfo()}


def test_update_section_records_one_change_per_field() -> None:
    env = Environment()
    changes = env.update_section(
        "task",
        status=TaskStatus.IN_PROGRESS,
        current_step="read the parser",
        plan=[PlanStep(description="read"), PlanStep(description="fix")],
    )
    assert [c.pointer for c in changes] == ["/task/status", "/task/current_step", "/task/plan"]
    assert [c.version for c in changes] == [1, 2, 3]
    assert changes[0].old == "not_started"
    assert changes[0].new == "in_progress"
    assert env.task.plan[1].description == "fix"


def test_update_section_is_all_or_nothing() -> None:
    env = Environment(task=TaskState(objective="x"))
    before = snapshot(env)
    with pytest.raises(EnvironmentValidationError, match="steps_total"):
        env.update_section("task", objective="y", steps_total="many")
    with pytest.raises(PointerError, match="bogus"):
        env.update_section("task", objective="y", bogus=1)
    with pytest.raises(UserError, match="extensions"):
        env.update_section("extensions", x=1)  # type: ignore[arg-type]
    assert snapshot(env) == before


@pytest.mark.parametrize(
    ("pointer", "value"),
    [
        ("/task/status", "bogus"),
        ("/task/steps_completed", "3"),
        ("/task/steps_completed", True),
        ("/task/steps_completed", 2.5),
        ("/task/objective", 7),
        ("/task/plan/-", {"completed": True}),
        ("/task/plan/-", {"description": "x", "extra": 1}),
        ("/task", {"objective": 1}),
        ("/workspace/files/a.py", {"size": "big"}),
        ("/workspace/files/a.py/kind", "symlink"),
        ("/knowledge/sources/docs", ["not", "a", "string"]),
        ("/system/permissions", "read"),
        ("/extensions", ["not", "an", "object"]),
        ("", {"task": {"status": "bogus"}}),
    ],
)
def test_a_wrong_type_in_a_typed_section_raises_and_changes_nothing(
    pointer: str, value: JsonValue
) -> None:
    env = Environment(
        task=TaskState(objective="keep", plan=[PlanStep(description="one")]),
        workspace=WorkspaceState(files={"a.py": FileInfo(size=1)}),
    )
    before = snapshot(env)
    with pytest.raises(EnvironmentValidationError, match=re.escape(repr(pointer))):
        env.set(pointer, value)
    assert snapshot(env) == before


def test_setting_the_root_replaces_every_section() -> None:
    env = Environment(task=TaskState(objective="old"), extensions={"x": 1})
    env.set("", {"knowledge": {"discovered_facts": ["new"]}})
    assert env.task == TaskState()
    assert env.knowledge.discovered_facts == ["new"]
    assert env.get("/extensions") == {}
    (change,) = env.changes()
    assert change.pointer == ""
    assert isinstance(change.old, dict)
    assert change.old["extensions"] == {"x": 1}


# -- extensions ----------------------------------------------------------------------------


class Dataset(BaseModel):
    name: str
    rows: int
    columns: list[str] = []


def test_an_extension_round_trips_through_a_pydantic_model() -> None:
    env = Environment()
    sales = Dataset(name="sales", rows=1250, columns=["date", "profit"])
    change = env.set_extension("sales", sales)
    assert change.new == {"name": "sales", "rows": 1250, "columns": ["date", "profit"]}
    assert env.get_extension("sales", Dataset) == sales
    env.set_extension("datasets", {"sales": sales.model_dump()})
    datasets = env.get_extension("datasets", dict[str, Dataset])
    assert datasets["sales"].rows == 1250


def test_get_extension_with_a_model_the_data_does_not_fit_raises_validation_error() -> None:
    env = Environment(extensions={"sales": {"name": "sales", "rows": "many"}})
    with pytest.raises(EnvironmentValidationError, match=r"'sales'.*Dataset"):
        env.get_extension("sales", Dataset)


def test_get_extension_of_a_missing_name_raises_pointer_error() -> None:
    with pytest.raises(PointerError, match="missing"):
        Environment().get_extension("missing", Dataset)


# -- schemas -------------------------------------------------------------------------------

DATASET_SCHEMA: dict[str, JsonValue] = {
    "type": "object",
    "properties": {"rows": {"type": "integer", "minimum": 0}},
    "required": ["rows"],
}


def test_an_extension_schema_violation_raises_and_leaves_the_state_unchanged() -> None:
    env = (
        Environment.builder()
        .extension("sales", {"rows": 3})
        .extension_schema("sales", DATASET_SCHEMA)
        .build()
    )
    env.set("/extensions/sales/rows", 5)
    before = snapshot(env)
    with pytest.raises(EnvironmentValidationError, match=r"'sales'.*-1"):
        env.set("/extensions/sales/rows", -1)
    with pytest.raises(EnvironmentValidationError, match="'rows' is a required property"):
        env.delete("/extensions/sales/rows")
    with pytest.raises(EnvironmentValidationError, match="sales"):
        env.set("/extensions", {"sales": {}})
    with pytest.raises(EnvironmentValidationError, match="sales"):
        env.set_extension("sales", Dataset(name="s", rows=-2))
    assert snapshot(env) == before
    env.set_extension("other", {"rows": -1})  # no schema for "other"
    env.delete("/extensions/sales")  # an absent extension is not checked
    assert env.version == 3


def test_a_whole_state_schema_violation_raises_and_leaves_the_state_unchanged() -> None:
    schema: dict[str, JsonValue] = {
        "type": "object",
        "properties": {
            "task": {"properties": {"steps_total": {"maximum": 10}}},
            "workspace": {"properties": {"files": {"required": ["README.md"]}}},
        },
    }
    files = {"a.py": FileInfo(), "README.md": FileInfo(), "z.py": FileInfo()}
    env = Environment(workspace=WorkspaceState(files=files), schema=schema)
    before = snapshot(env)
    with pytest.raises(EnvironmentValidationError, match="11"):
        env.set("/task/steps_total", 11)
    with pytest.raises(EnvironmentValidationError, match=r"README\.md"):
        env.delete("/workspace/files/README.md")
    with pytest.raises(EnvironmentValidationError):
        env.update_section("task", objective="fine", steps_total=50)
    assert snapshot(env) == before
    # the rolled-back delete put the key back where it was: insertion order is render order
    assert list(env.workspace.files) == ["a.py", "README.md", "z.py"]


def test_an_invalid_schema_raises_user_error() -> None:
    with pytest.raises(UserError, match="schema"):
        Environment(schema={"type": "no-such-type"})
    with pytest.raises(UserError, match="'sales'"):
        Environment(extension_schemas={"sales": {"minimum": "zero"}})


def test_building_a_state_that_breaks_its_schema_raises() -> None:
    builder = Environment.builder().extension("sales", {"rows": -1})
    with pytest.raises(EnvironmentValidationError, match="sales"):
        builder.extension_schema("sales", DATASET_SCHEMA).build()
    with pytest.raises(UserError, match="steps_total"):
        Environment.builder().task({"steps_total": "three"}).build()


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
