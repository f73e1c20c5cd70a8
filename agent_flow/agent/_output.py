"""Output validation: checking a final answer against the run's output schema or model."""

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
