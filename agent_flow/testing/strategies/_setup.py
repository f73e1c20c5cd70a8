"""Hypothesis strategies for what surrounds a prompt: tools, tool results, budgets, managers.

`context_managers` draws a whole `ContextManager` setup (environment, history, budget, output
reserve, environment allocation, system prompt template), with your strategy, counter or
prompt format when you give them; the parts shrink towards small budgets and short histories.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from hypothesis import strategies as st

from agent_flow._prompt_environment import PLACEMENTS, EnvironmentPlacement
from agent_flow._types import JsonValue
from agent_flow.context import ContextManager
from agent_flow.environment import Environment
from agent_flow.history import History, PruningStrategy, SummarizeOldest, Unit
from agent_flow.llm.base import PromptFormat
from agent_flow.messages import ToolCall, ToolDefinition
from agent_flow.testing.strategies._environment import environments, json_values
from agent_flow.testing.strategies._history import histories
from agent_flow.testing.strategies._text import identifiers, texts
from agent_flow.tokens import ApproxCounter, TokenCounter
from agent_flow.tools.results import ToolResult

__all__ = [
    "allocations",
    "answered_calls",
    "budget_edges",
    "budgets",
    "budgets_around",
    "context_managers",
    "tool_definitions",
    "tool_sets",
]

_names = identifiers()

#: System prompt templates: the environment at the start, the end, or between lines.
_TEMPLATES = ("You help.\n{environment}", "{environment}", "Act.\n{task}{environment}\n.")


@st.composite
def tool_definitions(draw: st.DrawFn) -> ToolDefinition:
    """A tool schema with a few typed, described, optional or required parameters."""
    properties = draw(
        st.dictionaries(
            _names,
            st.fixed_dictionaries(
                {"type": st.sampled_from(["string", "integer", "boolean", "number"])},
                optional={"description": texts(max_size=40)},
            ),
            max_size=4,
        )
    )
    required = (
        draw(st.lists(st.sampled_from(sorted(properties)), unique=True)) if properties else []
    )
    return ToolDefinition(
        name=draw(_names),
        description=draw(texts(max_size=80)),
        parameters={"type": "object", "properties": properties, "required": required},
    )


def tool_sets(*, max_size: int = 3) -> st.SearchStrategy[list[ToolDefinition]]:
    """Tools offered together: up to `max_size` definitions with distinct names."""
    return st.lists(tool_definitions(), max_size=max_size, unique_by=lambda tool: tool.name)


@st.composite
def answered_calls(
    draw: st.DrawFn,
    name: str | st.SearchStrategy[str] | None = None,
    *,
    data: st.SearchStrategy[JsonValue] | None = None,
    errors: bool = True,
) -> tuple[ToolCall, ToolResult]:
    """A tool call and its result, as a result handler receives them.

    Args:
        draw: Supplied by hypothesis.
        name: The tool's name (or a strategy of names); default any short name.
        data: The result's structured data (default any JSON value); its content is that
            data as JSON text.
        errors: Whether the result may be an error.
    """
    if name is None:
        name = _names
    tool_name = draw(name) if isinstance(name, st.SearchStrategy) else name
    value = draw(data if data is not None else json_values())
    call = ToolCall(id=f"call_{draw(st.integers(0, 99))}", name=tool_name, arguments="{}")
    result = ToolResult(
        content=json.dumps(value, ensure_ascii=False),
        data=value,
        is_error=draw(st.booleans()) if errors else False,
        call_id=call.id,
        tool_name=tool_name,
    )
    return call, result


def budgets(min_tokens: int = 0, max_tokens: int = 4000) -> st.SearchStrategy[int]:
    """Token budgets in ``[min_tokens, max_tokens]``, shrinking towards the smallest."""
    return st.integers(min_tokens, max_tokens)


def allocations() -> st.SearchStrategy[float]:
    """Environment allocations: any share in ``[0, 1]``, the extremes included."""
    return st.one_of(st.sampled_from([0.0, 1.0]), st.floats(0.0, 1.0))


def _edge_sizes(units: Sequence[Unit]) -> list[int]:
    """The pinned units' size, then with the newest 1, 2, ... other units added, up to all."""
    sizes = [sum(u.tokens for u in units if u.pinned)]
    for unit in reversed(units):
        if not unit.pinned:
            sizes.append(sizes[-1] + unit.tokens)
    return sizes


