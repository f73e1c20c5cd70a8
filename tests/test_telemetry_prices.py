"""Cost from real prices: genai-prices' data, the `Pricing` override, unknown models, limits."""

from __future__ import annotations

import genai_prices
import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent_flow import AgentExecutor
from agent_flow.agent import StopReason
from agent_flow.config import AgentConfig, ContextConfig, Pricing
from agent_flow.events import ModelResponded
from agent_flow.history import DropOldest, ElideToolResults, SummarizeOldest
from agent_flow.llm.base import Completion, LLMRequest, Usage
from agent_flow.llm.summarizer import LLMSummarizer
from agent_flow.pricing import price_usage
from agent_flow.testing import FunctionLLM, ScriptedReply, call, reply
from tests.helpers import add

REAL_MODELS = [
    ("gpt-4o-mini", "openai"),
    ("gpt-4.1", "openai"),
    ("o3-mini", "openai"),
    ("claude-sonnet-4-5", "anthropic"),
    ("gemini-2.5-flash", "google"),
]


@pytest.mark.parametrize(("model", "provider"), REAL_MODELS)
def test_real_models_are_priced_as_genai_prices_prices_them(model: str, provider: str) -> None:
    usage = Usage(prompt_tokens=12_000, completion_tokens=1_500, cached_tokens=5_000)
    expected = genai_prices.calc_price(
        genai_prices.Usage(input_tokens=12_000, cache_read_tokens=5_000, output_tokens=1_500),
        model_ref=model,
        provider_id=provider,
    ).total_price
    assert price_usage(model, usage) == pytest.approx(float(expected))
    # Cached tokens are cheaper than fresh ones: they are not priced as input.
    uncached = price_usage(model, Usage(prompt_tokens=12_000, completion_tokens=1_500))
    assert uncached is not None
    assert uncached > float(expected)


def test_the_provider_comes_from_the_base_url_when_genai_prices_knows_it() -> None:
    usage = Usage(prompt_tokens=1000, completion_tokens=100)
    by_url = price_usage("gpt-4o-mini", usage, base_url="https://api.openai.com/v1")
    assert by_url == pytest.approx(0.00021)
    # A local server genai-prices does not know: priced by the model's name.
    local = price_usage("gpt-4o-mini", usage, base_url="http://127.0.0.1:8000/v1")
    assert local == pytest.approx(0.00021)


def test_an_unknown_model_has_an_unknown_cost_not_zero() -> None:
    assert price_usage("my-private-finetune-7b", Usage(prompt_tokens=10)) is None
    assert price_usage(None, Usage(prompt_tokens=10)) is None


def test_pricing_overrides_the_price_data_cached_tokens_included() -> None:
    pricing = Pricing(input_per_million=2.0, output_per_million=8.0, cached_input_per_million=0.5)
    usage = Usage(prompt_tokens=1_000_000, completion_tokens=1_000_000, cached_tokens=400_000)
    assert price_usage("gpt-4o-mini", usage, pricing=pricing) == pytest.approx(
        0.6 * 2.0 + 0.4 * 0.5 + 8.0
    )


@given(
    prompt=st.integers(0, 10**7),
    completion=st.integers(0, 10**6),
    cached=st.integers(0, 10**7),
)
def test_a_price_is_never_negative_and_grows_with_output(
    prompt: int, completion: int, cached: int
) -> None:
    usage = Usage(prompt_tokens=prompt, completion_tokens=completion, cached_tokens=cached)
    cost = price_usage("gpt-4o-mini", usage)
    assert cost is not None
    assert cost >= 0
    one_more = usage.model_copy(update={"completion_tokens": completion + 1})
    more = price_usage("gpt-4o-mini", one_more)
    assert more is not None
    assert more > cost


# Linear prices (their rates cached) and tiered ones (priced in full on every call).
PRICED_MODELS = [
    *("gpt-4o-mini", "gpt-4.1", "o3-mini", "gemini-2.5-flash", "deepseek-chat"),
    *("claude-sonnet-4-5", "gemini-2.5-pro"),
]


