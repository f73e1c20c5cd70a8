"""What an agent puts on the wire and counts: approvers, budgets, output reserve, usage.

Each test pins one behaviour of issue 9, section 4, through a real `AgentExecutor` run:

- agents sharing one `ToolExecutor` each get their own approver;
- in XML tool mode the prompt sent is the prompt budgeted;
- summarizer model calls count in the usage, the events and the limits;
- the request's ``max_tokens`` is the output reserve (capped by the configured limit);
- usage without a total still counts against ``max_total_tokens``.
"""

from __future__ import annotations

from agent_flow.agent import AgentExecutor, StopReason
from agent_flow.config import AgentConfig, ContextConfig
from agent_flow.llm.base import Usage
from agent_flow.testing import FunctionLLM, call, reply
from agent_flow.tools import tool


@tool
def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first.
        b: The second.
    """
    return a + b


def _config(**settings: object) -> AgentConfig:
    return AgentConfig.model_validate(
        {"context": ContextConfig(max_tokens=8000, counter="approx"), **settings}
    )


async def test_usage_without_a_total_counts_against_the_token_limit() -> None:
    usage = Usage(prompt_tokens=600, completion_tokens=100)  # a client that left total unset
    looping = FunctionLLM(lambda request: reply(tool_calls=[call("add", a=1, b=1)], usage=usage))
    agent = AgentExecutor(looping, config=_config(max_total_tokens=1500))
    agent.tools.register(add)

    outcome = await agent.run("add forever")

    assert (outcome.stop_reason, outcome.iterations) == (StopReason.TOKEN_LIMIT, 3)
    assert outcome.usage.total_tokens == 2100
