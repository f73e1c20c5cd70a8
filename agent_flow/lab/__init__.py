"""The pruning lab: replay recorded sessions under candidate budgets and strategies, offline.

Which budget and pruning strategy suits your agent is a question about your sessions. The lab
answers it from sessions you recorded: it replays each one's steps and rebuilds every prompt
under each candidate with agent_flow's own `ContextManager`, then reports per candidate the
tokens sent per step and in total, the estimated cost, how often it pruned and summarized, the
history units it left out, and **retention**: which facts (the environment's facts, the
answers of earlier tool calls, and probe strings you give) the model could still see at each
step. Each probe also gets its own row and curve: at which steps, under which candidate, the
prompt still held it.

    sessions = [load_export("run.jsonl"), await load_session(store, "abc123")]
    candidates = [
        Candidate(name="drop", max_tokens=3000, strategy=DropOldest()),
        Candidate(name="elide", max_tokens=3000, strategy=Chain(ElideToolResults(), DropOldest())),
    ]
    report = await run_lab(sessions, candidates, probes=["ERROR disk"])
    print(render_table(report))
    Path("lab.html").write_text(render_html(report))

Parts: `recording` (sessions ready to replay, and their loaders), `candidates` (what is
compared, from code or TOML), `replay` (the replay itself), `report` (the results, JSON and
the table), `html` (the offline HTML report with SVG plots), `ask` (the optional re-asking of
each session's final question to a live model: model-dependent). ``agent-flow lab`` is the
same from the command line.
"""

from __future__ import annotations

from agent_flow.lab.ask import answer_overlap, reask
from agent_flow.lab.candidates import Candidate, LabFile, load_candidates, strategy_from_name
from agent_flow.lab.html import render_html
from agent_flow.lab.recording import (
    RecordedSession,
    RecordedStep,
    load_export,
    load_session,
    session_from_state,
)
from agent_flow.lab.replay import replay_session, run_lab
from agent_flow.lab.report import (
    CandidateResult,
    Fact,
    LabReport,
    ProbeResult,
    ReaskedAnswer,
    SessionResult,
    StepResult,
    render_table,
)

__all__ = [
    "Candidate",
    "CandidateResult",
    "Fact",
    "LabFile",
    "LabReport",
    "ProbeResult",
    "ReaskedAnswer",
    "RecordedSession",
    "RecordedStep",
    "SessionResult",
    "StepResult",
    "answer_overlap",
    "load_candidates",
    "load_export",
    "load_session",
    "reask",
    "render_html",
    "render_table",
    "replay_session",
    "run_lab",
    "session_from_state",
    "strategy_from_name",
]
