"""Token counters and render checks shared by the environment tests."""

from __future__ import annotations

import json
import re

from pydantic import BaseModel

from agent_flow._types import JsonValue
from agent_flow.environment import (
    Environment,
)
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


class Dataset(BaseModel):
    name: str
    rows: int
    columns: list[str] = []


DATASET_SCHEMA: dict[str, JsonValue] = {
    "type": "object",
    "properties": {"rows": {"type": "integer", "minimum": 0}},
    "required": ["rows"],
}
