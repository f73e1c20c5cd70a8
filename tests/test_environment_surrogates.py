"""A write to the environment that UTF-8 cannot carry is refused, with what and where.

A text holding a lone surrogate (Python's JSON reader makes one from a ``"\\ud800"`` escape,
``surrogateescape`` from undecodable bytes) cannot be encoded as UTF-8: neither the prompt nor
the stored session could be written. Typed sections refused it before, with a message about
an invalid JSON escape; an extension (untyped) took it, and the next run then died with a bare
``UnicodeEncodeError`` before its model call. Now every write (values, keys, pointers,
constructor sections) is refused at once with the pointer and the character's index, and
nothing changes. Text with a surrogate pair joined (any character) is taken as before.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent_flow import AgentExecutor, Environment
from agent_flow.errors import EnvironmentValidationError, PointerError
from agent_flow.sessions import SQLiteSessionStore
from agent_flow.testing import FunctionLLM, reply

_SURROGATES = st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF)
_CLEAN = st.text(st.characters(codec="utf-8"), max_size=20)


@given(before=_CLEAN, surrogate=_SURROGATES, after=_CLEAN)
def test_a_text_with_a_surrogate_is_refused_anywhere_in_a_value(
    before: str, surrogate: str, after: str
) -> None:
    environment = Environment()
    text = before + surrogate + after
    for pointer, value in (
        ("/extensions/notes", text),
        ("/extensions/notes", {"nested": [1, text]}),
        ("/extensions/notes", {text: 1}),
        ("/knowledge/discovered_facts", ["fine", text]),
        ("/task/objective", text),
    ):
        with pytest.raises(EnvironmentValidationError) as caught:
            environment.set(pointer, value)
        message = str(caught.value)
        assert repr(pointer) in message
        assert f"at index {len(before)}" in message
        assert "lone surrogate" in message
    assert environment.version == 0
    assert environment.to_json() == Environment().to_json()


@given(text=_CLEAN)
def test_text_utf8_can_carry_is_taken_as_before(text: str) -> None:
    environment = Environment()
    environment.set("/extensions/notes", {text: text})
    assert environment.get("/extensions/notes") == {text: text}


def test_a_pointer_with_a_surrogate_is_refused() -> None:
    environment = Environment()
    with pytest.raises(PointerError, match="lone surrogate"):
        environment.set("/extensions/\udcff", 1)
    assert environment.version == 0


def test_the_constructor_refuses_it_too() -> None:
    with pytest.raises(EnvironmentValidationError, match="'/extensions/raw'"):
        Environment(extensions={"raw": "name-\udcff.txt"})


async def test_a_refused_write_leaves_the_next_run_and_its_session_whole(tmp_path: Path) -> None:
    """Before, the write was taken and the run failed with a bare UnicodeEncodeError."""
    async with SQLiteSessionStore(tmp_path / "s.db") as store:
        agent = AgentExecutor(FunctionLLM(lambda request: reply("ok"), model="m"), store=store)
        with pytest.raises(EnvironmentValidationError):
            agent.environment.set("/extensions/notes", "bad \ud800 text")
        agent.environment.set("/extensions/notes", "good text")
        outcome = await agent.run("hi")
        assert outcome.stop_reason.value == "answered"
        assert agent.session_id is not None
        stored = await store.load(agent.session_id)
        assert stored.environment is not None
        assert stored.environment.get("/extensions/notes") == "good text"
