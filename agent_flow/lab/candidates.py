"""Candidates: the budgets and pruning strategies the lab compares, from code or from TOML.

A `Candidate` is what a `ContextManager` is made of, minus the session: a budget, a pruning
strategy (any `PruningStrategy`, or a `SummarizeOldest` step), the environment's share and the
system prompt. Build one in code, or from a `ContextConfig` (`Candidate.from_config`), or read
several from a TOML file (`load_candidates`):

- a lab file: ``[[candidate]]`` tables, each the fields of ``[agent.context]`` (``strategy``,
  ``max_tokens``, ``reserve_output_tokens``, ``environment_allocation``, ``window_turns``,
  ``prune_target``, ``counter``) plus an optional ``name``, and an optional top-level
  ``probes = [...]`` list of strings to look for in every prompt;
- or an agent.toml: its ``[agent.context]`` (and system prompt) as one candidate.

The ``summarize`` strategy summarizes with a model when an agent runs; the lab replays offline,
so here it summarizes with the `ExtractiveSummarizer` (the lab's report says so).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from agent_flow._defaults import (
    DEFAULT_ENVIRONMENT_ALLOCATION,
    DEFAULT_ENVIRONMENT_PLACEMENT,
    DEFAULT_PRUNE_TARGET,
    DEFAULT_SYSTEM_PROMPT_TEMPLATE,
    PRUNING_STRATEGIES,
)
from agent_flow._prompt_environment import EnvironmentPlacement, checked_placement
from agent_flow._toml_file import read_toml
from agent_flow.config import ContextConfig, StrategyName, load_config
from agent_flow.errors import ConfigError, UserError
from agent_flow.history import (
    Chain,
    DropOldest,
    ElideToolResults,
    ExtractiveSummarizer,
    PruningStrategy,
    SlidingWindow,
    SummarizeOldest,
)
from agent_flow.tokens import ApproxCounter, TiktokenCounter, TokenCounter

__all__ = ["Candidate", "LabFile", "load_candidates", "strategy_from_name"]

#: The strategy names a lab file and ``agent-flow lab --strategy`` accept.
STRATEGY_NAMES: tuple[StrategyName, ...] = PRUNING_STRATEGIES


def strategy_from_name(
    name: StrategyName, *, window_turns: int = 8, counter: TokenCounter | None = None
) -> PruningStrategy | SummarizeOldest:
    """The strategy an agent's ``[agent.context] strategy`` names, summarizing offline.

    As `AgentExecutor` builds it from a config, except that ``summarize`` folds old units with
    the `ExtractiveSummarizer` instead of asking the model.
    """
    match name:
        case "elide_then_drop":
            return Chain(ElideToolResults(), DropOldest())
        case "drop_oldest":
            return DropOldest()
        case "sliding_window":
            return Chain(SlidingWindow(window_turns), DropOldest())
        case "summarize":
            return SummarizeOldest(
                ExtractiveSummarizer(counter=counter),
                before=ElideToolResults(),
                after=DropOldest(),
            )


@dataclass(frozen=True, slots=True, kw_only=True)
class Candidate:
    """One budget and strategy to replay sessions under.

    Attributes:
        name: How the report names it (unique within a lab run).
        max_tokens: The prompt budget.
        strategy: How the history is pruned when it outgrows its share.
        reserve_output_tokens: Kept free for the answer (None: as `ContextManager` chooses).
        environment_allocation: The environment's share of what fixed costs leave.
        prune_target: Pruning shrinks the history to this fraction of its budget.
        counter: ``"tiktoken"`` or ``"approx"``: how tokens are counted.
        system_prompt_template: The system message template.
        environment_placement: Where the environment goes: in the system message, or in a
            message of its own after the history (``"last"``; see `ContextManager`).
    """

    name: str
    max_tokens: int
    strategy: PruningStrategy | SummarizeOldest
    reserve_output_tokens: int | None = None
    environment_allocation: float = DEFAULT_ENVIRONMENT_ALLOCATION
    prune_target: float = DEFAULT_PRUNE_TARGET
    counter: Literal["tiktoken", "approx"] = "tiktoken"
    system_prompt_template: str = DEFAULT_SYSTEM_PROMPT_TEMPLATE
    environment_placement: EnvironmentPlacement = DEFAULT_ENVIRONMENT_PLACEMENT

    def __post_init__(self) -> None:
        if not self.name:
            raise UserError("a candidate needs a non-empty name")
        checked_placement(self.environment_placement)
        if self.max_tokens < 1:
            raise UserError(
                f"candidate {self.name!r} has max_tokens={self.max_tokens}; give a positive budget"
            )

    @property
    def summarizes(self) -> bool:
        """Whether the strategy folds old units into summaries."""
        return isinstance(self.strategy, SummarizeOldest)

    @property
    def summarizer(self) -> str | None:
        """The summarizer's class name, when the strategy summarizes."""
        if isinstance(self.strategy, SummarizeOldest):
            return type(self.strategy.summarizer).__name__
        return None

    def make_counter(self) -> TokenCounter:
        """A fresh token counter of the kind `counter` names."""
        return ApproxCounter() if self.counter == "approx" else TiktokenCounter()

    @classmethod
    def from_config(
        cls,
        config: ContextConfig,
        *,
        name: str | None = None,
        system_prompt_template: str = DEFAULT_SYSTEM_PROMPT_TEMPLATE,
    ) -> Candidate:
        """The candidate an agent's context settings describe (``summarize``: extractive)."""
        return cls(
            name=name or f"{config.strategy}@{config.max_tokens}",
            max_tokens=config.max_tokens,
            strategy=strategy_from_name(config.strategy, window_turns=config.window_turns),
            reserve_output_tokens=config.reserve_output_tokens,
            environment_allocation=config.environment_allocation,
            prune_target=config.prune_target,
            counter=config.counter,
            system_prompt_template=system_prompt_template,
            environment_placement=config.environment_placement,
        )