def budget_edges(units: Sequence[Unit]) -> list[int]:
    """The budgets one token below, at and above a size where a strategy's choice flips.

    The sizes are the pinned units alone and the pinned units with the newest 1, 2, ... of
    the others (what dropping the oldest keeps), up to all of them. Sorted, 0 or more.
    """
    return sorted({max(0, size + step) for size in _edge_sizes(units) for step in (-1, 0, 1)})


def budgets_around(units: Sequence[Unit]) -> st.SearchStrategy[int]:
    """Budgets for pruning `units`: from 0 to a bit above their total, half on the edges.

    Half are `budget_edges`: one token below, at or above a size where a strategy's choice
    flips, where an off-by-one in a strategy shows (and almost nowhere else); failing examples
    shrink towards these. A quarter are anywhere from 0 to 120% of the total, and a quarter
    between what the pinned units need and the total, where a strategy has real choices to
    make.
    """
    everything = sum(u.tokens for u in units)
    pinned = sum(u.tokens for u in units if u.pinned)
    sizes = _edge_sizes(units)
    # A size with some unpinned units kept is where a strategy decides: drawn first.
    edges = st.builds(
        lambda size, step: max(0, size + step),
        st.sampled_from(sizes[1:] + sizes[:1]),
        st.sampled_from((-1, 0, 1)),
    )
    return st.one_of(
        edges,
        st.one_of(
            st.floats(0.0, 1.2).map(lambda f: int(everything * f)),
            st.floats(0.0, 1.0).map(lambda f: pinned + int((everything - pinned) * f)),
        ),
    )


@st.composite
def context_managers(
    draw: st.DrawFn,
    *,
    environment: st.SearchStrategy[Environment] | None = None,
    history: st.SearchStrategy[History] | None = None,
    counter: TokenCounter | None = None,
    max_tokens: st.SearchStrategy[int] | None = None,
    strategy: PruningStrategy
    | SummarizeOldest
    | st.SearchStrategy[PruningStrategy | SummarizeOldest]
    | None = None,
    prompt_format: PromptFormat | None = None,
    environment_placement: st.SearchStrategy[EnvironmentPlacement] | None = None,
) -> ContextManager:
    """A whole `ContextManager` setup: environment, history, budget, reserve, allocation.

    Args:
        draw: Supplied by hypothesis.
        environment: Environments to use (default `environments()`).
        history: Histories to use (default `histories(counter)`); the manager counts with
            the history's counter.
        counter: The counter of the default histories (default `ApproxCounter`).
        max_tokens: Budgets (default 50 to 4,000 tokens).
        strategy: The pruning strategy or summarizing step (or a strategy of them);
            default the manager's own.
        prompt_format: How the client sends the prompt (default native).
        environment_placement: Where the environment goes (default either: ``"system"`` or
            ``"last"``).
    """
    counter = counter if counter is not None else ApproxCounter()
    # The history first: drawn after a large environment, hypothesis leaves most histories
    # empty (57% against 15%), and the history is what pruning and prompts are about.
    transcript = draw(history if history is not None else histories(counter), label="history")
    env = draw(environment if environment is not None else environments(), label="environment")
    budget = draw(max_tokens if max_tokens is not None else budgets(50, 4000), label="budget")
    reserve = draw(st.integers(0, max(0, min(40, budget - 1))), label="reserve")
    chosen = draw(strategy) if isinstance(strategy, st.SearchStrategy) else strategy
    return ContextManager(
        env,
        transcript,
        budget,
        environment_allocation=draw(allocations(), label="allocation"),
        system_prompt_template=draw(st.sampled_from(_TEMPLATES), label="template"),
        reserve_output_tokens=reserve,
        strategy=chosen,
        prompt_format=prompt_format,
        environment_placement=draw(
            environment_placement
            if environment_placement is not None
            else st.sampled_from(PLACEMENTS),
            label="environment_placement",
        ),
    )
