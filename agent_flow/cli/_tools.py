"""`agent-flow tools`: the tools an agent would be offered, with what their schemas cost.

When ``run_command`` is among them, a last line says what its commands can reach here:
confined by bubblewrap, or not confined at all.
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import AsyncIterator

from agent_flow.agent import AgentExecutor
from agent_flow.cli._build import _tools
from agent_flow.cli._exit import EXIT_OK, _Streams
from agent_flow.config import load_config
from agent_flow.errors import UserError
from agent_flow.llm import LLMConfig
from agent_flow.llm.base import Completion, LLMRequest, StreamEvent
from agent_flow.tools import shell_boundary


class _NoModel:
    """Stands in for the model where an agent is built only to see what it offers."""

    model = "none"

    async def complete(self, request: LLMRequest) -> Completion:
        raise UserError("this agent was built to list tools; it has no model to call")

    async def stream(self, request: LLMRequest) -> AsyncIterator[StreamEvent]:
        raise UserError("this agent was built to list tools; it has no model to call")
        yield  # pragma: no cover - makes this an async generator, as the protocol wants


async def _tools_command(args: argparse.Namespace, streams: _Streams) -> int:
    config = load_config(args.config)
    if args.model:
        config = config.model_copy(
            update={"llm": LLMConfig(model=args.model), "llm_overrides": None}
        )
    async with contextlib.AsyncExitStack() as stack:
        tools = await _tools(args, config, stack)
        agent = AgentExecutor(_NoModel(), config=config, tools=tools.executor)
        offered = agent.offered_tools()
        counter = agent.context.counter
        registered = tools.executor.tools
    out = streams.stdout
    if not offered:
        out.write("no tools are offered\n")
        return EXIT_OK
    rows = []
    for definition in offered:
        policy = registered[definition.name].policy
        traits = "read-only" if policy.read_only else f"{policy.risk.value} risk"
        if policy.requires_approval:
            traits += ", asks approval"
        source = tools.sources.get(
            definition.name, "control" if definition.name in _CONTROL else "config"
        )
        tokens = counter.count_tools([definition])
        rows.append((definition.name, source, traits, f"{tokens:,}"))
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
        f"(counted with {counter.name})\n"
    )
    if any(definition.name == "run_command" for definition in offered):
        out.write(f"run_command: {shell_boundary(config.shell)}\n")
    return EXIT_OK


_CONTROL = frozenset({"task_completion", "ask_question", "converse", "update_plan"})
