from __future__ import annotations

import enum
import inspect
from datetime import date
from typing import Annotated, Literal

import pytest
from pydantic import BaseModel, Field

import agent_flow.tools as tools_package
from agent_flow._types import JsonObject
from agent_flow.errors import ToolDefinitionError, ToolError
from agent_flow.tools import (
    BaseTool,
    FunctionTool,
    Tool,
    ToolArgumentsError,
    ToolContext,
    ToolOutput,
    ToolPolicy,
    ToolResult,
    parse_docstring,
    to_tool_result,
    tool,
)


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


class Size(BaseModel):
    width: int
    height: int = 1


@tool
async def paint(
    color: Color,
    size: Size,
    finish: Literal["matte", "gloss"] = "matte",
    note: str | None = None,
    coats: Annotated[int, Field(ge=1, le=5, description="How many coats.")] = 1,
) -> dict[str, object]:
    """Paint a rectangle.

    Longer explanation that belongs to the description.

    Args:
        color: The paint color.
        size: The rectangle's size.
        finish: The finish,
            matte or gloss.
        note: A note for the painter.
        coats: Ignored here: the Annotated description wins.

    Returns:
        What was painted.
    """
    return {"color": color.value, "area": size.width * size.height, "finish": finish}


def test_tool_takes_its_name_and_description_from_the_function() -> None:
    assert paint.name == "paint"
    assert (
        paint.description
        == "Paint a rectangle.\n\nLonger explanation that belongs to the description."
    )


def test_tool_schema_has_types_defaults_enums_literals_and_nested_models() -> None:
    schema = paint.parameters
    assert schema["type"] == "object"
    assert schema["required"] == ["color", "size"]
    assert schema["additionalProperties"] is False
    props = schema["properties"]
    assert isinstance(props, dict)
    assert props["finish"] == {
        "default": "matte",
        "description": "The finish, matte or gloss.",
        "enum": ["matte", "gloss"],
        "type": "string",
    }
    assert props["note"] == {
        "anyOf": [{"type": "string"}, {"type": "null"}],
        "default": None,
        "description": "A note for the painter.",
    }
    assert props["coats"] == {
        "default": 1,
        "description": "How many coats.",
        "maximum": 5,
        "minimum": 1,
        "type": "integer",
    }
    defs = schema["$defs"]
    assert isinstance(defs, dict)
    assert defs["Color"] == {"enum": ["red", "blue"], "type": "string"}
    assert defs["Size"] == {
        "properties": {"width": {"type": "integer"}, "height": {"default": 1, "type": "integer"}},
        "required": ["width"],
        "type": "object",
    }
    # pydantic's generated titles cost tokens and are dropped everywhere
    assert not list(_string_titles(schema))


def _string_titles(value: object) -> list[object]:
    if isinstance(value, dict):
        found = [v for k, v in value.items() if k == "title" and isinstance(v, str)]
        return found + [t for v in value.values() for t in _string_titles(v)]
    if isinstance(value, list):
        return [t for v in value for t in _string_titles(v)]
    return []


def test_a_property_named_title_survives_schema_cleaning() -> None:
    @tool
    def publish(title: str, body: str) -> str:
        """Publish a post."""
        return title + body

    props = publish.parameters["properties"]
    assert isinstance(props, dict)
    assert set(props) == {"title", "body"}


async def test_tool_receives_validated_typed_arguments() -> None:
    result = await paint.run({"color": "blue", "size": {"width": 3, "height": 2}}, ToolContext())
    assert result == {"color": "blue", "area": 6, "finish": "matte"}


async def test_tool_run_rejects_arguments_that_do_not_fit_with_a_readable_error() -> None:
    with pytest.raises(ToolArgumentsError, match=r"invalid arguments for tool 'paint': coats"):
        await paint.run({"color": "red", "size": {"width": 1}, "coats": 9}, ToolContext())


