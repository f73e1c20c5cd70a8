from __future__ import annotations

import copy
import re

import pytest
from hypothesis import given, settings
from pydantic import ValidationError

from agent_flow._types import JsonValue
from agent_flow.environment import (
    ArtifactInfo,
    Environment,
    FileInfo,
    KnowledgeBase,
    PlanStep,
    SystemState,
    TaskState,
    TaskStatus,
    WorkspaceState,
)
from agent_flow.errors import EnvironmentValidationError, PointerError, UserError
from agent_flow.testing.strategies import environments, pointer_writes
from tests.env_helpers import (
    DATASET_SCHEMA,
    Dataset,
    snapshot,
)

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
