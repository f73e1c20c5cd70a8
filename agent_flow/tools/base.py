"""Defining tools: the `Tool` protocol, `BaseTool`, the `@tool` decorator and `ToolContext`.

A tool is anything with a name, a description, a JSON schema of its parameters, a
`ToolPolicy`, an optional timeout and an async ``run(arguments, context)``. Most tools are
written as typed Python functions and turned into a `FunctionTool` by `@tool`:

```python
@tool
async def search(query: str, limit: int = 10) -> list[str]:
    # The docstring of `search` gives the description, and its Args: section
    # ("query: What to look for.") the parameter descriptions.
    ...
```

The description comes from the docstring, the parameter descriptions from its ``Args:``
section, and the schema from the type hints through pydantic (defaults, optionals, enums,
``Literal``, nested models). The function receives validated, typed arguments; a parameter
annotated `ToolContext` receives the call's context instead (run id, environment, progress).

A tool returns a string, any JSON-able value, a pydantic model, or a `ToolResult`;
`to_tool_result` turns each into a `ToolResult` (text for the model, structured data for
result handlers).
"""

from __future__ import annotations

import inspect
import re
import sys
import typing
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, ParamSpec, Protocol, TypeAlias, TypeVar, overload
from typing import get_type_hints as _get_type_hints

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, create_model
from pydantic_core import PydanticSerializationError, to_jsonable_python

from agent_flow._types import JsonObject, JsonValue
from agent_flow._utils import compact_json
from agent_flow.errors import ToolDefinitionError, ToolError
from agent_flow.tools._threads import tool_threads
from agent_flow.tools.policy import ToolPolicy
from agent_flow.tools.results import OutputCheck, ToolResult

if TYPE_CHECKING:
    from agent_flow.environment import Environment

__all__ = [
    "BaseTool",
    "FunctionTool",
    "ProgressCallback",
    "Tool",
    "ToolArgumentsError",
    "ToolContext",
    "ToolOutput",
    "parse_docstring",
    "to_tool_result",
    "tool",
]

P = ParamSpec("P")
R = TypeVar("R")

#: What a tool's ``run`` may return.
ToolOutput: TypeAlias = ToolResult | BaseModel | JsonValue

#: Receives progress reports: ``(progress, total, message)``.
ProgressCallback: TypeAlias = Callable[[float, float | None, str | None], Awaitable[None]]


class ToolArgumentsError(ToolError):
    """The arguments of a call do not fit the tool's parameters (reported to the model)."""


@dataclass(frozen=True)
class ToolContext:
    """What a running tool may know about its call.

    A `@tool` function receives it through a parameter annotated ``ToolContext``.

    The environment is not thread-safe and sync tools run in a worker thread: read or write
    it from async tools only.

    Attributes:
        call_id: The id of the call being answered.
        tool_name: The registered (possibly namespaced) name of the tool.
        run_id: The agent run the call belongs to (empty outside a run).
        environment: The run's environment, when the loop passed one.
        output: What the run's final result must match, when it has an output schema
            (``task_completion`` checks its result against it).
    """

    call_id: str = ""
    tool_name: str = ""
    run_id: str = ""
    environment: Environment | None = None
    output: OutputCheck | None = None
    progress_callback: ProgressCallback | None = field(default=None, repr=False)

    async def report_progress(
        self, progress: float, total: float | None = None, message: str | None = None
    ) -> None:
        """Report how far the call has got (shown to the user, not to the model)."""
        if self.progress_callback is not None:
            await self.progress_callback(progress, total, message)


@typing.runtime_checkable
class Tool(Protocol):
    """The protocol every tool implements (subclass `BaseTool`, or use `@tool`).

    Attributes:
        name: The tool's name (the executor may prefix a namespace).
        description: What the tool does, for the model.
        parameters: The JSON schema of the arguments (an object schema).
        policy: How carefully to treat calls (read-only, approval, risk).
        timeout: Seconds a call may run (``None``: the executor's default).
    """

    @property
    def name(self) -> str: ...  # noqa: D102 - documented on the class

    @property
    def description(self) -> str: ...  # noqa: D102

    @property
    def parameters(self) -> JsonObject: ...  # noqa: D102

    @property
    def policy(self) -> ToolPolicy: ...  # noqa: D102

    @property
    def timeout(self) -> float | None: ...  # noqa: D102

    async def run(self, arguments: JsonObject, context: ToolContext) -> ToolOutput:
        """Run the tool with arguments already validated against `parameters`."""
        ...