async def test_a_context_parameter_receives_the_call_context_and_is_not_in_the_schema() -> None:
    seen: list[tuple[float, float | None, str | None]] = []

    async def progress(value: float, total: float | None, message: str | None) -> None:
        seen.append((value, total, message))

    @tool
    async def work(steps: int, ctx: ToolContext) -> str:
        """Do some steps."""
        for step in range(steps):
            await ctx.report_progress(step + 1, steps, f"step {step + 1}")
        return f"{ctx.run_id}/{ctx.call_id}/{ctx.tool_name}"

    assert work.parameters["properties"] == {"steps": {"type": "integer"}}
    context = ToolContext(call_id="c1", tool_name="work", run_id="r1", progress_callback=progress)
    assert await work.run({"steps": 2}, context) == "r1/c1/work"
    assert seen == [(1, 2, "step 1"), (2, 2, "step 2")]


async def test_sync_tools_run_in_a_worker_thread_and_stay_directly_callable() -> None:
    import threading

    main_thread = threading.get_ident()

    @tool
    def where(x: int) -> dict[str, object]:
        """Report the thread."""
        return {"x": x, "same_thread": threading.get_ident() == main_thread}

    assert where(1) == {"x": 1, "same_thread": True}
    assert await where.run({"x": 2}, ToolContext()) == {"x": 2, "same_thread": False}


def test_tool_options_override_name_description_policy_and_timeout() -> None:
    policy = ToolPolicy(read_only=True)

    @tool(name="lookup", description="Look things up.", policy=policy, timeout=3.5)
    def find(query: str) -> str:
        """Ignored docstring."""
        return query

    assert (find.name, find.description, find.policy, find.timeout) == (
        "lookup",
        "Look things up.",
        policy,
        3.5,
    )
    assert isinstance(find, FunctionTool)
    assert isinstance(find, Tool)


def test_hints_naming_classes_defined_in_the_enclosing_function_resolve() -> None:
    class Point(BaseModel):
        x: int
        y: int

    @tool
    def distance(a: Point, b: Point) -> float:
        """Distance between points."""
        return float(abs(a.x - b.x) + abs(a.y - b.y))

    assert "Point" in distance.parameters["$defs"]  # type: ignore[operator]


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("def f(x): return x", "has no type annotation"),
        ("def f(*args: int) -> int: return 0", r"\*args/\*\*kwargs"),
        ("def f(**kw: int) -> int: return 0", r"\*args/\*\*kwargs"),
    ],
)
def test_functions_that_cannot_become_tools_are_rejected_early(source: str, message: str) -> None:
    namespace: dict[str, object] = {}
    exec(source, namespace)
    with pytest.raises(ToolDefinitionError, match=message):
        tool(namespace["f"])  # type: ignore[call-overload]


def test_a_lambda_needs_an_explicit_name() -> None:
    with pytest.raises(ToolDefinitionError, match="pass name="):
        tool(lambda: 1)
    assert tool(name="one")(lambda: 1).name == "one"


def test_positional_only_parameters_are_passed_positionally() -> None:
    @tool
    def power(base: int, /, exponent: int = 2) -> int:
        """Raise to a power."""
        return int(base**exponent)

    assert power.parameters["required"] == ["base"]


async def test_positional_only_tool_runs() -> None:
    @tool
    async def power(base: int, /, exponent: int = 2) -> int:
        """Raise to a power."""
        return int(base**exponent)

    assert await power.run({"base": 3, "exponent": 3}, ToolContext()) == 27


def test_google_docstrings_are_parsed_into_description_and_arguments() -> None:
    doc = """Summary line.

    More text.

    Args:
        path (str): The path,
            continued here.
        *rest: Extra values.
        flag: A flag.

    Raises:
        ValueError: never.
    """
    description, params = parse_docstring(doc)
    assert description == "Summary line.\n\nMore text."
    assert params == {
        "path": "The path, continued here.",
        "rest": "Extra values.",
        "flag": "A flag.",
    }


