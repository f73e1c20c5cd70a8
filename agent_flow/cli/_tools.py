"""`agent-flow tools`: the tools an agent is offered, what `run` does with each, their cost.

The POLICY column is the run's own policy engine's verdict for the tool: ``asks approval``
is exactly what `run` and `chat` will ask before calling it (unless ``--yes``; high-risk
tools only with ``--yes-all``). When ``run_command`` is among them, a last line says what
its commands can reach here: confined by bubblewrap, or not confined at all.
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import AsyncIterator

from agent_flow.agent import AgentExecutor
from agent_flow.cli._build import _load_config, _start_agent, _tools
from agent_flow.cli._exit import EXIT_OK, _Streams
from agent_flow.cli._run import _close_at_exit
from agent_flow.errors import UserError
from agent_flow.llm import LLMConfig
from agent_flow.llm.base import Completion, LLMRequest, StreamEvent
from agent_flow.tools import PolicyEngine, RegisteredTool, shell_boundary


class _NoModel:
    """Stands in for the model where an agent is built only to see what it offers."""

    model = "none"

    async def complete(self, request: LLMRequest) -> Completion:
        raise UserError("this agent was built to list tools; it has no model to call")

    async def stream(self, request: LLMRequest) -> AsyncIterator[StreamEvent]:
        raise UserError("this agent was built to list tools; it has no model to call")
        yield  # pragma: no cover - makes this an async generator, as the protocol wants


def _policy(engine: PolicyEngine, tool: RegisteredTool) -> str:
    """What a run does with `tool`: its risk, and whether it asks first or is refused."""
    policy = tool.policy
    traits = "read-only" if policy.read_only else f"{policy.risk.value} risk"
    verdict = engine.evaluate(tool.name, policy, {}).verdict
    if verdict == "denied":
        return f"{traits}, refused by policy"
    if verdict == "requires_approval":
        return f"{traits}, asks approval"
    if policy.command_argument is not None and engine.dangerous_commands:
        return f"{traits}, asks approval for risky commands"
    return traits


async def _tools_command(args: argparse.Namespace, streams: _Streams) -> int:
    from agent_flow.cli._user_agent import load_user_agent

    def warn(message: str) -> None:
        streams.stderr.write(f"agent-flow: warning: {message}\n")

    own = await load_user_agent(args.agent) if args.agent else None
    config = (
        own.config
        if isinstance(own, AgentExecutor)
        else own
        if own is not None
        else _load_config(args.config, warn)
    )
    if args.model:
        config = config.model_copy(
            update={"llm": LLMConfig(model=args.model), "llm_overrides": None}
        )
    async with contextlib.AsyncExitStack() as stack:
        if isinstance(own, AgentExecutor):
            _close_at_exit(own.llm, stack)
        into = own.tools if isinstance(own, AgentExecutor) else None
        tools = _tools(args, config, into=into)
        if isinstance(own, AgentExecutor) and not args.model:
            agent = own
            agent.config = tools.config
        else:
            agent = AgentExecutor(_NoModel(), config=tools.config, tools=tools.executor)
        await _start_agent(agent, tools, stack)
        offered = agent.offered_tools()
        counter = agent.context.counter
        # Copied while the MCP servers run: leaving the block unregisters their tools.
        registered = dict(tools.executor.tools)
        engine = tools.executor.policy
        fixed = agent.context.fixed_tokens(tools=offered)
        budget = agent.context.max_tokens - agent.context.reserve_output_tokens
    out = streams.stdout
    if not offered:
        out.write("no tools are offered\n")
        return EXIT_OK
    rows = []
    for definition in offered:
        source = tools.sources.get(
            definition.name, "control" if definition.name in _CONTROL else "python"
        )
        tokens = counter.count_tools([definition])
        policy = _policy(engine, registered[definition.name])
        rows.append((definition.name, source, policy, f"{tokens:,}"))
    header = ("TOOL", "FROM", "POLICY", "TOKENS")
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(4)]
    for row in [header, *rows]:
        out.write(
            "  ".join(
                [
                    *(cell.ljust(width) for cell, width in zip(row[:3], widths, strict=False)),
                    row[3].rjust(widths[3]),
                ]
            ).rstrip()
            + "\n"
        )
    total = counter.count_tools(offered)
    out.write(
        f"{len(offered)} tools; their schemas cost {total:,} tokens in every prompt "
        f"(counted with {counter.name}); `run` asks before calling those marked 'asks "
        "approval' (--yes approves them); with the system prompt, every prompt spends "
        f"{fixed:,} of its {budget:,} tokens before the environment and history\n"
    )
    if any(definition.name == "run_command" for definition in offered):
        out.write(f"run_command: {shell_boundary(config.shell)}\n")
    return EXIT_OK


_CONTROL = frozenset({"task_completion", "ask_question", "converse", "update_plan"})
