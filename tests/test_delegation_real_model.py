"""The `real_llm` tier for a handoff: a router hands the conversation to a real model.

The README's triage shape on llama-cpp-python's server with SmolLM2-135M (tests/real_llm.py):
a scripted router (so that the handoff happens whatever a 135M model would choose) hands a
billing question to a read-only billing agent on the real model, with a history view of the
last two units and a projection of one value. A 135M model answers poorly, so what is checked
is what must hold whatever it says: the view's shape (an assistant message first, two user
messages in a row) is accepted by the server, only the view and the projection reach it (the
server's HTTP log), only the read-only tool is offered, the run ends with a documented stop
reason and a handoff record that matches it, the target's events reach the router with their
path, and its usage rolls up. (The delegation example's real-model test is in
tests/test_llm_real_model.py.)
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from agent_flow import AgentConfig, AgentExecutor, ContextConfig, Handoff, LastUnits, handoff_of
from agent_flow.agent import StopReason
from agent_flow.delegation import DelegationResult
from agent_flow.events import ModelResponded
from agent_flow.testing import ScriptedLLM, call, reply
from agent_flow.tools import ToolPolicy, tool
from tests.real_llm import HttpLog, LlamaServer, start_llama_server
from tests.test_llm_real_model import CLEAR_OUTCOMES, assert_every_request_accepted, real_client

pytestmark = [pytest.mark.real_llm, pytest.mark.timeout(600)]

EARLY = "EARLY-MARKER-9b1c"  # said before the view's two units: never shown to the target
SECRET = "ROUTER-ONLY-7f3a"  # in the router's Environment, outside the projection


@pytest.fixture(scope="module")
def llama_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaServer]:
    """llama-cpp-python's server with SmolLM2-135M for this module, stopped after it."""
    with start_llama_server(tmp_path_factory.mktemp("llama")) as server:
        yield server


@tool(policy=ToolPolicy(read_only=True))
def lookup_invoice(number: str) -> str:
    """Look an invoice up.

    Args:
        number: The invoice number.
    """
    return f"invoice {number}: 40 EUR, charged twice on 3 March"


@tool
def refund(number: str) -> str:
    """Refund an invoice.

    Args:
        number: The invoice number.
    """
    return "refunded"


async def test_a_router_hands_the_conversation_to_a_real_model(
    llama_server: LlamaServer,
) -> None:
    log = HttpLog()
    async with real_client(llama_server, log) as llm:
        billing = Handoff(
            "billing",
            "Questions about invoices, refunds and payments.",
            llm=llm,
            tools=[lookup_invoice, refund],
            read_only=True,
            history=LastUnits(2),
            projection=["/knowledge/extra/customer"],
            budget=ContextConfig(max_tokens=1500, counter="approx"),
            config=AgentConfig(max_iterations=2, control_tools=False),
        )
        router = AgentExecutor(
            ScriptedLLM(
                [
                    "Hello! How can I help?",
                    reply(tool_calls=[call("transfer_to_billing", task="Refund invoice 42.")]),
                    "I will look into it myself.",  # only if the target did not finish
                ]
            ),
            config=AgentConfig(context=ContextConfig(max_tokens=8000, counter="approx")),
        )
        router.environment.set("/knowledge/extra/customer", "Ann Example")
        router.environment.set("/knowledge/extra/secret", SECRET)
        billing.add_to(router)
        await router.run(f"Hi, this is about my account {EARLY}.")
        subscription = router.subscribe()
        outcome = await router.send("I was charged twice for invoice 42.")
        events = [event async for event in subscription]

    assert_every_request_accepted(log, llama_server)
    assert log.chat_requests, "the target made no request to the real server"
    for body in log.chat_requests:
        text = json.dumps(body)
        assert EARLY not in text  # before the view
        assert SECRET not in text  # outside the projection
        assert "Ann Example" in text  # projected
        offered = {t["function"]["name"] for t in body.get("tools", [])}
        assert offered <= {"lookup_invoice"}, offered  # read-only: never refund
    first = [m for m in log.chat_requests[0]["messages"] if m["role"] != "system"]
    assert [(m["role"], m["content"]) for m in first] == [
        ("assistant", "Hello! How can I help?"),
        ("user", "I was charged twice for invoice 42."),
        ("user", "Refund invoice 42."),
    ]

    (use,) = outcome.tool_uses
    done = DelegationResult.model_validate(use.data)
    assert done.stop_reason in CLEAR_OUTCOMES
    record = handoff_of(outcome)
    if record is not None:  # the target finished: its answer is the router's
        assert outcome.stop_reason == StopReason.COMPLETED
        assert record.target == "billing" and record.run_id == done.run_id
        assert record.stop_reason in {StopReason.COMPLETED, StopReason.ANSWERED}
        assert outcome.final_text == record.text
    else:  # it did not: the router was told why and went on
        assert use.is_error and done.stop_reason.value in use.content
        assert outcome.final_text == "I will look into it myself."
    child = [e for e in events if e.path]
    assert child and {e.path for e in child} == {(outcome.run_id,)}
    assert {e.run_id for e in child} == {done.run_id}
    assert child[0].kind == "run_started" and child[-1].kind == "run_finished"
    # The router's handing call, each of the target's calls (a call may take more than one
    # request: the client retries one the server answers badly), then the router's answer.
    calls = done.usage_per_call
    assert len([e for e in child if isinstance(e, ModelResponded)]) == len(calls) >= 1
    assert len(calls) <= len(log.chat_requests)
    router_calls = 1 if record is not None else 2
    assert len(outcome.usage_per_call) == router_calls + len(calls)
    assert outcome.usage_per_call[1 : 1 + len(calls)] == calls
