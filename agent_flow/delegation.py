"""Delegation: a child agent as a tool, with its own budget and a projected Environment.

A `Delegate` is a tool whose call runs a sub-task in a fresh child `AgentExecutor`:

```python
investigate = Delegate(
    "investigate",
    "Investigate a question about the code base and report findings.",
    llm=researcher_llm,
    tools=[read_file, grep, write_file],
    read_only=True,                                  # only the read-only tools are offered
    projection=["/task/objective", "/knowledge/discovered_facts"],
    output_type=Findings,                            # the child's typed result
    budget=ContextConfig(max_tokens=4000),           # the child's own prompt budget
)
investigate.add_to(agent)                            # the tool and its result handler
```

- **Environment.** The child's Environment holds only the parent's values at the `projection`
  pointers (a pointer absent from the parent is left out) and its sub-task, which becomes its
  ``/task/objective``. Pointers into the parent's ``/task`` land under
  ``/extensions/parent_task`` (``/task/objective`` → ``/extensions/parent_task/objective``),
  because the child's ``/task`` is its own; a mapping ``{source: target}`` puts each value
  where you say. `project_environment` is the pure function that builds it.
- **Tools and budget.** The child offers `tools` (only the read-only ones with `read_only`,
  or those `config.allow_tools` allows), has its own `ContextConfig` (`budget`, else
  ``config.context``) and its own limits (``config.max_iterations``, ...).
- **Result.** The call's `ToolResult` carries the child's answer as its content (the output as
  JSON with an `output_type`) and a `DelegationResult` as its data; the parent's result
  handlers write it into the parent's Environment like any result. `handler` (registered by
  `add_to`) appends ``{"task", "result"}`` to the list at `result_pointer` (default
  ``/knowledge/extra/<name>``); pass your own `handler` to write elsewhere. `output_of` reads
  the typed output back from a result. A child that did not finish (limits, errors) gives an
  error result saying why, and the handlers do not run.
- **One run, one tree.** The child's events reach the parent's bus with ``path`` set to the
  parent's run id (`agent_flow.agent._delegate.ChildEvents`); ``agent.subscribe()`` on the
  parent receives them; keep ``event.path == ()`` for the top level. Its model calls are
  admitted by the parent's token and cost limits and roll up into the parent's usage and cost
  (`agent_flow.agent._delegate.ParentMeter`). Cancelling the parent cancels the child (it runs
  in the parent's tool call). The parent's approver answers the child's approval requests.
- **Parallel children.** Several calls in one step run concurrently (at most
  `max_concurrency` of one `Delegate` at once), each with its own budget.
- **Durable runs.** The child is one tool step: its result is recorded when it finishes, and a
  recovery replays that result instead of running the child again, adding the child's recorded
  calls (`DelegationResult.usage_per_call`, ``cost_per_call``) to the parent's usage and cost
  as the live child did (`count_replayed`). Its own model and tool calls are not separate
  steps, but each is preceded by the parent run's cancellation check, so cancelling the durable
  run stops a child mid-run (`_ChildSteps`). A child a crash interrupted runs again from the
  start when the delegate is `read_only`, and otherwise gets an "interrupted" error result
  (`ToolPolicy.idempotent`); what it spent before the crash was not recorded and is not counted.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Generic, Protocol, TypeVar, runtime_checkable

from pydantic import BaseModel, ConfigDict

from agent_flow._checkpoints import STEP_RUNNER, StepRunner
from agent_flow._defaults import (
    DEFAULT_DELEGATION_TIMEOUT,
    DEFAULT_MAX_CONCURRENT_CHILDREN,
    DELEGATION_PARENT_TASK,
)
from agent_flow._types import JsonObject, JsonValue
from agent_flow.agent._build import counter_for
from agent_flow.agent._cost import PARENT_BUDGET
from agent_flow.agent._delegate import ChildEvents, meter_for
from agent_flow.agent._loop import CURRENT_RUN
from agent_flow.agent.executor import AgentExecutor
from agent_flow.agent.outcome import ExecutionOutcome, StopReason
from agent_flow.config import AgentConfig, ContextConfig
from agent_flow.environment import Environment
from agent_flow.environment._pointer import _parse
from agent_flow.errors import PointerError, UserError
from agent_flow.history import History
from agent_flow.llm.base import LLMClient, Usage
from agent_flow.messages import ToolCall
from agent_flow.tools import Tool, ToolContext, ToolExecutor, ToolPolicy, ToolResult
from agent_flow.tools.handlers import ResultHandler

if TYPE_CHECKING:
    from agent_flow.agent._loop import _Run

__all__ = ["Delegate", "DelegationResult", "project_environment"]

_Out = TypeVar("_Out", bound=BaseModel)

#: Stop reasons after which a child's answer is its result (the others are failures).
_FINISHED = frozenset({StopReason.COMPLETED, StopReason.ANSWERED, StopReason.CONVERSE})


class DelegationResult(BaseModel):
    """What a delegated call returns as its result's ``data``.

    Attributes:
        task: The sub-task the child was given.
        run_id: The child's run id (its events' ``run_id``).
        stop_reason: Why the child stopped (``completed`` and ``answered`` are successes).
        text: The child's final text.
        output: Its typed output as JSON, when the delegate has an ``output_type``.
        usage: The tokens the child's model calls used (already in the parent's totals).
        cost_usd: What they cost (``None``: a price was unknown).
        iterations: The child's iterations.
        usage_per_call: Each of the child's model calls' usage, its own children's included,
            in the order they were counted into the parent.
        cost_per_call: Each call's cost, in the order of `usage_per_call` (``None``: unknown).
    """

    model_config = ConfigDict(frozen=True)

    task: str
    run_id: str
    stop_reason: StopReason
    text: str
    output: JsonValue = None
    usage: Usage = Usage()
    cost_usd: float | None = None
    iterations: int = 0
    usage_per_call: tuple[Usage, ...] = ()
    cost_per_call: tuple[float | None, ...] = ()


def _targets(projection: Sequence[str] | Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """The (source, target) pointer pairs of a projection, checked."""
    pairs = (
        tuple(projection.items())
        if isinstance(projection, Mapping)
        else tuple((source, _default_target(source)) for source in projection)
    )
    for source, target in pairs:
        for pointer in (source, target):
            if not pointer.startswith("/"):
                raise UserError(
                    f"projection pointer {pointer!r} must name a part of the environment, "
                    "such as '/knowledge/discovered_facts' (the whole state cannot be projected)"
                )
            try:
                _parse(pointer)
            except PointerError as err:
                raise UserError(f"projection pointer {pointer!r} is malformed: {err}") from err
    return pairs


def _default_target(source: str) -> str:
    if source == "/task" or source.startswith("/task/"):
        return DELEGATION_PARENT_TASK + source[len("/task") :]
    return source


def project_environment(
    parent: Environment, projection: Sequence[str] | Mapping[str, str], *, task: str = ""
) -> Environment:
    """A new Environment holding only the parent's values at the `projection` pointers.

    Args:
        parent: The parent's environment (only read).
        projection: Pointers copied to the same place (those into ``/task`` under
            ``/extensions/parent_task``), or a mapping of source pointers to targets.
        task: The sub-task, set as the new environment's ``/task/objective``.

    Raises:
        UserError: A pointer is malformed or names the whole state.
    """
    return _project(parent, _targets(projection), task)


def _project(parent: Environment, pairs: Sequence[tuple[str, str]], task: str) -> Environment:
    child = Environment()
    for source, target in pairs:
        if parent.has(source):
            child.set(target, parent.get(source))
    if task:
        child.update_section("task", objective=task)
    return child


class Delegate(Generic[_Out]):
    """A tool that runs its call's sub-task in a child agent; see the module docstring.

    Args:
        name: The tool's name.
        description: What the tool does, for the parent's model.
        llm: The child's model client.
        config: The child's settings (``AgentConfig(name=name)`` when omitted).
        tools: The child's tools: a `ToolExecutor` (shared by every child of this delegate),
            or tools and functions to register in a new one.
        projection: The parent's Environment pointers the child sees (see
            `project_environment`).
        output_type: The pydantic model the child's answer must match.
        budget: The child's prompt budget (overrides ``config.context``).
        read_only: Offer the child only the tools whose policy is read-only (the loop-control
            tools stay), and let a durable recovery run an interrupted child again.
        result_pointer: Where `handler` appends ``{"task", "result"}`` in the parent's
            Environment (``/knowledge/extra/<name>`` when omitted).
        handler: A result handler for the parent that replaces the default one.
        max_concurrency: Children of this delegate running at once (None: no bound).
        timeout: Seconds a child may run, its wait for a `max_concurrency` slot included
            (``None``: the parent's tool executor's ``default_timeout``, as for any tool).
        policy: The tool's policy in the parent (read-only when `read_only`).

    Raises:
        UserError: A projection pointer is malformed, or `max_concurrency` is below 1.
    """

    parameters: JsonObject

    def __init__(
        self,
        name: str,
        description: str,
        *,
        llm: LLMClient,
        config: AgentConfig | None = None,
        tools: ToolExecutor | Iterable[Tool | Callable[..., object]] = (),
        projection: Sequence[str] | Mapping[str, str] = (),
        output_type: type[_Out] | None = None,
        budget: ContextConfig | None = None,
        read_only: bool = False,
        result_pointer: str | None = None,
        handler: ResultHandler | None = None,
        max_concurrency: int | None = DEFAULT_MAX_CONCURRENT_CHILDREN,
        timeout: float | None = DEFAULT_DELEGATION_TIMEOUT,
        policy: ToolPolicy | None = None,
    ) -> None:
        if max_concurrency is not None and max_concurrency < 1:
            raise UserError(f"max_concurrency must be at least 1 (or None), got {max_concurrency}")
        self.name = name
        self.description = description
        self.llm = llm
        self.output_type = output_type
        self.read_only = read_only
        self.projection = _targets(projection)
        self.timeout = timeout
        self.policy = policy if policy is not None else ToolPolicy(read_only=read_only)
        self.result_pointer = (
            result_pointer if result_pointer is not None else f"/knowledge/extra/{name}"
        )
        self.handler: ResultHandler = handler if handler is not None else self._append_result
        self.tools = tools if isinstance(tools, ToolExecutor) else ToolExecutor(tools)
        settings = config if config is not None else AgentConfig(name=name)
        if budget is not None:
            settings = settings.model_copy(update={"context": budget})
        self.config = settings
        # One counter for all children: building one per call would cost more than the rest.
        self._counter = counter_for(settings)
        self._slots = asyncio.Semaphore(max_concurrency) if max_concurrency else None
        self._allowed: tuple[int, tuple[str, ...] | None] | None = None
        self.parameters = {
            "type": "object",
            "properties": {
                "task": {
                    "type": "string",
                    "description": "The sub-task, stated completely: the sub-agent sees "
                    "nothing of this conversation.",
                }
            },
            "required": ["task"],
            "additionalProperties": False,
        }

    def add_to(self, agent: AgentExecutor) -> str:
        """Register this tool with `agent` and its `handler` for the name it got; return it."""
        registered = agent.tools.register(self)
        agent.handlers.register(registered, self.handler)
        return registered

    def output_of(self, result: ToolResult) -> _Out:
        """The child's typed output in a result of this tool.

        Raises:
            UserError: The delegate has no `output_type`, or `result` is not a finished
                delegation's.
        """
        if self.output_type is None:
            raise UserError(f"delegate {self.name!r} has no output_type; read result.content")
        done = DelegationResult.model_validate(result.data)
        if done.stop_reason not in _FINISHED or done.output is None:
            raise UserError(f"the child stopped ({done.stop_reason.value}) without an output")
        return self.output_type.model_validate(done.output)

    def _append_result(self, environment: Environment, call: ToolCall, result: ToolResult) -> None:
        done = DelegationResult.model_validate(result.data)
        entry: JsonObject = {
            "task": done.task,
            "result": done.output if done.output is not None else done.text,
        }
        pointer = self.result_pointer
        existing = environment.get(pointer) if environment.has(pointer) else None
        if isinstance(existing, list):
            environment.set(pointer + "/-", entry)
        else:
            environment.set(pointer, [entry])

    def _child_config(self) -> AgentConfig:
        """The child's config: with `read_only`, its allow list keeps the read-only tools."""
        if not self.read_only:
            return self.config
        version = self.tools.version
        if self._allowed is None or self._allowed[0] != version:
            names = tuple(n for n, r in self.tools.tools.items() if r.policy.read_only)
            allow = self.config.allow_tools
            if allow is not None:
                names = tuple(n for n in names if any(n == a for a in allow))
            self._allowed = (version, names)
        return self.config.model_copy(update={"allow_tools": self._allowed[1]})

    def child(self, environment: Environment, parent: _Run | None) -> AgentExecutor:
        """Build the child agent for one call (its bus feeds the parent's, if any)."""
        bus = None
        if parent is not None:
            bus = ChildEvents(parent)
        approval = None
        if parent is not None:
            approval = parent.agent.approval or parent.agent.tools.approval
        return AgentExecutor(
            self.llm,
            config=self._child_config(),
            tools=self.tools,
            environment=environment,
            history=History(counter=self._counter),
            bus=bus,
            approval=approval,
            output_type=self.output_type,
        )

    async def run(self, arguments: JsonObject, context: ToolContext) -> ToolResult:
        """Run the sub-task ``arguments["task"]`` in a child agent and return its result."""
        task = str(arguments["task"])
        parent = CURRENT_RUN.get()
        source = context.environment
        if source is None and parent is not None:
            source = parent.agent.environment
        environment = _project(source or Environment(), self.projection, task)
        if self._slots is None:
            outcome = await self._run_child(environment, parent, task)
        else:
            async with self._slots:
                outcome = await self._run_child(environment, parent, task)
        return self._result(task, outcome)

    async def _run_child(
        self, environment: Environment, parent: _Run | None, task: str
    ) -> ExecutionOutcome:
        agent = self.child(environment, parent)
        meter = meter_for(parent) if parent is not None else None
        # The child is one step of a durable parent: its own calls are not steps, but each
        # looks whether the parent run was cancelled first.
        outer = STEP_RUNNER.get()
        watch: StepRunner | None = _ChildSteps(outer) if isinstance(outer, _CancelWatch) else None
        runner = STEP_RUNNER.set(watch)
        budget = PARENT_BUDGET.set(meter) if meter is not None else None
        child_run: _Run | None = None
        try:
            # Entered first: a child whose config names MCP servers starts them here.
            async with agent:
                running = agent.run(task)
                child_run = agent._run
                return await running
        finally:
            if budget is not None:
                PARENT_BUDGET.reset(budget)
            STEP_RUNNER.reset(runner)
            if meter is not None and child_run is not None:
                meter.release(child_run)

    def _result(self, task: str, outcome: ExecutionOutcome) -> ToolResult:
        done = DelegationResult(
            task=task,
            run_id=outcome.run_id,
            stop_reason=outcome.stop_reason,
            text=outcome.final_text,
            output=outcome.output if self.output_type is not None else None,
            usage=outcome.usage,
            cost_usd=outcome.cost_usd,
            iterations=outcome.iterations,
            usage_per_call=outcome.usage_per_call,
            cost_per_call=outcome.cost_per_call,
        )
        data = done.model_dump(mode="json")
        if outcome.stop_reason not in _FINISHED:
            return ToolResult.error(
                f"the sub-agent {self.name!r} stopped before finishing "
                f"({outcome.stop_reason.value}): {outcome.final_text or 'no answer'}",
                data=data,
            )
        content = json.dumps(done.output) if done.output is not None else outcome.final_text
        return ToolResult(content=content, data=data)