@given(
    model=st.sampled_from(PRICED_MODELS),
    prompt=st.integers(0, 400_000),
    cached_share=st.floats(0, 1),
    completion=st.integers(0, 100_000),
    base_url=st.sampled_from([None, "https://api.openai.com/v1", "http://127.0.0.1:9/v1"]),
)
def test_the_fast_path_prices_exactly_as_genai_prices_does(
    model: str, prompt: int, cached_share: float, completion: int, base_url: str | None
) -> None:
    cached = int(prompt * cached_share)
    usage = Usage(prompt_tokens=prompt, completion_tokens=completion, cached_tokens=cached)
    raw = genai_prices.Usage(
        input_tokens=prompt, cache_read_tokens=cached or None, output_tokens=completion
    )
    try:
        expected = genai_prices.calc_price(raw, model_ref=model, provider_api_url=base_url)
    except LookupError:  # a provider genai-prices knows, without this model: by name
        expected = genai_prices.calc_price(raw, model_ref=model)
    for _ in range(2):  # the first call reads the rates, the second uses them
        assert price_usage(model, usage, base_url=base_url) == pytest.approx(
            float(expected.total_price), rel=1e-9, abs=1e-12
        )


def _agent(llm: FunctionLLM, **config: object) -> AgentExecutor:
    agent = AgentExecutor(
        llm,
        config=AgentConfig(
            context=ContextConfig(max_tokens=8000, reserve_output_tokens=1000, counter="approx"),
            **config,  # type: ignore[arg-type]
        ),
    )
    agent.tools.register(add)
    return agent


USAGE = Usage(prompt_tokens=3000, completion_tokens=200, cached_tokens=1000)


def _looping(request: LLMRequest) -> ScriptedReply:
    return reply(tool_calls=[call("add", a=1, b=2)], usage=USAGE)


async def test_every_call_and_the_run_are_priced() -> None:
    llm = FunctionLLM(
        lambda request: reply("done", usage=USAGE) if len(llm.requests) > 2 else _looping(request),
        model="gpt-4o-mini",
    )
    agent = _agent(llm)
    responded: list[ModelResponded] = []
    agent.events.on("model_responded", responded.append)
    outcome = await agent.run("add")
    per_call = price_usage("gpt-4o-mini", USAGE)
    assert per_call is not None
    assert [e.cost_usd for e in responded] == pytest.approx([per_call] * 3)
    assert [e.cached_tokens for e in responded] == [1000] * 3
    assert outcome.cost_per_call == pytest.approx((per_call,) * 3)
    assert outcome.cost_usd == pytest.approx(3 * per_call)


async def test_a_run_with_an_unpriced_model_reports_an_unknown_cost() -> None:
    outcome = await _agent(FunctionLLM(lambda r: reply("hi"), model="private-7b")).run("x")
    assert outcome.stop_reason is StopReason.ANSWERED
    assert outcome.cost_per_call == (None,)
    assert outcome.cost_usd is None


async def test_the_cost_limit_stops_the_run_before_the_call_that_could_pass_it() -> None:
    llm = FunctionLLM(_looping, model="gpt-4.1")  # $2 / $8 per million tokens
    spent_per_call = price_usage("gpt-4.1", USAGE)
    # The first call shows that the server counts the prompt as 3,000 tokens, whatever
    # agent_flow counts: later calls could cost that prompt plus the 1,000-token reserve.
    worst = price_usage("gpt-4.1", Usage(prompt_tokens=3000, completion_tokens=1000))
    assert spent_per_call is not None
    assert worst is not None
    limit = 2 * spent_per_call + 0.9 * worst
    outcome = await _agent(llm, max_cost_usd=limit).run("add forever")
    assert outcome.stop_reason is StopReason.COST_LIMIT
    # Two calls cost 2 x; a third could cost `worst`, which would pass the limit: it is
    # never made.
    assert len(llm.requests) == 2
    assert outcome.iterations == 3
    assert outcome.cost_usd == pytest.approx(2 * spent_per_call)
    assert outcome.cost_usd is not None
    assert outcome.cost_usd <= limit


async def test_a_limit_below_the_first_calls_worst_case_makes_no_call() -> None:
    llm = FunctionLLM(_looping, model="gpt-4o-mini")
    outcome = await _agent(llm, max_cost_usd=0.0001).run("add")
    assert outcome.stop_reason is StopReason.COST_LIMIT
    assert llm.requests == []
    assert outcome.cost_usd == 0