class BaseTool:
    """A convenient base for class-based tools: set the attributes, implement `run`."""

    name: str = ""
    description: str = ""
    parameters: JsonObject = {"type": "object", "properties": {}}  # noqa: RUF012 - read-only default
    policy: ToolPolicy = ToolPolicy()
    timeout: float | None = None

    async def run(self, arguments: JsonObject, context: ToolContext) -> ToolOutput:
        """Run the tool with arguments already validated against `parameters`."""
        raise NotImplementedError


# --- docstrings ---------------------------------------------------------------------------

_SECTION = re.compile(
    r"^(Args|Arguments|Parameters|Params|Returns|Return|Yields|Raises|Examples?|Notes?|"
    r"Warnings?|See Also|Attributes|References|Todo)\s*:\s*$"
)
_ARG_LINE = re.compile(r"^\*{0,2}(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$")
_SPHINX_PARAM = re.compile(r"^:param\s+(?:[^:]*\s)?(\w+)\s*:\s*(.*)$")


def parse_docstring(doc: str | None) -> tuple[str, dict[str, str]]:
    """Split a docstring into its description and per-parameter descriptions.

    Understands Google style (``Args:`` sections) and Sphinx style (``:param x:``).

    Returns:
        The description (everything before the first section) and a mapping of parameter
        names to their descriptions.
    """
    if not doc:
        return "", {}
    lines = inspect.cleandoc(doc).splitlines()
    description: list[str] = []
    params: dict[str, str] = {}
    section: str | None = None
    section_indent: int | None = None
    current: str | None = None
    for raw in lines:
        stripped = raw.strip()
        sphinx = _SPHINX_PARAM.match(stripped)
        if sphinx:
            current = sphinx.group(1)
            params[current] = sphinx.group(2).strip()
            section = "sphinx"
            continue
        if stripped.startswith(":") and section == "sphinx":
            current = None  # :returns:, :raises: and the like end a parameter
            continue
        header = _SECTION.match(stripped)
        if header and not raw.startswith((" ", "\t")):
            section = header.group(1)
            section_indent = None
            current = None
            continue
        if section is None:
            description.append(raw)
            continue
        if section in ("Args", "Arguments", "Parameters", "Params"):
            if not stripped:
                continue
            indent = len(raw) - len(raw.lstrip())
            if section_indent is None:
                section_indent = indent
            match = _ARG_LINE.match(stripped)
            if indent <= section_indent and match:
                current = match.group(1)
                params[current] = match.group(2).strip()
            elif current is not None:
                params[current] = f"{params[current]} {stripped}".strip()
        elif section == "sphinx" and current is not None and stripped:
            params[current] = f"{params[current]} {stripped}".strip()
    return "\n".join(description).strip(), params


# --- results ------------------------------------------------------------------------------


def to_tool_result(value: object) -> ToolResult:
    """Turn whatever a tool returned into a `ToolResult`.

    A `ToolResult` passes through; a string becomes the content (no data); ``None`` becomes
    ``"(no output)"``; a pydantic model or any other JSON-able value becomes compact JSON
    content with the value as `ToolResult.data`.

    Raises:
        ToolError: The value cannot be represented as JSON.
    """
    if isinstance(value, ToolResult):
        return value
    if isinstance(value, str):
        return ToolResult(content=value)
    if value is None:
        return ToolResult(content="(no output)")
    try:
        data = to_jsonable_python(value, by_alias=True)
        jsonable = _JSON_ADAPTER.validate_python(data)
    except (PydanticSerializationError, ValidationError, ValueError, TypeError) as err:
        raise ToolError(
            f"the tool returned a {type(value).__name__}, which cannot be turned into JSON; "
            "return a string, a JSON value or a pydantic model"
        ) from err
    return ToolResult(content=compact_json(jsonable), data=jsonable)


_JSON_ADAPTER: TypeAdapter[JsonValue] = TypeAdapter(JsonValue)


