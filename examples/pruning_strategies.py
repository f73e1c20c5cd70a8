"""Tuning pruning: the same long session under three strategies, and what each one kept.

The agent reads ten days of logs, one file per step, under a budget far smaller than the
whole session, then reports the errors it can still see. Three strategies shrink the
history when it outgrows its share of the budget:

- ``DropOldest``: whole turns go, oldest first (the task is pinned);
- ``Chain(ElideToolResults(), DropOldest())``: old tool results lose their bodies first
  (the calls stay), turns go only if that is not enough;
- ``SummarizeOldest(ExtractiveSummarizer(), after=DropOldest())``: old turns are folded
  into a summary entry, written here without a model. Summarizing is the one pruning step that
  may await a model, so it is not a (synchronous) strategy inside a ``Chain``: it is a step of
  its own, given the sync strategies to run before or after it, and the ContextManager awaits
  it when the history outgrows its budget.

For each, the script prints how often it pruned, what the history holds at the end, which
days' errors the model could still see in its last prompt, and that prompt's token split.

    python examples/pruning_strategies.py

Uses a scripted model unless OPENAI_BASE_URL or OPENAI_API_KEY is set (then OPENAI_MODEL,
default gpt-4o-mini, plays the session; it may read the files differently).
"""

from __future__ import annotations

import asyncio
import os
import re
import tempfile
from collections import Counter
from pathlib import Path

from agent_flow import (
    AgentConfig,
    AgentExecutor,
    Chain,
    ContextManager,
    DropOldest,
    ElideToolResults,
    Environment,
    ExtractiveSummarizer,
    History,
    PruningStrategy,
    SummarizeOldest,
    Summary,
    TiktokenCounter,
    ToolResultEntry,
)
from agent_flow.events import AgentEvent, ContextBuilt, HistoryPruned
from agent_flow.llm import LLMClient, LLMRequest, OpenAIClient
from agent_flow.testing import Reply, ScriptedLLM, ScriptStep, call, reply
from agent_flow.tools import ToolExecutor, Workspace, workspace_tools

DAYS = 10
BUDGET = 3000


def write_logs(root: Path) -> None:
    for day in range(1, DAYS + 1):
        lines = [
            f"2025-03-{day:02d} {hour:02d}:00 INFO worker-{hour % 3} processed {40 + hour} jobs"
            for hour in range(14)
        ]
        lines.insert(7, f"2025-03-{day:02d} 07:30 ERROR disk {chr(96 + day)} is {80 + day}% full")
        (root / f"day{day:02d}.log").write_text("\n".join(lines) + "\n")


def report(request: LLMRequest) -> Reply:
    """The scripted model's last step: what it can still see of the session."""
    sent = "\n".join(
        message.content + " ".join(c.arguments for c in message.tool_calls)
        for message in request.messages
    )
    read = sorted(set(re.findall(r"day(\d\d)\.log", sent)))
    errors = sorted(set(re.findall(r"03-(\d\d) 07:30 ERROR", sent)))
    return reply(
        tool_calls=[
            call(
                "task_completion",
                summary=f"I see that I read days {', '.join(read)}; "
                f"error lines remain for days {', '.join(errors) or 'none'}.",
                result={"read": read, "errors": errors},
            )
        ]
    )


def script() -> list[ScriptStep]:
    steps: list[ScriptStep] = [
        reply(f"Reading day {day}.", tool_calls=[call("read_file", path=f"day{day:02d}.log")])
        for day in range(1, DAYS + 1)
    ]
    return [*steps, report]


def choose_model(steps: list[ScriptStep]) -> LLMClient:
    """A real model when OPENAI_BASE_URL or OPENAI_API_KEY is set, else the scripted one."""
    if os.environ.get("OPENAI_BASE_URL") or os.environ.get("OPENAI_API_KEY"):
        return OpenAIClient(os.environ.get("OPENAI_MODEL", "gpt-4o-mini"))
    return ScriptedLLM(steps)


async def run_with(strategy: PruningStrategy | SummarizeOldest, logs: Path) -> None:
    counter = TiktokenCounter()
    context = ContextManager(
        Environment(),
        History(counter=counter),
        BUDGET,
        reserve_output_tokens=300,
        strategy=strategy,
    )
    agent = AgentExecutor(
        choose_model(script()),
        config=AgentConfig(max_iterations=DAYS + 3),
        tools=ToolExecutor(workspace_tools(Workspace(logs))),
        context=context,
    )
    prunes: list[HistoryPruned] = []
    prompts: list[ContextBuilt] = []

    def record(event: AgentEvent) -> None:
        if isinstance(event, HistoryPruned):
            prunes.append(event)
        elif isinstance(event, ContextBuilt):
            prompts.append(event)

    agent.events.on(["history_pruned", "context_built"], record)
    outcome = await agent.run(f"Read the {DAYS} daily logs, then list the days with errors.")

    entries = agent.history.entries
    kinds = Counter(entry.kind for entry in entries)
    results = [entry for entry in entries if isinstance(entry, ToolResultEntry)]
    full = [result for result in results if "ERROR" in result.content]
    elided = [result for result in results if result.content.startswith("[elided")]
    summaries = [entry for entry in entries if isinstance(entry, Summary)]
    split = prompts[-1].breakdown
    print(f"== {strategy.name}")
    print(
        f"  pruned {len(prunes)} time(s): dropped {sum(len(p.report.dropped) for p in prunes)}, "
        f"elided {sum(len(p.report.elided) for p in prunes)}, "
        f"summarized {sum(len(p.report.summarized) for p in prunes)} entries"
    )
    print(f"  history now: {len(entries)} entries {dict(sorted(kinds.items()))}")
    print(
        f"  tool results kept whole: {len(full)}, elided: {len(elided)}, "
        f"summaries: {len(summaries)}"
    )
    if summaries:
        first = summaries[0].content.splitlines()
        print(f"  summary starts: {first[0]!r} ({len(first)} lines)")
    print(f"  answer: {outcome.final_text}")
    print(
        f"  last prompt: {split.total:,}/{split.budget:,} tokens = system {split.system_template}"
        f" + environment {split.environment} + tools {split.tools} + history {split.history}"
        f" + priming {split.priming}; {outcome.usage.prompt_tokens:,} prompt tokens in the run"
    )


async def main() -> None:
    logs = Path(tempfile.mkdtemp(prefix="logs-"))
    write_logs(logs)
    print(f"model: {type(choose_model([])).__name__}; budget {BUDGET} tokens per prompt")
    strategies: list[PruningStrategy | SummarizeOldest] = [
        DropOldest(),
        Chain(ElideToolResults(keep_last=2), DropOldest()),
        SummarizeOldest(
            ExtractiveSummarizer(), keep_last_units=2, max_summary_tokens=200, after=DropOldest()
        ),
    ]
    for strategy in strategies:
        await run_with(strategy, logs)


if __name__ == "__main__":
    asyncio.run(main())