async def test_a_cost_limit_on_an_unpriced_model_ends_the_run_before_any_call() -> None:
    llm = FunctionLLM(_looping, model="private-7b")
    outcome = await _agent(llm, max_cost_usd=1.0).run("add")
    assert outcome.stop_reason is StopReason.ERROR
    assert "'private-7b' has no known price; set pricing" in outcome.final_text
    assert llm.requests == []


SUMMARY_USAGE = Usage(prompt_tokens=1200, completion_tokens=30)
AGENT_PRICES = Pricing(input_per_million=100.0, output_per_million=100.0)


def _summarizing_agent(
    summarizer_model: str, summary_usage: Usage | None
) -> tuple[AgentExecutor, list[ModelResponded]]:
    """An agent on a private model (priced by `AGENT_PRICES`) whose history outgrows its
    budget, pruned by a summarizer on a model of its own."""
    turns = 0

    def answer(request: LLMRequest) -> ScriptedReply:
        nonlocal turns
        turns += 1
        if turns > 16:
            return reply("done", usage=USAGE)
        return reply("y " * 300, tool_calls=[call("add", a=turns, b=0)], usage=USAGE)

    agent = AgentExecutor(
        FunctionLLM(answer, model="private-agent-7b"),
        config=AgentConfig(
            context=ContextConfig(max_tokens=2500, reserve_output_tokens=200, counter="approx"),
            pricing=AGENT_PRICES,
        ),
    )
    agent.tools.register(add)
    summaries = FunctionLLM(
        lambda request: (
            reply("- the agent added numbers", usage=summary_usage)
            if summary_usage is not None
            # A server that reports no usage (the test double would estimate one).
            else Completion(text="- the agent added numbers", model=summarizer_model)
        ),
        model=summarizer_model,
    )
    agent.context.strategy = SummarizeOldest(
        LLMSummarizer(summaries, counter=agent.context.counter),
        before=ElideToolResults(),
        after=DropOldest(),
    )
    responded: list[ModelResponded] = []
    agent.events.on("model_responded", responded.append)
    return agent, responded


def _split(responded: list[ModelResponded]) -> tuple[list[ModelResponded], list[ModelResponded]]:
    own = [e for e in responded if e.source == "agent"]
    return own, [e for e in responded if e.source == "summarizer"]


async def test_the_summarizers_calls_are_priced_as_its_own_model_and_summed() -> None:
    agent, responded = _summarizing_agent("gpt-4o-mini", SUMMARY_USAGE)
    outcome = await agent.run("add")
    own, summaries = _split(responded)
    assert summaries, "the history never outgrew its budget"
    # The agent's calls at the config's prices; the summarizer's at gpt-4o-mini's real ones.
    agent_price = price_usage("private-agent-7b", USAGE, pricing=AGENT_PRICES)
    assert [e.cost_usd for e in own] == pytest.approx([agent_price] * len(own))
    summary_price = price_usage("gpt-4o-mini", SUMMARY_USAGE)
    assert summary_price is not None
    assert [e.cost_usd for e in summaries] == pytest.approx([summary_price] * len(summaries))
    assert outcome.cost_usd == pytest.approx(
        sum(e.cost_usd for e in responded if e.cost_usd is not None)
    )


async def test_a_summary_without_reported_usage_is_counted_and_priced_not_free() -> None:
    agent, responded = _summarizing_agent("gpt-4o-mini", None)
    outcome = await agent.run("add")
    _, summaries = _split(responded)
    assert summaries
    for event in summaries:
        assert event.prompt_tokens > 100  # the transcript sent, as counted
        assert event.completion_tokens > 0
        assert event.cost_usd == pytest.approx(
            price_usage(
                "gpt-4o-mini",
                Usage(prompt_tokens=event.prompt_tokens, completion_tokens=event.completion_tokens),
            )
        )
    assert outcome.usage.estimated
    assert outcome.cost_usd is not None and outcome.cost_usd > 0


async def test_a_summarizer_on_an_unpriced_model_makes_the_run_cost_unknown() -> None:
    agent, responded = _summarizing_agent("private-summarizer-1b", SUMMARY_USAGE)
    outcome = await agent.run("add")
    own, summaries = _split(responded)
    assert summaries and all(e.cost_usd is None for e in summaries)
    assert all(e.cost_usd is not None for e in own)  # the override is the agent model's only
    assert outcome.cost_usd is None
