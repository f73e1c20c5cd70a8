"""The ContextManager: one hard token budget split between the Environment and the History.

Every prompt agent_flow sends is built here. The budget is spent in this order:

1. ``reserve_output_tokens`` are set aside for the model's answer;
2. fixed costs are paid: the system prompt template (without the environment), the tool
   schemas, and the reply priming; if they alone exceed the budget, `ContextBudgetError`
   says which part is too large and by how much;
3. what is left ("usable") is shared: the environment may take ``environment_allocation``
   of it, the history the rest; a share one side does not use flows to the other;
4. the environment is rendered within its share (it degrades, never overflows), and the
   history fills what the environment left: all of it when it fits, otherwise its pinned
   units (the first user message and summaries) plus the newest units that fit — never a
   tool call without its result.

The system prompt template's ``{task}`` becomes a "Current task: ..." line: the objective
of the environment's task unless the caller names another (``current_task``), so the task
stays in view even when the environment has to degrade. Every budget method takes the same
``current_task`` and tools, so pruning and prompt building agree on the fixed costs
(`fixed_tokens`).

The invariant, property-tested: ``counter.count_messages(prompt.messages) +
counter.count_tools(prompt.tools) == prompt.total_tokens <= max_tokens -
reserve_output_tokens``.

The budget counts the prompt as it goes on the wire. A client that rewrites the prompt (XML
tool mode: the tool schemas join the system message, tool turns become text) has a
`PromptFormat` other than the native one; with it, every cost above is that of the rendering
(`agent_flow._wire_count`), and the whole rendered prompt is counted exactly before it is
returned (units are left out, oldest first, if merging or seams made it a few tokens larger
than estimated). The invariant then reads: the count of ``prompt_format.render(messages,
tools)`` equals ``prompt.total_tokens`` and stays within the budget.

`build_prompt` never changes the history; `prune_if_needed`
does, with the configured strategy, so that later prompts need not leave anything out. The
strategy is either a synchronous `PruningStrategy` (applied with `History.prune`) or a
`SummarizeOldest` step, the one that awaits a summarizer (applied with `History.fold`, with
the sync strategies it runs before and after the summary).
"""

from __future__ import annotations

from collections.abc import Sequence

from agent_flow._defaults import (
    DEFAULT_ENVIRONMENT_ALLOCATION,
    DEFAULT_ENVIRONMENT_PLACEMENT,
    DEFAULT_PRUNE_TARGET,
    DEFAULT_SYSTEM_PROMPT_TEMPLATE,
    default_reserve_output_tokens,
)
from agent_flow._prompt_environment import (
    EnvironmentPlacement,
    PlacedEnvironment,
    checked_placement,
)
from agent_flow._wire_count import WireCounter
from agent_flow.environment import Environment
from agent_flow.errors import ContextBudgetError, UserError
from agent_flow.history import (
    Chain,
    DropOldest,
    ElideToolResults,
    History,
    PruneReport,
    PruningStrategy,
    SummarizeOldest,
    Unit,
)
from agent_flow.history.units import select_units
from agent_flow.llm.base import NativeFormat, PromptFormat
from agent_flow.messages import ChatMessage, ToolDefinition
from agent_flow.prompt import Prompt, PromptBreakdown
from agent_flow.tokens import (
    REPLY_PRIMING_TOKENS,
    TokenCounter,
)

__all__ = [
    "DEFAULT_SYSTEM_PROMPT_TEMPLATE",
    "ContextManager",
    "EnvironmentPlacement",
]

# The longest task line taken from the environment's objective (see `ContextManager._task`).
_TASK_LINE_CHARS = 300

# How often prune_if_needed prunes again when the rendered history still does not fit (the
# strategies count the history as stored, which a rewriting format renders larger).
_MAX_PRUNE_ROUNDS = 3


def default_strategy() -> PruningStrategy:
    """Elide old tool-result bodies first, then drop the oldest units."""
    return Chain(ElideToolResults(), DropOldest())