# --- @tool --------------------------------------------------------------------------------


def _clean_schema(schema: JsonValue) -> JsonValue:
    """Drop pydantic's generated ``title`` strings: they cost tokens and tell the model nothing."""
    if isinstance(schema, dict):
        return {
            key: _clean_schema(value)
            for key, value in schema.items()
            if not (key == "title" and isinstance(value, str))
        }
    if isinstance(schema, list):
        return [_clean_schema(item) for item in schema]
    return schema


@dataclass(frozen=True)
class _Param:
    name: str
    positional_only: bool


class FunctionTool(Generic[P, R]):
    """A tool made from a typed Python function by `@tool`.

    Calling the object calls the function unchanged, so decorated functions stay testable.
    Sync functions run in a worker thread so they cannot block the event loop; a timeout then
    abandons the thread (it cannot be interrupted), so long-running work belongs in async
    tools. A sync function declared ``blocking=False`` (quick, pure computation: no I/O, no
    sleeping, no locks) is called in the event loop instead, sparing the thread hand-off.

    Attributes:
        function: The wrapped function.
        name: The tool's name.
        description: Its description (from the docstring unless given).
        parameters: The JSON schema of its arguments.
        policy: Its policy.
        timeout: Its timeout in seconds (``None``: the executor's default).
        blocking: Whether a sync function may block, and so runs in a worker thread (async
            functions never do).
        arguments_model: The pydantic model arguments are validated with.
    """

    name: str
    description: str
    parameters: JsonObject
    policy: ToolPolicy
    timeout: float | None
    blocking: bool
    arguments_model: type[BaseModel]

    def __init__(
        self,
        function: Callable[P, R],
        *,
        name: str | None = None,
        description: str | None = None,
        policy: ToolPolicy | None = None,
        timeout: float | None = None,
        blocking: bool = True,
        namespace: dict[str, Any] | None = None,
    ) -> None:
        if not callable(function):
            raise ToolDefinitionError(f"@tool needs a function, got {function!r}")
        self.function = function
        self.name = name or str(getattr(function, "__name__", ""))
        if not self.name or self.name == "<lambda>":
            raise ToolDefinitionError(
                f"cannot name a tool after {function!r}; pass name='...' to @tool"
            )
        doc_description, param_docs = parse_docstring(inspect.getdoc(function))
        self.description = description if description is not None else doc_description
        self.policy = policy or ToolPolicy()
        self.timeout = timeout
        self._is_async = inspect.iscoroutinefunction(function)
        self.blocking = blocking
        self._context_param: str | None = None
        self._params: list[_Param] = []
        self.arguments_model = self._build_model(function, param_docs, namespace)
        schema = self.arguments_model.model_json_schema()
        cleaned = _clean_schema(typing.cast(JsonValue, schema))
        assert isinstance(cleaned, dict)
        cleaned.setdefault("properties", {})
        self.parameters = cleaned
        self.__doc__ = function.__doc__

    @property
    def is_async(self) -> bool:
        """Whether the function is a coroutine function (else a tool thread runs it)."""
        return self._is_async

    def _build_model(
        self,
        function: Callable[..., object],
        param_docs: dict[str, str],
        namespace: dict[str, Any] | None,
    ) -> type[BaseModel]:
        signature = inspect.signature(function)
        try:
            hints = _get_type_hints(function, localns=namespace, include_extras=True)
        except (NameError, TypeError) as err:
            raise ToolDefinitionError(
                f"the type hints of tool {self.name!r} cannot be resolved ({err}); define the "
                "types it uses at module level"
            ) from err
        fields: dict[str, Any] = {}
        for param in signature.parameters.values():
            if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
                raise ToolDefinitionError(
                    f"tool {self.name!r} has a *args/**kwargs parameter {param.name!r}; "
                    "tools need named, typed parameters"
                )
            annotation = hints.get(param.name, inspect.Parameter.empty)
            if annotation is ToolContext:
                self._context_param = param.name
                continue
            if annotation is inspect.Parameter.empty:
                raise ToolDefinitionError(
                    f"parameter {param.name!r} of tool {self.name!r} has no type annotation; "
                    "annotate it so the model knows what to send"
                )
            default = ... if param.default is inspect.Parameter.empty else param.default
            doc = param_docs.get(param.name)
            if doc and typing.get_origin(annotation) is not typing.Annotated:
                fields[param.name] = (annotation, Field(default, description=doc))
            else:
                fields[param.name] = (annotation, default)
            self._params.append(
                _Param(param.name, positional_only=param.kind is param.POSITIONAL_ONLY)
            )
        try:
            return create_model(
                f"{self.name}_arguments",
                __config__=ConfigDict(extra="forbid", arbitrary_types_allowed=False),
                **fields,
            )
        except Exception as err:  # pydantic raises several types for unsupported hints
            raise ToolDefinitionError(
                f"cannot build a JSON schema for the parameters of tool {self.name!r}: {err}"
            ) from err

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        """Call the wrapped function directly."""
        return self.function(*args, **kwargs)

    def __repr__(self) -> str:
        return f"FunctionTool({self.name!r})"

    async def run(self, arguments: JsonObject, context: ToolContext) -> ToolOutput:
        """Validate `arguments` into typed values and call the function.

        Raises:
            ToolArgumentsError: The arguments do not fit the parameters.
        """
        try:
            validated = self.arguments_model.model_validate(arguments)
        except ValidationError as err:
            raise ToolArgumentsError(_describe_validation_error(self.name, err)) from err
        args: list[object] = []
        kwargs: dict[str, object] = {}
        for param in self._params:
            value = getattr(validated, param.name)
            if param.positional_only:
                args.append(value)
            else:
                kwargs[param.name] = value
        if self._context_param is not None:
            kwargs[self._context_param] = context
        function: Callable[..., object] = self.function
        if self._is_async:
            result = await typing.cast(Awaitable[object], function(*args, **kwargs))
        elif not self.blocking:
            result = function(*args, **kwargs)
        else:
            result = await tool_threads().run(function, *args, **kwargs)
        return typing.cast(ToolOutput, result)


