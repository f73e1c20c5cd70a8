"""LLMSummarizer: history spans summarized by a model, with the summary's size bounded."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent_flow import AgentConfig, AgentExecutor, ContextConfig
from agent_flow.errors import CostLimitError, ModelResponseError, UserError
from agent_flow.events import AgentEvent, HistoryPruned
from agent_flow.history import (
    SUMMARY_PREFIX,
    AgentMessage,
    AgentThinking,
    History,
    SummarizeOldest,
    Summarizer,
    Summary,
    ToolCallEntry,
    ToolResultEntry,
    UserMessage,
)
from agent_flow.llm import LLMRequest, LLMSummarizer, Usage
from agent_flow.llm.metering import ModelCallPlan, ModelCallReport, listen_for_model_calls
from agent_flow.messages import ToolCall
from agent_flow.testing import FunctionLLM, Reply, ScriptedLLM, call, reply
from agent_flow.tokens import ApproxCounter
from tests.helpers import add

COUNTER = ApproxCounter()
ENTRIES = [
    UserMessage(content="Find why the build fails."),
    AgentThinking(content="SECRET-THOUGHT: check the CI log first."),
    AgentMessage(content="Reading the log."),
    ToolCallEntry(call=ToolCall(id="c1", name="read_file", arguments='{"path": "ci.log"}')),
    ToolResultEntry(call_id="c1", tool_name="read_file", content="error: missing dependency foo"),
    ToolCallEntry(call=ToolCall(id="c2", name="run", arguments='{"cmd": "pip install foo"}')),
    ToolResultEntry(call_id="c2", tool_name="run", content="permission denied", is_error=True),
]


async def test_the_model_is_sent_a_transcript_and_asked_for_at_most_max_tokens() -> None:
    llm = ScriptedLLM(["- The build lacks dependency foo; installing it was denied."])
    summarizer = LLMSummarizer(llm, counter=COUNTER, model="cheap-model")

    summary = await summarizer.summarize(ENTRIES, max_tokens=60)

    assert summary == "- The build lacks dependency foo; installing it was denied."
    request = llm.last_request
    assert request.max_tokens == 60
    assert request.model == "cheap-model"
    assert request.messages[0].role == "system"
    transcript = request.messages[1].content
    for expected in (
        "User: Find why the build fails.",
        "Assistant: Reading the log.",
        'Assistant called tool read_file with arguments {"path": "ci.log"}',
        "Tool read_file returned: error: missing dependency foo",
        "Tool run failed: permission denied",
    ):
        assert expected in transcript
    assert "SECRET-THOUGHT" not in transcript
    assert "at most 60 tokens" in transcript


async def test_a_model_that_overruns_its_budget_is_cut_to_fit() -> None:
    summarizer = LLMSummarizer(ScriptedLLM(["word " * 500]), counter=COUNTER)

    summary = await summarizer.summarize(ENTRIES, max_tokens=25)

    assert COUNTER.count(summary) <= 25
    assert summary.startswith("word word")
    assert summary.endswith("…")


async def test_an_empty_answer_is_an_error_not_an_empty_summary() -> None:
    summarizer = LLMSummarizer(ScriptedLLM(["   "]), counter=COUNTER)

    with pytest.raises(ModelResponseError, match="no text"):
        await summarizer.summarize(ENTRIES, max_tokens=50)


async def test_nothing_to_summarize_makes_no_model_call() -> None:
    llm = ScriptedLLM([])

    assert await LLMSummarizer(llm, counter=COUNTER).summarize([], max_tokens=10) == ""
    assert await LLMSummarizer(llm, counter=COUNTER).summarize(ENTRIES[1:2], max_tokens=10) == ""
    assert llm.requests == []
    with pytest.raises(UserError, match="max_tokens"):
        await LLMSummarizer(llm, counter=COUNTER).summarize(ENTRIES, max_tokens=0)


async def test_a_span_too_long_for_one_request_is_summarized_in_parts_then_combined() -> None:
    def model(request: LLMRequest) -> Reply:
        transcript = request.messages[1].content
        if "Summary of part" in transcript:
            return f"combined {transcript.count('Summary of part')} parts"
        return f"part about {transcript.count('User:')} messages"

    llm = FunctionLLM(model)
    entries = [UserMessage(content=f"message {i} " + "x" * 200) for i in range(40)]
    summarizer = LLMSummarizer(llm, counter=COUNTER, max_input_tokens=500)

    summary = await summarizer.summarize(entries, max_tokens=100)

    parts = len(llm.requests) - 1
    assert parts > 1
    assert summary == f"combined {parts} parts"
    for request in llm.requests:
        transcript = request.messages[1].content
        body = transcript.split("<conversation>\n", 1)[1].split("\n</conversation>", 1)[0]
        assert COUNTER.count(body) <= 500
    assert all(request.max_tokens == 100 for request in llm.requests)


async def test_every_summary_call_is_reported_to_the_listener_and_none_without_one() -> None:
    usage = Usage(prompt_tokens=70, completion_tokens=7)
    llm = FunctionLLM(lambda request: reply("a summary", usage=usage))
    entries = [UserMessage(content=f"message {i} " + "x" * 200) for i in range(40)]
    summarizer = LLMSummarizer(llm, counter=COUNTER, max_input_tokens=500)
    reports: list[ModelCallReport] = []

    async def listen(report: ModelCallReport) -> None:
        reports.append(report)

    with listen_for_model_calls(listen):
        await summarizer.summarize(entries, max_tokens=100)
    await summarizer.summarize(entries, max_tokens=100)  # nobody listens: nothing reported

    assert len(llm.requests) == 2 * len(reports) > 2  # the parts and the combining call
    assert {(r.source, r.usage, r.finish_reason) for r in reports} == {
        ("summarizer", usage, "stop")
    }


async def test_every_summary_call_asks_the_gate_first_and_a_refused_one_is_never_sent() -> None:
    llm = FunctionLLM(lambda request: reply("a summary", usage=Usage(prompt_tokens=70)))
    entries = [UserMessage(content=f"message {i} " + "x" * 200) for i in range(40)]
    summarizer = LLMSummarizer(llm, counter=COUNTER, model="cheap", max_input_tokens=500)
    plans: list[ModelCallPlan] = []
    reports: list[ModelCallReport] = []

    async def listen(report: ModelCallReport) -> None:
        reports.append(report)

    async def gate(plan: ModelCallPlan) -> None:
        plans.append(plan)
        if len(plans) == 3:
            raise CostLimitError("no room", limit=1.0, spent=0.9, estimate=0.2)

    with listen_for_model_calls(listen, gate=gate), pytest.raises(CostLimitError):
        await summarizer.summarize(entries, max_tokens=100)

    assert len(plans) == 3
    assert len(llm.requests) == len(reports) == 2  # the third call was never made
    for plan, request, report in zip(plans, llm.requests, reports, strict=False):
        assert plan.source == "summarizer"
        assert plan.requested_model == "cheap"
        assert plan.prompt_tokens == COUNTER.count_messages(request.messages)
        assert plan.max_tokens == request.max_tokens == 100
        assert report.plan == plan


async def test_one_huge_tool_result_is_cut_in_the_transcript() -> None:
    llm = ScriptedLLM(["short"])
    huge = ToolResultEntry(call_id="c1", tool_name="cat", content="y" * 100_000)
    entries = [ToolCallEntry(call=ToolCall(id="c1", name="cat")), huge]

    await LLMSummarizer(llm, counter=COUNTER, max_entry_tokens=50).summarize(entries, max_tokens=20)

    assert len(llm.last_request.messages[1].content) < 1_000


@given(
    answer=st.text(min_size=1, max_size=400).filter(str.strip),
    max_tokens=st.integers(1, 80),
)
async def test_a_summary_never_exceeds_its_budget(answer: str, max_tokens: int) -> None:
    summarizer = LLMSummarizer(ScriptedLLM([answer]), counter=COUNTER)

    summary = await summarizer.summarize(ENTRIES, max_tokens=max_tokens)

    assert COUNTER.count(summary) <= max_tokens


async def test_pruning_with_the_llm_summarizer_folds_old_turns_into_the_models_summary() -> None:
    history = History(counter=COUNTER)
    history.add(UserMessage(content="Refactor the parser."))
    for i in range(12):
        history.add(
            ToolCallEntry(
                call=ToolCall(id=f"c{i}", name="read_file", arguments=f'{{"path": "f{i}.py"}}')
            )
        )
        history.add(ToolResultEntry(call_id=f"c{i}", tool_name="read_file", content="code " * 60))
    llm = ScriptedLLM(["- Read f0.py to f9.py; all use the old parser API."])
    summarizer = LLMSummarizer(llm, counter=COUNTER)
    assert isinstance(summarizer, Summarizer)

    report = await history.fold(SummarizeOldest(summarizer, keep_last_units=2), max_tokens=400)

    assert report.fits
    assert report.summary_id is not None
    summaries = [e for e in history.entries if isinstance(e, Summary)]
    assert [s.content for s in summaries] == ["- Read f0.py to f9.py; all use the old parser API."]
    assert any(
        m.content.startswith(SUMMARY_PREFIX) and "old parser API" in m.content
        for m in history.to_messages()
    )
    llm.assert_all_consumed()


async def test_the_summarize_configuration_elides_summarizes_with_the_model_and_reports_it() -> (
    None
):
    """``strategy="summarize"``: elide, then the model's summary, then drop, in one report."""
    turns = 0
    summary_requests: list[LLMRequest] = []

    def answer(request: LLMRequest) -> Reply:
        nonlocal turns
        if not request.tools:  # LLMSummarizer's request: it offers no tools
            summary_requests.append(request)
            return "- The agent added numbers, one pair per turn."
        turns += 1
        if turns > 12:
            return "done"
        return reply("x " * 300, tool_calls=[call("add", a=turns, b=2)])

    config = ContextConfig(
        max_tokens=2500, reserve_output_tokens=200, counter="approx", strategy="summarize"
    )
    agent = AgentExecutor(FunctionLLM(answer), config=AgentConfig(context=config))
    agent.tools.register(add)
    pruned: list[HistoryPruned] = []

    def record(event: AgentEvent) -> None:
        assert isinstance(event, HistoryPruned)
        pruned.append(event)

    agent.events.on("history_pruned", record)
    outcome = await agent.run("Add some numbers.")

    assert outcome.final_text == "done"
    assert summary_requests, "the model was never asked for a summary"
    summarized = [e.report for e in pruned if e.report.summary_id is not None]
    assert summarized
    report = summarized[0]
    assert report.strategy == "chain(elide_tool_results, summarize_oldest, drop_oldest)"
    assert [s.strategy for s in report.steps][:2] == ["elide_tool_results", "summarize_oldest"]
    summaries = [e for e in agent.history.entries if isinstance(e, Summary)]
    assert [s.content for s in summaries] == ["- The agent added numbers, one pair per turn."]
    assert summaries[0].id == summarized[-1].summary_id
