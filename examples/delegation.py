"""Delegation: a coding agent hands "investigate" to a read-only researcher with a small budget.

The coding agent (the parent) is asked to fix a bug. It delegates the investigation to a
researcher child through a `Delegate` tool: the child gets its own 4,000-token budget, only
the workspace's read-only tools (it cannot write even if it tries), and an Environment
projected from the parent's (the parent's objective and what it already knows, nothing
else). The child returns typed `Findings`; the parent's handler for the tool adds them to
``/knowledge/discovered_facts``, where the parent's next prompt shows them, and the parent
then edits the file. The child's events reach the parent's subscriber with their path, and
its usage is part of the parent's totals.

    python examples/delegation.py

Uses scripted models unless OPENAI_BASE_URL or OPENAI_API_KEY is set (then OPENAI_MODEL,
default gpt-4o-mini, plays both agents).
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from collections import Counter
from pathlib import Path

from pydantic import BaseModel

from agent_flow import AgentConfig, AgentExecutor, ContextConfig, Delegate, Environment
from agent_flow.delegation import DelegationResult
from agent_flow.llm import LLMClient, OpenAIClient
from agent_flow.messages import ToolCall
from agent_flow.testing import ScriptedLLM, ScriptStep, call, reply
from agent_flow.tools import ApprovalRequest, ToolResult, Workspace, workspace_tools

PROJECT = {
    "src/totals.py": (
        "def total(prices):\n"
        '    """The sum of the prices."""\n'
        "    result = 0\n"
        "    for price in prices[1:]:\n"
        "        result += price\n"
        "    return result\n"
    ),
    "tests/test_totals.py": "from src.totals import total\n\nassert total([1, 2, 3]) == 6\n",
}


class Findings(BaseModel):
    """What the researcher found."""

    facts: list[str]
    files: list[str]


RESEARCHER_SCRIPT: list[ScriptStep] = [
    reply("Searching for the loop.", tool_calls=[call("search_text", pattern="for price")]),
    reply(
        "Trying to fix it myself.",
        tool_calls=[call("write_file", path="src/totals.py", content="oops")],
    ),
    reply(tool_calls=[call("read_file", path="src/totals.py")]),
    reply(
        tool_calls=[
            call(
                "task_completion",
                summary="The loop skips the first price.",
                result={
                    "facts": ["total() iterates prices[1:], so it skips the first price"],
                    "files": ["src/totals.py"],
                },
            )
        ]
    ),
]

FIXED = (
    "def total(prices):\n"
    '    """The sum of the prices."""\n'
    "    result = 0\n"
    "    for price in prices:\n"
    "        result += price\n"
    "    return result\n"
)

CODER_SCRIPT: list[ScriptStep] = [
    reply(
        "Let me have the researcher find the cause.",
        tool_calls=[call("investigate", task="Find why total([1, 2, 3]) returns 5, not 6.")],
    ),
    reply(
        "The findings say the loop skips the first price: fixing it.",
        tool_calls=[call("write_file", path="src/totals.py", content=FIXED)],
    ),
    reply(tool_calls=[call("task_completion", summary="Fixed total() to sum every price.")]),
]


def choose_model(script: list[ScriptStep]) -> LLMClient:
    """A real model when OPENAI_BASE_URL or OPENAI_API_KEY is set, else the scripted one."""
    if os.environ.get("OPENAI_BASE_URL") or os.environ.get("OPENAI_API_KEY"):
        return OpenAIClient(os.environ.get("OPENAI_MODEL", "gpt-4o-mini"))
    return ScriptedLLM(script)


def findings_into_knowledge(environment: Environment, call: ToolCall, result: ToolResult) -> None:
    """The parent's handler for ``investigate``: the child's findings become known facts."""
    done = DelegationResult.model_validate(result.data)
    if done.output is None:
        return
    findings = Findings.model_validate(done.output)
    for fact in findings.facts:
        environment.set("/knowledge/discovered_facts/-", fact)
    for path in findings.files:
        environment.set(f"/knowledge/sources/{path.replace('/', '~1')}", "researcher")


async def approve(request: ApprovalRequest) -> bool:
    print(f"  approval asked: {request.tool_name} {request.arguments.get('path', '')}")
    return True


async def main() -> None:
    root = Path(tempfile.mkdtemp(prefix="totals-"))
    for relative, text in PROJECT.items():
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        (root / relative).write_text(text)
    tools = workspace_tools(Workspace(root))

    researcher = Delegate(
        "investigate",
        "Investigate a question about the code (read-only) and report findings.",
        llm=choose_model(RESEARCHER_SCRIPT),
        tools=tools,
        read_only=True,
        projection=["/task/objective", "/knowledge/discovered_facts"],
        output_type=Findings,
        budget=ContextConfig(max_tokens=4000),
        config=AgentConfig(name="researcher", max_iterations=8),
        handler=findings_into_knowledge,
    )
    llm = choose_model(CODER_SCRIPT)
    print(f"model: {type(llm).__name__}")
    coder = AgentExecutor(
        llm,
        config=AgentConfig(name="coder", context=ContextConfig(max_tokens=16_000)),
        approval=approve,
    )
    for workspace_tool in tools:
        coder.tools.register(workspace_tool)
    researcher.add_to(coder)
    coder.environment.set("/knowledge/discovered_facts", ["tests/test_totals.py fails"])

    subscription = coder.subscribe()
    outcome = await coder.run("Fix the bug in total() so that tests/test_totals.py passes.")
    events = [event async for event in subscription]

    print(f"outcome: {outcome.stop_reason.value}: {outcome.final_text}")
    print(f"coder tool calls: {', '.join(use.name for use in outcome.tool_uses)}")
    child_runs = Counter(e.run_id for e in events if e.path == (outcome.run_id,))
    for run_id, count in child_runs.items():
        ran = [e for e in events if e.run_id == run_id and e.kind == "tool_call_completed"]
        refused = [e for e in events if e.run_id == run_id and e.kind == "tool_call_failed"]
        print(
            f"child run: {count} events under the coder's run, tools "
            f"{', '.join(e.name for e in ran)}; refused: {', '.join(e.name for e in refused)}"
        )
    print(f"known facts: {coder.environment.knowledge.discovered_facts}")
    print(f"sources: {dict(coder.environment.knowledge.sources)}")
    calls = len(outcome.usage_per_call)
    print(f"model calls in the coder's totals: {calls} ({outcome.usage.total_tokens} tokens)")
    fixed = (root / "src" / "totals.py").read_text()
    print(f"src/totals.py fixed: {'for price in prices:' in fixed}")


if __name__ == "__main__":
    asyncio.run(main())