class ContextManager:
    """Builds every prompt within ``max_tokens - reserve_output_tokens``.

    Args:
        environment: The agent's working memory.
        history: The transcript; its counter is used unless `counter` is given.
        max_tokens: The model's context window, or any smaller hard budget.
        environment_allocation: The share (0..1) of the usable budget the environment may take.
        system_prompt_template: The system message. ``{environment}`` marks where the rendered
            environment goes (appended when absent); ``{task}`` is replaced by a
            "Current task: ..." line (see `build_prompt`).
        counter: Token counter; must be the history's own (the default), since the
            history's cached counts were made with it.
        reserve_output_tokens: Tokens kept free for the answer. ``None``: 2,048, or a quarter
            of a budget too small for that (`default_reserve_output_tokens`); an explicit
            value must be smaller than `max_tokens`.
        strategy: How `prune_if_needed` shrinks the history: a synchronous `PruningStrategy`,
            or a `SummarizeOldest` step when old units should be summarized (by a model, say)
            rather than only elided or dropped. Defaults to eliding old tool results, then
            dropping the oldest units.
        prune_target: When pruning, shrink the history to this fraction of its budget, so that
            the next steps do not each prune again.
        prompt_format: How the client sends the prompt (`agent_flow.llm.base.prompt_format_of`
            reads a client's); the budget counts that rendering. ``None``: native, as is.
        environment_placement: Where the rendered environment goes: ``"system"``, at the
            template's ``{environment}``; ``"last"``, in a system message of its own after
            the history, so that a provider's prompt cache serves everything before it (see
            `agent_flow._prompt_environment`).
    """

    def __init__(
        self,
        environment: Environment,
        history: History,
        max_tokens: int,
        *,
        environment_allocation: float = DEFAULT_ENVIRONMENT_ALLOCATION,
        system_prompt_template: str = DEFAULT_SYSTEM_PROMPT_TEMPLATE,
        counter: TokenCounter | None = None,
        reserve_output_tokens: int | None = None,
        strategy: PruningStrategy | SummarizeOldest | None = None,
        prune_target: float = DEFAULT_PRUNE_TARGET,
        prompt_format: PromptFormat | None = None,
        environment_placement: EnvironmentPlacement = DEFAULT_ENVIRONMENT_PLACEMENT,
    ) -> None:
        if max_tokens <= 0:
            raise UserError(f"max_tokens must be positive, got {max_tokens}")
        if reserve_output_tokens is None:
            reserve_output_tokens = default_reserve_output_tokens(max_tokens)
        if not 0.0 <= environment_allocation <= 1.0:
            raise UserError(
                f"environment_allocation must be between 0 and 1, got {environment_allocation}"
            )
        if reserve_output_tokens < 0 or reserve_output_tokens >= max_tokens:
            raise UserError(
                f"reserve_output_tokens must be in [0, max_tokens={max_tokens}), "
                f"got {reserve_output_tokens}"
            )
        if not 0.0 < prune_target <= 1.0:
            raise UserError(f"prune_target must be in (0, 1], got {prune_target}")
        self.environment = environment
        self.history = history
        self.max_tokens = max_tokens
        self.environment_allocation = environment_allocation
        self.system_prompt_template = system_prompt_template
        if counter is not None and counter is not history.counter:
            raise UserError(
                "counter must be the history's own counter (history.counter): its entries are "
                "counted with it, and mixing two counters breaks the budget"
            )
        self.counter = history.counter
        self.reserve_output_tokens = reserve_output_tokens
        self.strategy: PruningStrategy | SummarizeOldest = (
            strategy if strategy is not None else default_strategy()
        )
        self.prune_target = prune_target
        self._tools_cache: tuple[tuple[ToolDefinition, ...], int] | None = None
        self._template_cache: dict[tuple[str, str, str], tuple[str, str, int]] = {}
        self.environment_placement = checked_placement(environment_placement)
        self._placed = PlacedEnvironment(self.counter)
        self._wire: WireCounter | None = None
        self.prompt_format = prompt_format

    def __repr__(self) -> str:
        strategy = getattr(self.strategy, "name", self.strategy)
        return (
            f"ContextManager(max_tokens={self.max_tokens}, reserve_output_tokens="
            f"{self.reserve_output_tokens}, environment_allocation={self.environment_allocation}, "
            f"system_prompt_template={self.system_prompt_template!r}, strategy={strategy!r}, "
            f"environment={self.environment!r}, history={self.history!r})"
        )

    @property
    def prompt_format(self) -> PromptFormat | None:
        """How the client sends the prompt; the budget counts that (``None``: native)."""
        return self._wire.prompt_format if self._wire is not None else None

    @prompt_format.setter
    def prompt_format(self, value: PromptFormat | None) -> None:
        if value is None or isinstance(value, NativeFormat):
            self._wire = None  # the prompt is sent as built: count it directly
        elif self._wire is None or self._wire.prompt_format is not value:
            self._wire = WireCounter(value, self.counter)

    # -- fixed costs -------------------------------------------------------------------

    def _tools_tokens(self, tools: tuple[ToolDefinition, ...]) -> int:
        cached = self._tools_cache
        if cached is not None and (
            cached[0] is tools
            or (
                len(cached[0]) == len(tools)
                and all(a is b for a, b in zip(cached[0], tools, strict=True))
            )
        ):
            return cached[1]
        count = self.counter.count_tools(tools)
        self._tools_cache = (tools, count)
        return count

    def _task(self, current_task: str | None) -> str:
        """The task named in the system prompt: `current_task`, else the environment's.

        The environment's objective is the user's whole task message, which the prompt
        already carries (in the history and the environment): its line is one line of at
        most `_TASK_LINE_CHARS` characters.
        """
        if current_task is not None:
            return current_task
        objective = " ".join(self.environment.task.objective.split())
        if len(objective) > _TASK_LINE_CHARS:
            objective = objective[: _TASK_LINE_CHARS - 2].rstrip() + " …"
        return objective

    def _template(self, current_task: str | None) -> tuple[str, str, int]:
        """Return the system text before and after the environment, and their fixed cost."""
        current_task = self._task(current_task)
        key = (self.system_prompt_template, current_task, self.environment_placement)
        cached = self._template_cache.get(key)
        if cached is not None:
            return cached
        task_line = f"Current task: {current_task}\n" if current_task else ""
        template = self.system_prompt_template.replace("{task}", task_line)
        if self.environment_placement == "last":
            # The environment has a message of its own: the marker goes, and the blank
            # lines that led to it.
            head, tail = template.replace("{environment}", "").rstrip(), ""
        elif "{environment}" in template:
            head, _, tail = template.partition("{environment}")
        else:
            head, tail = template.rstrip() + "\n\n", ""
        fixed = self.counter.count_message(ChatMessage(role="system", content=head + tail))
        if len(self._template_cache) > 64:
            self._template_cache.clear()
        self._template_cache[key] = (head, tail, fixed)
        return head, tail, fixed

    def _offer_tokens(self, current_task: str | None, tools: tuple[ToolDefinition, ...]) -> int:
        """Return what offering `tools` costs, as the prompt format sends them."""
        if self._wire is None:
            return self._tools_tokens(tools)
        head, tail, _ = self._template(current_task)
        return self._wire.tools_cost(head + tail, tools)

    def fixed_tokens(
        self, *, current_task: str | None = None, tools: Sequence[ToolDefinition] = ()
    ) -> int:
        """Return the tokens every prompt pays before environment and history.

        The system prompt template (with its task line), the tool schemas and the reply
        priming. The budget left for environment and history is ``max_tokens -
        reserve_output_tokens - fixed_tokens(...)``.

        Args:
            current_task: As in `build_prompt`.
            tools: The tool schemas offered.
        """
        return (
            self._template(current_task)[2]
            + self._offer_tokens(current_task, tuple(tools))
            + REPLY_PRIMING_TOKENS
        )

    def _usable(self, current_task: str | None, tools: tuple[ToolDefinition, ...]) -> int:
        available = self.max_tokens - self.reserve_output_tokens
        usable = available - self.fixed_tokens(current_task=current_task, tools=tools)
        if usable < 0:
            template_tokens = self._template(current_task)[2]
            tools_tokens = self._offer_tokens(current_task, tools)
            part, size = (
                ("tools", tools_tokens)
                if tools_tokens >= template_tokens
                else ("system_prompt", template_tokens)
            )
            raise ContextBudgetError(
                f"the fixed parts of the prompt need {available - usable} tokens but the budget "
                f"leaves {available} (max_tokens {self.max_tokens} minus reserve "
                f"{self.reserve_output_tokens}); the largest, {part}, is {size} tokens: shorten "
                f"it or raise max_tokens by at least {-usable}",
                part=part,
                needed=available - usable,
                available=available,
            )
        return usable

    # -- environment -------------------------------------------------------------------

    def _place_environment(
        self, head: str, tail: str, template_tokens: int, budget: int
    ) -> tuple[str, int, bool]:
        """The environment rendered to cost at most `budget` tokens in its place.

        `head` and `tail` are the system template's text around it, `template_tokens` their
        cost as the system message.

        Returns:
            Its text, what it adds to the prompt, and whether it had to shrink.
        """
        placed, environment = self._placed, self.environment
        last = self.environment_placement == "last"
        room = budget - placed.message_overhead() if last else budget
        for _ in range(5):
            text, tokens, degraded = placed.text(environment, room)
            if last:
                cost = placed.own_message_tokens(text, tokens)
            else:
                cost = placed.system_tokens(head, text, tokens, tail) - template_tokens
            # Tokens can merge across the seams of template and environment; shrink until exact.
            if cost <= budget:
                return text, cost, degraded
            room -= cost - budget
        return "", 0, True

    # -- prompts -----------------------------------------------------------------------

    def _history_costs(self, units: Sequence[Unit]) -> tuple[list[int] | None, int, int]:
        """Return each unit's cost as sent (``None``: its own count), the total, the pinned."""
        if self._wire is None:
            return None, self.history.token_count(), self.history.pinned_token_count()
        costs = self._wire.unit_costs(units)
        pinned = sum(costs[i] for i in self.history.pinned_indices())
        return costs, sum(costs), pinned

    def history_budget(
        self, *, current_task: str | None = None, tools: Sequence[ToolDefinition] = ()
    ) -> int:
        """Return the tokens the history may use when the environment takes its full share."""
        usable = self._usable(current_task, tuple(tools))
        env_share = int(usable * self.environment_allocation)
        text, tokens = self._placed.full(self.environment)
        if self.environment_placement == "last":
            tokens = self._placed.own_message_tokens(text, tokens)
        return usable - min(tokens, env_share)

    def build_prompt(
        self, current_task: str | None = None, *, tools: Sequence[ToolDefinition] = ()
    ) -> Prompt:
        """Assemble the prompt: the system message, the history, and the environment in its place.

        The environment is inside the system message, or a system message of its own after
        the history (``environment_placement="last"``; none when it renders empty).

        Args:
            current_task: The task the system message names (``{task}`` becomes
                "Current task: ..."); ``None``: the environment's task objective; ``""``: no
                task line.
            tools: The tool schemas offered with this prompt (their cost is a fixed cost).

        Returns:
            The prompt, whose counted size (as the prompt format sends it) never exceeds
            ``max_tokens - reserve_output_tokens``.

        Raises:
            ContextBudgetError: The system template, the tools or the pinned history alone
                do not fit.
        """
        tool_tuple = tuple(tools)
        usable = self._usable(current_task, tool_tuple)
        head, tail, template_tokens = self._template(current_task)
        units = self.history.units()
        costs, history_tokens, pinned_tokens = self._history_costs(units)
        if pinned_tokens > usable:
            raise ContextBudgetError(
                f"the pinned history (first user message and summaries) needs {pinned_tokens} "
                f"tokens but only {usable} are left after the system prompt and tools; shorten "
                f"the task message or raise max_tokens by at least {pinned_tokens - usable}",
                part="pinned_history",
                needed=pinned_tokens,
                available=usable,
            )

        # The environment may take its share, or more when the history leaves room.
        env_share = int(usable * self.environment_allocation)
        env_budget = min(max(env_share, usable - history_tokens), usable - pinned_tokens)
        env_text, environment_tokens, degraded = self._place_environment(
            head, tail, template_tokens, env_budget
        )
        last = self.environment_placement == "last"
        system = ChatMessage(role="system", content=head + tail if last else head + env_text + tail)
        trailer = ChatMessage(role="system", content=env_text) if last and env_text else None

        history_budget = usable - environment_tokens
        everything = history_tokens <= history_budget
        chosen: Sequence[Unit]
        if everything:
            chosen, sent_tokens = units, history_tokens
        else:
            chosen, sent_tokens = select_units(
                units, self.history.pinned_indices(), pinned_tokens, history_budget, costs
            )

        tools_tokens = self._offer_tokens(current_task, tool_tuple)
        if self._wire is None:
            history_messages = (
                self.history.to_messages()
                if everything
                else [m for u in chosen for m in u.messages]
            )
            fixed = template_tokens + tools_tokens + REPLY_PRIMING_TOKENS
            total = fixed + environment_tokens + sent_tokens
        else:
            chosen = list(chosen)
            system, trailer, total = self._fit_on_wire(
                system, trailer, chosen, tool_tuple, head + tail
            )
            if env_text and (trailer is None if last else system.content == head + tail):
                env_text, degraded, environment_tokens = "", True, 0
            history_messages = [m for u in chosen for m in u.messages]
            # The remainder, so that the parts add up to the exact count of what is sent. Texts
            # joined in the system message can cost a token less than apart: that comes off
            # the tools prompt (then the environment) rather than making the history negative.
            sent_tokens = (
                total - template_tokens - environment_tokens - tools_tokens - REPLY_PRIMING_TOKENS
            )
            if sent_tokens < 0:
                tools_tokens += sent_tokens
                environment_tokens += min(0, tools_tokens)
                tools_tokens, sent_tokens = max(0, tools_tokens), 0
        breakdown = PromptBreakdown(
            budget=self.max_tokens,
            reserve=self.reserve_output_tokens,
            system_template=template_tokens,
            environment=environment_tokens,
            tools=tools_tokens,
            history=sent_tokens,
            priming=REPLY_PRIMING_TOKENS,
            total=total,
            environment_degraded=degraded,
            history_units_sent=len(chosen),
            history_units_omitted=len(units) - len(chosen),
        )
        return Prompt(
            messages=(system, *history_messages, trailer)
            if trailer is not None
            else (system, *history_messages),
            tools=tool_tuple,
            total_tokens=total,
            breakdown=breakdown,
        )

    def _fit_on_wire(
        self,
        system: ChatMessage,
        trailer: ChatMessage | None,
        chosen: list[Unit],
        tools: tuple[ToolDefinition, ...],
        template_text: str,
    ) -> tuple[ChatMessage, ChatMessage | None, int]:
        """Count the rendered prompt exactly; leave out units (then the environment) until it fits.

        The estimate counts each unit rendered alone; the rendered prompt merges neighbours and
        joins texts, which can shift a count by a few tokens either way. This makes the
        invariant exact. `chosen` is shortened in place.

        Returns:
            The system message, the environment's own message (``None``: left out, or in the
            system message), and the exact count of the prompt as sent.
        """
        assert self._wire is not None
        available = self.max_tokens - self.reserve_output_tokens
        while True:
            messages = [system, *(m for u in chosen for m in u.messages)]
            if trailer is not None:
                messages.append(trailer)
            total = self._wire.count(messages, tools)
            if total <= available:
                return system, trailer, total
            oldest = next((i for i, unit in enumerate(chosen) if not unit.pinned), None)
            if oldest is not None:
                del chosen[oldest]
            elif trailer is not None:
                trailer = None
            elif system.content != template_text:
                system = ChatMessage(role="system", content=template_text)
            else:
                raise ContextBudgetError(
                    f"the prompt as sent needs {total} tokens with only the system prompt, the "
                    f"tools and the pinned history, but the budget leaves {available} (max_tokens "
                    f"{self.max_tokens} minus reserve {self.reserve_output_tokens}); raise "
                    f"max_tokens by at least {total - available}",
                    part="fixed_costs",
                    needed=total,
                    available=available,
                )

    async def prune_if_needed(
        self, *, current_task: str | None = None, tools: Sequence[ToolDefinition] = ()
    ) -> PruneReport | None:
        """Prune the history with the strategy when it exceeds its budget.

        The history is shrunk to ``prune_target`` of its budget, so pruning happens once in a
        while rather than at every step. A synchronous `PruningStrategy` is applied directly;
        a `SummarizeOldest` step is awaited, since its summarizer may call a model. With a
        prompt format that renders the history larger than it counts as stored (XML tool
        mode), the target is scaled to the stored counts, and pruning repeats (a few times at
        most) while the rendered history still exceeds its budget.

        Returns:
            The strategy's report (one report of every round, when it took several), or None
            when the history already fits.

        Raises:
            ModelError: A summarizing step's model failed.
            CostLimitError: A summarizing step's call was refused by the running agent's cost
                limit (that step leaves the history as it was).
        """
        budget = self.history_budget(current_task=current_task, tools=tools)
        _, sent, _ = self._history_costs(self.history.units())
        if sent <= budget:
            return None
        target = int(budget * self.prune_target)
        if self._wire is None:
            return await self._prune(target)
        reports: list[PruneReport] = []
        for _ in range(_MAX_PRUNE_ROUNDS):
            # The strategies count the history as stored: aim at the stored size whose
            # rendering fits the target.
            stored = self.history.token_count()
            report = await self._prune(target * stored // sent if sent else target)
            reports.append(report)
            _, sent, _ = self._history_costs(self.history.units())
            if sent <= budget or not report.changed:
                break
        return reports[0] if len(reports) == 1 else _rounds_report(reports)

    async def _prune(self, target: int) -> PruneReport:
        if isinstance(self.strategy, SummarizeOldest):
            return await self.history.fold(self.strategy, target)
        return self.history.prune(self.strategy, target)


def _rounds_report(reports: Sequence[PruneReport]) -> PruneReport:
    """One report for several rounds of pruning, from the first's start to the last's end."""
    first, last = reports[0], reports[-1]
    summary_ids = [r.summary_id for r in reports if r.summary_id is not None]
    return PruneReport(
        strategy=first.strategy,
        tokens_before=first.tokens_before,
        tokens_after=last.tokens_after,
        max_tokens=last.max_tokens,
        dropped=tuple(i for r in reports for i in r.dropped),
        elided=tuple(i for r in reports for i in r.elided),
        summarized=tuple(i for r in reports for i in r.summarized),
        summary_id=summary_ids[-1] if summary_ids else None,
        fits=last.fits,
        steps=tuple(reports),
    )