def _describe_validation_error(tool_name: str, err: ValidationError) -> str:
    problems = []
    for error in err.errors()[:5]:
        location = ".".join(str(part) for part in error["loc"]) or "(arguments)"
        problems.append(f"{location}: {error['msg']}")
    more = f" (and {err.error_count() - 5} more)" if err.error_count() > 5 else ""
    return f"invalid arguments for tool {tool_name!r}: {'; '.join(problems)}{more}"


@overload
def tool(function: Callable[P, R], /) -> FunctionTool[P, R]: ...


@overload
def tool(
    *,
    name: str | None = None,
    description: str | None = None,
    policy: ToolPolicy | None = None,
    timeout: float | None = None,
    blocking: bool = True,
) -> Callable[[Callable[P, R]], FunctionTool[P, R]]: ...


def tool(
    function: Callable[P, R] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    policy: ToolPolicy | None = None,
    timeout: float | None = None,
    blocking: bool = True,
) -> FunctionTool[P, R] | Callable[[Callable[P, R]], FunctionTool[P, R]]:
    """Turn a typed function (sync or async) into a `FunctionTool`.

    Use bare (``@tool``) or with options (``@tool(name="search", timeout=5)``).

    Args:
        function: The function (when used bare).
        name: The tool's name; defaults to the function's name.
        description: The description; defaults to the docstring without its sections.
        policy: The tool's policy; defaults to a low-risk tool that needs no approval.
        timeout: Seconds a call may run; defaults to the executor's timeout.
        blocking: ``False`` declares a sync function quick and non-blocking: it is called in
            the event loop rather than in a worker thread (a timeout cannot stop it there).

    Raises:
        ToolDefinitionError: The function has untyped or variadic parameters, or types
            pydantic cannot describe.
    """
    # Locals of the defining scope, so hints naming classes defined there still resolve.
    caller = sys._getframe(1)
    namespace = dict(caller.f_locals) if caller.f_locals is not caller.f_globals else None

    def decorate(fn: Callable[P, R]) -> FunctionTool[P, R]:
        return FunctionTool(
            fn,
            name=name,
            description=description,
            policy=policy,
            timeout=timeout,
            blocking=blocking,
            namespace=namespace,
        )

    if function is not None:
        return decorate(function)
    return decorate
