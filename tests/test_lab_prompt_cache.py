"""The lab's prompt-cache figures: what a prefix cache could serve of each candidate's prompts."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent_flow import DropOldest
from agent_flow.errors import UserError
from agent_flow.lab import (
    Candidate,
    load_candidates,
    load_session,
    render_html,
    render_table,
    run_lab,
)
from agent_flow.lab.report import format_cost
from agent_flow.llm.base import Usage
from agent_flow.pricing import price_usage
from agent_flow.sessions import SQLiteSessionStore
from tests.test_lab import candidate, record


@pytest.fixture
async def store(tmp_path: Path):  # type: ignore[no-untyped-def]
    async with SQLiteSessionStore(tmp_path / "s.db") as opened:
        yield opened


async def test_with_the_environment_last_the_history_is_cacheable_and_the_cost_drops(
    store: SQLiteSessionStore,
) -> None:
    session = await load_session(store, await record(store))
    report = await run_lab(
        [session],
        [
            candidate("in-system", 100_000, DropOldest()),
            candidate("last", 100_000, DropOldest(), environment_placement="last"),
        ],
    )
    system, last = report.candidates
    assert (system.environment_placement, last.environment_placement) == ("system", "last")
    # Each step's fact handler changes the environment: in the system message, a step repeats
    # only the tool schemas; last, the whole history before the newest step.
    steps = system.sessions[0].steps
    assert steps[0].cached_tokens == 0 == last.sessions[0].steps[0].cached_tokens
    assert all(s.cached_tokens == session.tool_tokens for s in steps[1:])
    for before, step in zip(last.sessions[0].steps, last.sessions[0].steps[1:], strict=False):
        # All of the step before but its environment (and the reply priming, not a message).
        b = before.breakdown
        assert step.cached_tokens == before.tokens - b.environment - b.priming
        assert step.cached_tokens < step.tokens
    assert last.cached_tokens > 0.5 * last.tokens > system.cached_tokens
    # Billed at the cache-read price: exactly genai-prices' price of each step with its cache.
    expected = sum(
        price_usage(
            "gpt-4o-mini",
            Usage(
                prompt_tokens=s.tokens,
                completion_tokens=r.completion_tokens,
                cached_tokens=s.cached_tokens,
            ),
        )
        or 0.0
        for s, r in zip(last.sessions[0].steps, session.steps, strict=True)
    )
    assert last.cost_cached_known_usd == pytest.approx(expected)
    assert last.cost_usd is not None and last.cost_cached_known_usd < 0.7 * last.cost_usd
    table = render_table(report)
    share = round(100 * last.cached_tokens / last.tokens)
    assert f"last: cacheable {share}% of the tokens sent; cost if cached $" in table
    # The HTML page's summary row and step-by-step table say the same.
    page = render_html(report)
    cached_cost = format_cost(last.cost_cached_known_usd, last.unpriced_steps, last.steps)
    assert f"<td>{share}%</td><td>{cached_cost}</td>" in page
    first_cached = last.sessions[0].steps[1].cached_tokens
    assert (
        f"<td>2</td><td>{last.sessions[0].steps[1].tokens:,}</td><td>{first_cached:,}</td>" in page
    )


def test_a_lab_file_places_the_environment_and_refuses_an_unknown_place(tmp_path: Path) -> None:
    lab = tmp_path / "lab.toml"
    lab.write_text(
        '[[candidate]]\nname = "a"\nmax_tokens = 4000\n'
        '[[candidate]]\nname = "b"\nmax_tokens = 4000\nenvironment_placement = "last"\n'
    )
    (a, b), _ = load_candidates(lab)
    assert (a.environment_placement, b.environment_placement) == ("system", "last")
    with pytest.raises(UserError, match="environment_placement must be one of"):
        Candidate(name="c", max_tokens=10, strategy=DropOldest(), environment_placement="end")  # type: ignore[arg-type]
