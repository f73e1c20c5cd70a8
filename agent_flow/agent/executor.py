"""`AgentExecutor`: an agent's parts (model, tools, context, store, bus) and its public API.

The executor is built from a config (or resumed from a stored session), offers its tools
through a `ToolFilter`, and runs one `_Run` at a time: `run` and `send` start one, `cancel`
ends it. The loop itself, step by step, is in `agent_flow.agent._loop`.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Iterable

from pydantic import BaseModel

from agent_flow.agent._build import (
    _config_streams,
    _make_counter,
    _strategy,
    tool_executor_from_config,
)
from agent_flow.agent._hooks import _EventHooks
from agent_flow.agent._loop import _Run
from agent_flow.agent.outcome import ExecutionOutcome
from agent_flow.config import AgentConfig, Skill
from agent_flow.context import DEFAULT_SYSTEM_PROMPT_TEMPLATE, ContextManager
from agent_flow.environment import Environment, TaskStatus
from agent_flow.errors import UserError
from agent_flow.events import AgentEvent, BackpressurePolicy, EventBus, Subscription
from agent_flow.history import History, UserMessage
from agent_flow.llm.base import LLMClient
from agent_flow.messages import ToolDefinition
from agent_flow.sessions import SessionStore
from agent_flow.tools import ApprovalCallback, ToolExecutor, control_tools
from agent_flow.tools.filters import LOOP_TOOL_NAMES, ToolFilter

__all__ = ["AgentExecutor"]


class AgentExecutor:
    """Runs an agent: the loop of prompt, model call, tools and environment updates.

    One run, step by step:

    1. check the stop limits (iterations, tokens, cost, cancellation);
    2. build the prompt with the ContextManager (environment + history within the budget);
    3. call the model, streaming its deltas as events when configured;
    4. record the assistant turn (thinking, text, tool calls) in the history;
    5. without tool calls: validate the final answer (output schema) or re-prompt, or finish;
    6. execute the tool calls concurrently (validated, policy-checked, timed out);
    7. apply result handlers: tool results update the Environment (events say what changed);
    8. record the results in the history; honour loop-control tools; detect a stuck model;
    9. prune the history if needed, save the step, and repeat.

    Args:
        llm: The model client.
        config: The agent's settings (defaults when omitted).
        tools: The tool executor; `tool_executor_from_config` builds one when omitted.
            Loop-control tools are registered into it when ``config.control_tools`` is on.
            MCP servers need a running connection, so ``config.mcp_servers`` are started by
            the caller (``MCPServers(...).register(agent.tools)``; the CLI does it).
        environment: The working memory (a fresh one when omitted).
        history: The transcript (a fresh one when omitted).
        context: The budgeted prompt builder; built from `config.context` when omitted.
        approval: Answers approval requests of tools that need one.
        store: Saves every completed step, so a killed process loses at most the step in
            flight (see `agent_flow.sessions`).
        session_id: The stored session to write to; a new one is created on the first run
            when omitted. `resume` fills both from a stored session.
        bus: The event bus (a fresh one when omitted).
        output_type: A pydantic model the final answer must match (JSON); overrides
            ``config.output_schema``. The outcome's ``output`` holds it as JSON data
            (`ExecutionOutcome.output_as` returns the model).
        stream: Stream model answers (deltas become events); default from the LLM config,
            else on.
    """

    def __init__(
        self,
        llm: LLMClient,
        *,
        config: AgentConfig | None = None,
        tools: ToolExecutor | None = None,
        environment: Environment | None = None,
        history: History | None = None,
        context: ContextManager | None = None,
        approval: ApprovalCallback | None = None,
        store: SessionStore | None = None,
        session_id: str | None = None,
        bus: EventBus | None = None,
        output_type: type[BaseModel] | None = None,
        stream: bool | None = None,
    ) -> None:
        self.config = config if config is not None else AgentConfig()
        self.llm = llm
        self.output_type = output_type
        self.stream = stream if stream is not None else _config_streams(self.config)
        self.events = bus if bus is not None else EventBus()
        counter, self._counter_note = _make_counter(self.config)
        if history is not None:
            # Every count must come from one counter, or the budget invariant breaks.
            counter, self._counter_note = history.counter, None
        if context is not None:
            self.context = context
        else:
            self.context = ContextManager(
                environment if environment is not None else Environment(),
                history if history is not None else History(counter=counter),
                self.config.context.max_tokens,
                environment_allocation=self.config.context.environment_allocation,
                system_prompt_template=self.config.system_prompt or DEFAULT_SYSTEM_PROMPT_TEMPLATE,
                counter=counter,
                reserve_output_tokens=self.config.context.reserve_output_tokens,
                strategy=_strategy(self.config, self.llm, counter),
                prune_target=self.config.context.prune_target,
            )
        self._base_template = self.context.system_prompt_template
        self.tools = tools if tools is not None else tool_executor_from_config(self.config)
        self._hooks = _EventHooks(self._emit)
        if approval is not None:
            self.tools.approval = approval
        if self.config.control_tools:
            for control in control_tools():
                if control.name not in self.tools:
                    self.tools.register(control)
        self.store = store
        self.session_id = session_id
        self.skill: Skill | None = None
        self._run: _Run | None = None

    @classmethod
    async def resume(
        cls,
        store: SessionStore,
        session_id: str,
        llm: LLMClient,
        *,
        config: AgentConfig | None = None,
        tools: ToolExecutor | None = None,
        approval: ApprovalCallback | None = None,
        bus: EventBus | None = None,
        output_type: type[BaseModel] | None = None,
        stream: bool | None = None,
    ) -> AgentExecutor:
        """Rebuild an agent from a stored session; continue it with `send`.

        A session stopped before its first step was saved resumes with the task it was
        created for (`SessionInfo.task`) as its first message and objective.

        Args:
            store: The session store.
            session_id: The session to continue.
            llm: The model client.
            config: The agent's settings (defaults when omitted).
            tools: As in the constructor.
            approval: As in the constructor.
            bus: As in the constructor.
            output_type: As in the constructor.
            stream: As in the constructor.

        Raises:
            SessionNotFoundError: No session has that id.
        """
        state = await store.load(session_id)
        settings = config if config is not None else AgentConfig()
        history = state.history(counter=_make_counter(settings)[0])
        environment = state.environment if state.environment is not None else Environment()
        if state.info.task and not state.entries:
            # Stopped before its first step was saved: take up the task it was created for.
            history.add(UserMessage(content=state.info.task))
            if environment.task.objective == "":
                environment.update_section(
                    "task", objective=state.info.task, status=TaskStatus.IN_PROGRESS.value
                )
        return cls(
            llm,
            config=settings,
            history=history,
            environment=environment,
            store=store,
            session_id=session_id,
            tools=tools,
            approval=approval,
            bus=bus,
            output_type=output_type,
            stream=stream,
        )

    # -- public API --------------------------------------------------------------------

    @property
    def environment(self) -> Environment:
        """The agent's working memory."""
        return self.context.environment

    @property
    def history(self) -> History:
        """The agent's transcript."""
        return self.context.history

    def subscribe(
        self,
        *,
        maxsize: int | None = None,
        policy: BackpressurePolicy = "wait",
        kinds: Iterable[str] | None = None,
    ) -> Subscription:
        """Subscribe to the events of the current or next run; see `EventBus.subscribe`.

        The subscription ends when that run ends.
        """
        return self.events.subscribe(maxsize=maxsize, policy=policy, kinds=kinds)

    def activate_skill(self, name: str | None) -> None:
        """Switch to the skill called `name` (``None``: back to the agent's own prompt).

        Raises:
            ConfigError: No skill has that name.
        """
        if name is None:
            self.skill = None
            self.context.system_prompt_template = self._base_template
            return
        self.skill = self.config.skill(name)
        template = self.skill.system_prompt
        if "{environment}" not in template:
            template = template.rstrip() + "\n\n{environment}"
        self.context.system_prompt_template = template

    def offered_tools(self) -> list[ToolDefinition]:
        """The tools the model is offered now (config allow/deny lists and the active skill)."""
        return self._tool_filter().select(self.tools.definitions())

    def _tool_filter(self) -> ToolFilter:
        return ToolFilter(
            allow=self.config.allow_tools,
            deny=self.config.deny_tools,
            always=LOOP_TOOL_NAMES if self.config.control_tools else frozenset(),
            skill=self.skill.allowed_tools if self.skill is not None else None,
        )

    async def run(self, task: str) -> ExecutionOutcome:
        """Run the agent on `task` until a stop condition; see the class docstring.

        Cancelling the task running this coroutine cancels tools in flight, closes the
        history consistently and re-raises; `cancel` instead ends the run with
        `StopReason.CANCELLED` and returns its outcome.
        """
        if self.environment.task.objective == "":
            self.environment.update_section(
                "task", objective=task, status=TaskStatus.IN_PROGRESS.value
            )
        return await self._execute(task)

    async def send(self, message: str) -> ExecutionOutcome:
        """Continue the conversation with a new user message (e.g. answering a question)."""
        return await self._execute(message)

    def cancel(self) -> None:
        """Cancel the current run: tools in flight are cancelled, `run` returns CANCELLED."""
        if self._run is not None:
            self._run.cancel()

    # -- the run -----------------------------------------------------------------------

    async def _execute(self, message: str) -> ExecutionOutcome:
        if self._run is not None:
            raise UserError("this agent is already running; await the current run first")
        run = _Run(self, run_id=uuid.uuid4().hex, task=asyncio.current_task())
        self._run = run
        try:
            return await run.execute(message)
        finally:
            self._run = None

    async def _emit(self, kind: Callable[..., AgentEvent], /, **fields: object) -> None:
        """Publish an event of the current run; without a run there is nothing to report."""
        if self._run is not None:
            await self._run.emit(kind, **fields)
