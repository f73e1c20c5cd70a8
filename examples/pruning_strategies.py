"""Tuning pruning with the lab: record sessions once, replay them under candidate strategies.

The agent reads daily logs, one file per step, and reports the errors it saw. The script
records two such sessions with a budget large enough that nothing is pruned, then asks the
pruning lab (`agent_flow.lab`) what the model would have seen under a budget far smaller than
the sessions, with three strategies:

- ``DropOldest``: whole turns go, oldest first (the task is pinned);
- ``Chain(ElideToolResults(), DropOldest())``: old tool results lose their bodies first (the
  calls stay), turns go only if that is not enough;
- ``SummarizeOldest(ExtractiveSummarizer(), after=DropOldest())``: old turns are folded into a
  summary entry, written here without a model (the lab replays offline).

The lab rebuilds every step's prompt with agent_flow's own ContextManager and reports the
tokens sent, the estimated cost, how often each strategy pruned, and which error lines (the
probes) and tool answers the model could still see at each step; it also writes an HTML
report with plots. The same from the command line:

    agent-flow lab SESSION_ID --db sessions.db --budget 3000 --reserve 300 --probe "ERROR disk"

    python examples/pruning_strategies.py

Uses a scripted model unless OPENAI_BASE_URL or OPENAI_API_KEY is set (then OPENAI_MODEL,
default gpt-4o-mini, plays the sessions; it may read the files differently).
"""

from __future__ import annotations

import asyncio
import os
import tempfile
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
    SummarizeOldest,
    TiktokenCounter,
)
from agent_flow.lab import Candidate, LabReport, load_session, render_html, render_table, run_lab
from agent_flow.llm import LLMClient, OpenAIClient
from agent_flow.sessions import SessionStore, open_store
from agent_flow.testing import ScriptedLLM, ScriptStep, call, reply
from agent_flow.tools import ToolExecutor, Workspace, workspace_tools

DAYS = 10
BUDGET = 3000
RESERVE = 300
RECORDING_BUDGET = 100_000  # nothing is pruned while recording: the lab sees every step
MODEL = os.environ.get("OPENAI_MODEL", "gpt-4o-mini")


def write_logs(root: Path) -> None:
    for day in range(1, DAYS + 1):
        lines = [
            f"2025-03-{day:02d} {hour:02d}:00 INFO worker-{hour % 3} processed {40 + hour} jobs"
            for hour in range(14)
        ]
        lines.insert(7, f"2025-03-{day:02d} 07:30 ERROR disk {chr(96 + day)} is {80 + day}% full")
        (root / f"day{day:02d}.log").write_text("\n".join(lines) + "\n")


def script(days: list[int]) -> list[ScriptStep]:
    steps: list[ScriptStep] = [
        reply(f"Reading day {day}.", tool_calls=[call("read_file", path=f"day{day:02d}.log")])
        for day in days
    ]
    return [*steps, reply(f"Read {len(days)} logs; each has one disk ERROR line.")]


def choose_model(steps: list[ScriptStep]) -> LLMClient:
    """A real model when OPENAI_BASE_URL or OPENAI_API_KEY is set, else the scripted one."""
    if os.environ.get("OPENAI_BASE_URL") or os.environ.get("OPENAI_API_KEY"):
        return OpenAIClient(MODEL)
    return ScriptedLLM(steps, model=MODEL)


async def record(store: SessionStore, logs: Path, days: list[int], task: str) -> str:
    """Run the agent on `task` with a budget that never prunes; return the session's id."""
    context = ContextManager(
        Environment(),
        History(counter=TiktokenCounter()),
        RECORDING_BUDGET,
        reserve_output_tokens=RESERVE,
    )
    agent = AgentExecutor(
        choose_model(script(days)),
        config=AgentConfig(max_iterations=len(days) + 3),
        tools=ToolExecutor(workspace_tools(Workspace(logs))),
        context=context,
        store=store,
    )
    outcome = await agent.run(task)
    session_id = agent.recorder.session_id if agent.recorder is not None else None
    if session_id is None:
        raise RuntimeError("the session was not recorded")
    print(f"recorded {session_id}: {outcome.stop_reason.value}, {task!r}")
    return session_id


def candidates() -> list[Candidate]:
    def at_budget(name: str, strategy: DropOldest | Chain | SummarizeOldest) -> Candidate:
        return Candidate(
            name=name, max_tokens=BUDGET, reserve_output_tokens=RESERVE, strategy=strategy
        )

    return [
        at_budget("drop_oldest", DropOldest()),
        at_budget("elide_then_drop", Chain(ElideToolResults(keep_last=2), DropOldest())),
        at_budget(
            "summarize",
            SummarizeOldest(
                ExtractiveSummarizer(),
                keep_last_units=2,
                max_summary_tokens=200,
                after=DropOldest(),
            ),
        ),
    ]


def describe(report: LabReport) -> None:
    """What each strategy let the model see at the end of the first session."""
    for result in report.candidates:
        session = result.sessions[0]
        last = session.steps[-1]
        facts = {f.id: f for f in session.facts}
        errors = [facts[i].label[3:5] for i in last.visible if facts[i].kind == "probe"]
        answers = [i for i in last.visible if facts[i].kind == "tool_result"]
        print(f"== {result.name}")
        print(
            f"  pruned before {result.prunes} of {result.steps} steps "
            f"({result.summaries} with a summary); {result.units_omitted} units left out"
        )
        print(
            f"  last prompt: {last.tokens:,}/{result.max_tokens:,} tokens; "
            f"{len(answers)} of {DAYS} log answers whole; "
            f"error lines visible for days {', '.join(errors) or 'none'}"
        )


async def main() -> None:
    logs = Path(tempfile.mkdtemp(prefix="logs-"))
    write_logs(logs)
    print(f"model: {type(choose_model([])).__name__}; lab budget {BUDGET} tokens per prompt")
    async with open_store(logs / "sessions.db") as store:
        ids = [
            await record(
                store,
                logs,
                list(range(1, DAYS + 1)),
                f"Read the {DAYS} daily logs, then list the days with errors.",
            ),
            await record(store, logs, [2, 4, 6, 8], "Read the logs of the even days up to 8."),
        ]
        sessions = [await load_session(store, session_id) for session_id in ids]
    probes = [f"03-{day:02d} 07:30 ERROR" for day in range(1, DAYS + 1)]
    report = await run_lab(sessions, candidates(), probes=probes, model=MODEL)
    print(render_table(report), end="")
    describe(report)
    html = logs / "lab.html"
    html.write_text(render_html(report), encoding="utf-8")
    print(f"HTML report with plots: {html}")


if __name__ == "__main__":
    asyncio.run(main())
