"""Output validation: checking a final answer against the run's output schema or model.

A run's answer comes as text (an answer without tool calls: `_validate_output`) or as the
``result`` of a ``task_completion`` call (`_validate_result`); both are held to the same
schema, so ``output_type`` holds however the run ends.
"""

from __future__ import annotations

import json

import jsonschema
from pydantic import BaseModel, ValidationError

from agent_flow._types import JsonObject, JsonValue


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
        value: JsonValue = json.loads(candidate)
    except json.JSONDecodeError as err:
        return None, f"the answer is not valid JSON ({err.msg} at position {err.pos})"
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
            return model.model_validate(value).model_dump(mode="json"), None
        except ValidationError as err:
            return None, "; ".join(
                f"at /{'/'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in err.errors()[:5]
            )
    errors = sorted(
        jsonschema.Draft202012Validator(schema).iter_errors(value), key=lambda e: list(e.path)
    )
    if errors:
        problems = "; ".join(
            f"at /{'/'.join(str(p) for p in e.path)}: {e.message}" for e in errors[:5]
        )
        return None, problems
    return value, None
