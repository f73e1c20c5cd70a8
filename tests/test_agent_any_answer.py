"""Whatever a model server answers, the run ends with an outcome and its session is stored.

Hypothesis writes the server's answers: streamed chunks or whole bodies whose fields hold any
JSON (text as numbers, lists and objects; tool calls with odd indexes, ids, names and
arguments; usage of the wrong types; escaped lone surrogates and NULs). Each run goes through
the real `openai` SDK to the scripted server on a real socket, with a SQLite store. The run
must end (answered, or stopped with a reason and a message), every event it published must
encode to JSON, and its stored session must load and hold every event.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent_flow import AgentConfig, AgentExecutor
from agent_flow.agent import StopReason
from agent_flow.events import event_to_json
from agent_flow.llm import OpenAIClient
from agent_flow.sessions import SQLiteSessionStore
from agent_flow.tools import ToolExecutor, tool
from tests.openai_server import OpenAIServer, json_reply, sse_reply, text_chunks

_SPECIAL = st.sampled_from(["\ud83d", "\ude00", "a\ud83d", "\x00", "note", "", " ", "\u2028"])
_TEXT = st.one_of(_SPECIAL, _SPECIAL, st.text(max_size=12))
_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-3, 3)
    | st.sampled_from([2**63, -(2**64), 10**400])  # past any column (and a float)
    | st.floats(allow_nan=False)
    | _TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_TEXT, inner, max_size=3),
    max_leaves=6,
)


def _odd(value: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """`value` most of the time, else any JSON."""
    return st.one_of(value, value, _JSON)


_FUNCTION = st.fixed_dictionaries(
    {},
    optional={
        "name": _odd(st.sampled_from(["note", "missing", ""])),
        "arguments": _odd(st.sampled_from(['{"n": 1}', '{"n": ', "{}", '{"n": "x"}', ""])),
    },
)
_FRAGMENT = st.fixed_dictionaries(
    {},
    optional={
        "index": _odd(st.integers(0, 2)),
        "id": _odd(st.sampled_from(["call_a", "call_b", "call_a"])),
        "type": _odd(st.just("function")),
        "function": _odd(_FUNCTION),
    },
)
_DELTA = st.fixed_dictionaries(
    {},
    optional={
        "role": _odd(st.just("assistant")),
        "content": _odd(_TEXT),
        "reasoning_content": _odd(_TEXT),
        "tool_calls": _odd(st.lists(_odd(_FRAGMENT), max_size=3)),
        "function_call": _odd(_FUNCTION),
    },
)
_CHOICE = st.fixed_dictionaries(
    {"delta": _odd(_DELTA)},
    optional={
        "index": _odd(st.just(0)),
        "finish_reason": _odd(st.sampled_from(["stop", "tool_calls", "length", None])),
    },
)
_CHUNK = st.fixed_dictionaries(
    {"choices": _odd(st.lists(_odd(_CHOICE), max_size=2))},
    optional={
        "id": _odd(_TEXT),
        "model": _odd(_TEXT),
        "usage": _odd(
            st.fixed_dictionaries({}, optional={"prompt_tokens": _JSON, "completion_tokens": _JSON})
        ),
    },
)


def _whole(chunk: dict[str, Any]) -> dict[str, Any]:
    """A chunk's fields as a whole (non-streamed) body: each choice's delta as its message."""
    body = dict(chunk)
    choices = chunk.get("choices")
    if isinstance(choices, list):
        body["choices"] = [
            {**c, "message": c.get("delta")} if isinstance(c, dict) else c for c in choices
        ]
    return body


@tool
def note(n: int) -> str:
    """Note a number.

    Args:
        n: The number.
    """
    return f"noted {n}"


@settings(
    max_examples=100,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(chunks=st.lists(_CHUNK, min_size=1, max_size=4), stream=st.booleans())
async def test_any_answer_ends_the_run_with_an_outcome_and_a_whole_stored_session(
    chunks: list[dict[str, Any]], stream: bool
) -> None:
    done = sse_reply(text_chunks("done")) if stream else json_reply(_whole(text_chunks("x")[0]))
    first = sse_reply(chunks) if stream else json_reply(_whole(chunks[0]))
    with tempfile.TemporaryDirectory() as folder:
        async with OpenAIServer(handler=lambda request: done) as server:
            server.script(first)
            store = SQLiteSessionStore(Path(folder) / "sessions.db")
            async with (
                store,
                OpenAIClient("m", base_url=server.base_url, api_key="k", max_retries=0) as llm,
            ):
                agent = AgentExecutor(
                    llm,
                    stream=stream,
                    store=store,
                    tools=ToolExecutor([note]),
                    config=AgentConfig(max_iterations=3),
                )
                async with agent.subscribe() as events:
                    outcome = await agent.run("go")
                    seen = [event async for event in events]
                assert isinstance(outcome.stop_reason, StopReason)
                if outcome.stop_reason is StopReason.ERROR:
                    assert outcome.errors and outcome.errors[-1].message
                for event in seen:
                    event_to_json(event).encode()
                assert agent.session_id is not None
                stored = await store.load(agent.session_id)
                assert stored.info.event_count == len(seen)
                assert len(await store.events(agent.session_id)) == len(seen)


@pytest.mark.parametrize("tokens", [-5, 2**63, 10**30, 10**400])
async def test_a_token_count_no_call_has_is_read_as_none_and_the_session_is_stored(
    tmp_path: Path, tokens: int
) -> None:
    """A server's usage with a count past any 64-bit column (or a float) ended the run in error
    (``OverflowError``) with its last step unstored; a negative one went into the totals."""
    body = _whole(text_chunks("hello")[0])
    body["usage"] = {"prompt_tokens": tokens, "completion_tokens": 3}
    async with OpenAIServer() as server:
        server.script(json_reply(body))
        async with (
            SQLiteSessionStore(tmp_path / "s.db") as store,
            OpenAIClient("m", base_url=server.base_url, api_key="k", max_retries=0) as llm,
        ):
            agent = AgentExecutor(llm, store=store, config=AgentConfig(max_iterations=3))
            outcome = await agent.run("go")
            assert outcome.stop_reason is StopReason.ANSWERED
            assert outcome.usage.prompt_tokens == 0
            assert outcome.usage.completion_tokens == 3
            assert agent.session_id is not None
            info = (await store.load(agent.session_id)).info
            assert info.prompt_tokens == 0 and info.completion_tokens == 3