@runtime_checkable
class _CancelWatch(Protocol):
    """A durable run's step runner that can say whether its run was cancelled."""

    async def check_cancelled(self) -> bool:
        """Whether the run was cancelled (it then was told to stop: its task is cancelled)."""
        ...


class _ChildSteps:
    """The step runner of a durable run's delegated child: a cancellation check, no record.

    The child is one step of its parent (its result is recorded); its own model and tool calls
    are not steps, and run directly. Before each, the parent run's cancellation is checked, so
    a durable run's cancel stops a child mid-run as it stops the parent at its next call.
    """

    # Nothing is recorded by position: the child's tool calls may run side by side.
    sequential_tools = False

    def __init__(self, watch: _CancelWatch) -> None:
        self._watch = watch

    async def check_cancelled(self) -> bool:
        """Whether the durable run was cancelled (a grandchild's steps ask through here)."""
        return await self._watch.check_cancelled()

    async def step(
        self,
        name: str,
        work: Callable[[], Awaitable[str]],
        *,
        stored_now: bool = False,
        synced: bool = True,
    ) -> str:
        """Run `work` unless the durable run was cancelled; record nothing."""
        if await self._watch.check_cancelled():
            # The run's task is cancelled: the child runs in it, and the cancellation arrives
            # here; a tool call running beside others, in a task of its own, stops cancelled.
            await asyncio.sleep(0)
            raise asyncio.CancelledError
        return await work()