class _CandidateTable(ContextConfig):
    """One ``[[candidate]]`` table: the context settings and an optional name."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str | None = None


class LabFile(BaseModel):
    """A lab TOML file: candidates, and probe strings to look for in every prompt."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    candidate: list[_CandidateTable]
    probes: list[str] = []


def load_candidates(path: str | Path) -> tuple[list[Candidate], list[str]]:
    """Read candidates (and probes) from a lab file or an agent.toml (see the module doc).

    Returns:
        The candidates, and the probe strings the file lists.

    Raises:
        ConfigError: The file is missing, not TOML, or a value is invalid.
    """
    document = read_toml(path)
    if "agent" in document:
        config = load_config(path, environ={})
        candidate = Candidate.from_config(
            config.context, system_prompt_template=config.resolved_system_prompt()
        )
        return [candidate], []
    try:
        lab = LabFile.model_validate(document)
    except ValidationError as err:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'file'}: {e['msg']}" for e in err.errors()
        )
        raise ConfigError(
            f"invalid lab file {str(path)!r}: {problems}; give [[candidate]] tables with the "
            "fields of [agent.context] (and a name), or an agent.toml"
        ) from err
    candidates = [Candidate.from_config(table, name=table.name) for table in lab.candidate]
    return candidates, list(lab.probes)


def check_names(candidates: Sequence[Candidate]) -> None:
    """Refuse two candidates of the same name (the report could not tell them apart).

    Raises:
        UserError: Two candidates share a name, or there are none.
    """
    if not candidates:
        raise UserError("the lab needs at least one candidate strategy and budget")
    seen: set[str] = set()
    for candidate in candidates:
        if candidate.name in seen:
            raise UserError(f"two candidates are named {candidate.name!r}; give each its own name")
        seen.add(candidate.name)