def test_sphinx_docstrings_are_parsed_too() -> None:
    doc = """Do it.

    :param int count: How many,
        at most ten.
    :param name: Who.
    :returns: nothing.
    """
    description, params = parse_docstring(doc)
    assert description == "Do it."
    assert params == {"count": "How many, at most ten.", "name": "Who."}


def test_an_empty_docstring_gives_an_empty_description() -> None:
    assert parse_docstring(None) == ("", {})


class Report(BaseModel):
    title: str
    when: date


@pytest.mark.parametrize(
    ("value", "content", "data"),
    [
        ("plain text", "plain text", None),
        (None, "(no output)", None),
        ({"a": [1, 2]}, '{"a":[1,2]}', {"a": [1, 2]}),
        ([1, "two"], '[1,"two"]', [1, "two"]),
        (7, "7", 7),
        (
            Report(title="Q3", when=date(2026, 1, 2)),
            '{"title":"Q3","when":"2026-01-02"}',
            {"title": "Q3", "when": "2026-01-02"},
        ),
        ({"ünïcode": "✓"}, '{"ünïcode":"✓"}', {"ünïcode": "✓"}),
    ],
)
def test_return_values_become_results_with_content_and_data(
    value: ToolOutput, content: str, data: object
) -> None:
    result = to_tool_result(value)
    assert (result.content, result.data, result.is_error) == (content, data, False)


def test_a_tool_result_passes_through_unchanged() -> None:
    result = ToolResult.error("nope", data={"code": 1})
    assert to_tool_result(result) is result
    assert result.error_kind == "reported"
    assert not result.failed


def test_a_value_that_is_not_json_is_a_tool_error() -> None:
    with pytest.raises(ToolError, match="cannot be turned into JSON"):
        to_tool_result(object())


class Weather(BaseTool):
    name = "weather"
    description = "Current weather for a city."
    parameters: JsonObject = {  # noqa: RUF012 - a class constant
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    }
    policy = ToolPolicy(read_only=True)

    async def run(self, arguments: JsonObject, context: ToolContext) -> ToolOutput:
        return {"city": arguments["city"], "temperature": 21}


class Bare:
    """A tool written against the protocol only."""

    name = "bare"
    description = "No base class."
    parameters: JsonObject = {"type": "object", "properties": {}}  # noqa: RUF012
    policy = ToolPolicy()
    timeout = None

    async def run(self, arguments: JsonObject, context: ToolContext) -> ToolOutput:
        return "bare"


async def test_class_based_tools_implement_the_protocol() -> None:
    assert isinstance(Weather(), Tool)
    assert isinstance(Bare(), Tool)
    assert await Weather().run({"city": "Oslo"}, ToolContext()) == {
        "city": "Oslo",
        "temperature": 21,
    }


def test_an_object_missing_protocol_members_is_not_a_tool() -> None:
    class Incomplete:
        name = "x"

    assert not isinstance(Incomplete(), Tool)


def test_the_package_exports_exactly_its_public_names() -> None:
    exported = set(tools_package.__all__)
    assert len(exported) == len(tools_package.__all__)
    for name in exported:
        assert hasattr(tools_package, name), name
    public = {
        name
        for name, value in vars(tools_package).items()
        if not name.startswith("_") and not inspect.ismodule(value) and name != "annotations"
    }
    # The MCP client names load on first use (the MCP SDK is slow to import).
    assert public == exported - tools_package._LAZY_MCP


async def test_sync_tools_run_in_a_worker_thread_unless_declared_non_blocking() -> None:
    import threading

    def where() -> int:
        """Say which thread runs the call."""
        return threading.get_ident()

    loop_thread = threading.get_ident()
    assert await tool(where).run({}, ToolContext()) != loop_thread
    assert await tool(blocking=False)(where).run({}, ToolContext()) == loop_thread
    assert tool(where).blocking and not tool(blocking=False)(where).blocking