def count_replayed(step: str, result: str) -> None:
    """Count a replayed delegation's child into the run that replays it, as it ran live.

    A durable engine calls this when a recovered run gets step `step`'s recorded `result`
    instead of running it. For a `Delegate`'s tool step (``tool:<name>``) whose result
    carries a `DelegationResult`, the child's recorded calls go into the current run's usage,
    cost and limits (`agent_flow.agent._delegate.ParentMeter.recount`); every other step is
    left alone (a model call's replay is counted by the loop; the event numbers a replayed
    child took are restored by the turn's own record, ``tool_turn_events``).
    """
    if not step.startswith("tool:"):
        return
    run = CURRENT_RUN.get()
    if run is None:
        return
    registered = run.agent.tools.tools.get(step.removeprefix("tool:"))
    if registered is None or not isinstance(registered.tool, Delegate):
        return
    data = ToolResult.model_validate_json(result).data
    if not isinstance(data, dict):
        return  # not a child's result: an "interrupted" call, a timeout, a tool error
    done = DelegationResult.model_validate(data)
    calls: Iterable[tuple[Usage, float | None]] = zip(
        done.usage_per_call, done.cost_per_call, strict=True
    )
    if not done.usage_per_call and done.usage != Usage():
        calls = [(done.usage, done.cost_usd)]  # recorded before results listed their calls
    meter_for(run).recount(calls)
