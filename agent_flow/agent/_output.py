"""The run's output schema: telling the model from the first request, and checking its answer.

Telling: with an output schema (``output_type`` or ``config.output_schema``), the model is
offered ``task_completion`` with that schema as its ``result`` (`agent._offer`), and a request
that offers no tools carries it as ``response_format`` (`_response_format`): a server that
constrains its output to a schema (llama.cpp, vLLM, Ollama, OpenAI) then answers in it. A
request with tools does not: such a grammar would keep a local server from calling them. A
server that refuses the field (HTTP 400 or 422) is asked again without it, and never sent it
again (`_call_with_format`).

Checking: a run's answer comes as text (an answer without tool calls: `_validate_output`) or
as the ``result`` of a ``task_completion`` call (`_validate_result`); both are held to the
same schema, so ``output_type`` holds however the run ends. ``task_completion`` checks its
result itself (`_output_check`), so that a wrong one is refused in the call's own result.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
import weakref
from typing import TYPE_CHECKING, cast

import jsonschema
from pydantic import BaseModel, ValidationError

from agent_flow._types import JsonObject, JsonValue
from agent_flow._unicode import json_is_clean, mend_json
from agent_flow._utils import loads_json
from agent_flow.agent._model_call import _CallState, _checkpointed_call
from agent_flow.errors import ModelBadRequestError
from agent_flow.events import WarningRaised
from agent_flow.llm.base import Completion, LLMRequest
from agent_flow.tools import OutputCheck

if TYPE_CHECKING:
    from agent_flow.agent._loop import _Run

# Model clients whose server refused `response_format`: it is not sent to them again.
_REFUSES_FORMAT: weakref.WeakSet[object] = weakref.WeakSet()


def _output_check(schema: JsonObject, model: type[BaseModel] | None) -> OutputCheck:
    """What ``task_completion`` checks its result with: the same rules as the loop's."""

    def problem(result: JsonValue, summary: str) -> str | None:
        return _validate_result(result, summary, schema, model)[1]

    return OutputCheck(schema=schema, problem=problem)


def _response_format(run: _Run, schema: JsonObject | None, *, tools: bool) -> JsonObject | None:
    """The ``response_format`` of a request, or None (no schema, tools offered, refused)."""
    if schema is None or tools or run.agent.llm in _REFUSES_FORMAT:
        return None
    model = run.agent.output_type
    title = model.__name__ if model is not None else schema.get("title")
    name = re.sub(r"[^A-Za-z0-9_-]", "_", title if isinstance(title, str) else "")[:64]
    return {"type": "json_schema", "json_schema": {"name": name or "output", "schema": schema}}


async def _call_with_format(run: _Run, request: LLMRequest, call: _CallState) -> Completion:
    """Make the call; if the server refuses its ``response_format``, make it again without."""
    try:
        return await _checkpointed_call(run, request, call)
    except ModelBadRequestError as err:
        if request.response_format is None or err.status_code not in (400, 422):
            raise
        # A client that cannot be referenced weakly is simply asked again each time.
        with contextlib.suppress(TypeError):
            _REFUSES_FORMAT.add(run.agent.llm)
        await run.emit(
            WarningRaised,
            message=(
                f"the model server refused response_format ({err}); asking again without "
                "it (the output schema is still in the prompt's tools and checked)"
            ),
            source="model",
        )
        return await _checkpointed_call(
            run, request.model_copy(update={"response_format": None}), call
        )


def _validate_output(
    text: str, schema: JsonObject, model: type[BaseModel] | None
) -> tuple[JsonValue, str | None]:
    """Parse `text` as JSON (a fenced block is accepted) and validate it.

    With a pydantic `model`, the model validates (its own rules included); otherwise the
    JSON `schema` does. Returns the value (as JSON data) or what is wrong with it.
    """
    candidate = text.strip()
    if candidate.startswith("```"):
        candidate = candidate.strip("`")
        candidate = candidate.split("\n", 1)[1] if "\n" in candidate else ""
        candidate = candidate.rsplit("```", 1)[0].strip()
    try:
        value = cast(JsonValue, loads_json(candidate))
    except json.JSONDecodeError as err:
        return None, f"the answer is not valid JSON ({err.msg} at position {err.pos})"
    except RecursionError:
        return None, "the answer is not valid JSON (nested too deeply)"
    except ValueError as err:  # NaN, Infinity or 1e400: no output or event could carry it
        return None, f"the answer is not valid JSON ({err})"
    # An escape in the text (``"\\udcff"``) makes a lone surrogate, which no output, event or
    # stored session could hold: mended, as the text it came in was.
    if not json_is_clean(value):
        value = mend_json(value)
    return _validate_value(value, schema, model)


def _validate_result(
    result: JsonValue, summary: str, schema: JsonObject, model: type[BaseModel] | None
) -> tuple[JsonValue, str | None]:
    """Validate a ``task_completion`` call's `result` (or, without one, its `summary` text).

    A string result that does not match as a string is read as JSON text (models often
    encode the value once more).
    """
    if result is None:
        output, problem = _validate_output(summary, schema, model)
        if problem is not None:
            problem = f"no result was given and the summary does not match either: {problem}"
        return output, problem
    output, problem = _validate_value(result, schema, model)
    if problem is not None and isinstance(result, str):
        parsed, parse_problem = _validate_output(result, schema, model)
        if parse_problem is None:
            return parsed, None
    return output, problem


def _validate_value(
    value: JsonValue, schema: JsonObject, model: type[BaseModel] | None
) -> tuple[JsonValue, str | None]:
    if model is not None:
        try:
            dumped = model.model_validate(value).model_dump(mode="json")
        except ValidationError as err:
            return None, "; ".join(
                f"at /{'/'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in err.errors()[:5]
            )
        # A model takes "inf" and "nan" for a float, which no output or event could carry.
        where = _not_finite(dumped, "")
        if where is not None:
            return None, f"at {where or '/'}: Input should be a finite number"
        return dumped, None
    errors = sorted(
        jsonschema.Draft202012Validator(schema).iter_errors(value), key=lambda e: list(e.path)
    )
    if errors:
        problems = "; ".join(
            f"at /{'/'.join(str(p) for p in e.path)}: {e.message}" for e in errors[:5]
        )
        return None, problems
    return value, None


def _not_finite(value: JsonValue, at: str) -> str | None:
    """The pointer of the first infinite or NaN number in `value`, or None."""
    if isinstance(value, float):
        return None if math.isfinite(value) else at
    items = (
        value.items()
        if isinstance(value, dict)
        else enumerate(value)
        if isinstance(value, list)
        else ()
    )
    for key, item in items:
        found = _not_finite(item, f"{at}/{key}")
        if found is not None:
            return found
    return None
