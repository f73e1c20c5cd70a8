"""`AgentExecutor`: an agent's parts (model, tools, context, store, bus) and its public API.

The executor is built from a config (`from_config`, or resumed from a stored session),
offers its tools through a `ToolFilter`, and runs one `_Run` at a time: `run` and `send`
claim one when called (so `cancel` reaches a run whose task has not started yet), `cancel`
ends it. As an async context manager it owns the resources its config names: the MCP
servers it starts on entry, and a model client `from_config` built. The loop itself, step
by step, is in `agent_flow.agent._loop`; saving is its `StepRecorder`'s job
(`agent_flow.sessions.recorder`).
"""

from __future__ import annotations

import functools
import uuid
import weakref
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping
from types import MappingProxyType, TracebackType
from typing import TYPE_CHECKING, Literal, Self

from pydantic import BaseModel

from agent_flow._utils import weak_method
from agent_flow.agent._build import (
    _config_streams,
    _make_counter,
    _strategy,
    tool_executor_from_config,
)
from agent_flow.agent._deferred import DeferredResults, check_answers
from agent_flow.agent._hooks import _EventHooks
from agent_flow.agent._loop import _Run
from agent_flow.agent._mcp import AgentMCP
from agent_flow.agent._offer import _ToolOffer
from agent_flow.agent._subscriptions import RunSubscriptions
from agent_flow.agent._task import resumed_state, set_task
from agent_flow.agent._unstarted import RunCoroutine, let_go
from agent_flow.agent.outcome import ExecutionOutcome
from agent_flow.config import AgentConfig, Skill
from agent_flow.context import ContextManager
from agent_flow.environment import Environment
from agent_flow.errors import UserError
from agent_flow.events import AgentEvent, BackpressurePolicy, EventBus, Subscription
from agent_flow.history import History
from agent_flow.llm.base import LLMClient, prompt_format_of
from agent_flow.messages import ToolDefinition
from agent_flow.pricing import preload
from agent_flow.sessions.protocol import SessionStore, StepRecorder
from agent_flow.tools import ApprovalCallback, ToolExecutor, control_tools
from agent_flow.tools.filters import ToolFilter
from agent_flow.tools.handlers import HandlerRegistry, ResultHandler

if TYPE_CHECKING:
    from agent_flow.tools.mcp import MCPServers
    from agent_flow.tools.mcp_config import MCPPromptRef

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
            The tools of ``config.mcp_servers`` join it when the agent is entered
            (``async with agent:`` or `start`) and leave it when the agent is closed. Agents
            may share one: a server another of them runs with the same config is used, not
            started again, and stops (its tools leave) when the last agent using it closes;
            each agent offers only the MCP tools its own ``config.mcp`` lets it register.
        environment: The working memory (a fresh one when omitted).
        history: The transcript (a fresh one when omitted).
        context: The budgeted prompt builder; built from `config.context` when omitted, with
            the system prompt `AgentConfig.resolved_system_prompt` gives.
        approval: Answers approval requests of this agent's tool calls (the tool executor's
            own ``approval`` answers when omitted); several agents may share one executor,
            each with its own approver.
        store: Saves every completed step, so a killed process loses at most the step in
            flight (through a `SessionRecorder`, the agent's ``recorder``; see
            `agent_flow.sessions`).
        session_id: The stored session to write to; a new one is created on the first run
            when omitted. `resume` fills both from a stored session.
        bus: An event bus to share with other agents, which this agent never closes (its
            creator does; see `agent_flow.events`). When omitted, the agent makes its own and
            closes it at the end of every run.
        output_type: A pydantic model the final answer must match (JSON); overrides
            ``config.output_schema``. The outcome's ``output`` holds it as JSON data
            (`ExecutionOutcome.output_as` returns the model).
        stream: Stream model answers (deltas become events); default from the LLM config,
            else on.
        mcp_servers: Started MCP servers shared with other agents (the application starts
            and stops them); this agent uses those ``config.mcp`` allows, besides its own
            ``config.mcp_servers``.
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
        mcp_servers: MCPServers | None = None,
    ) -> None:
        self.config = config if config is not None else AgentConfig()
        self.llm = llm
        self.output_type = output_type
        self.stream = stream if stream is not None else _config_streams(self.config)
        self.events = bus if bus is not None else EventBus()
        self._subscriptions = RunSubscriptions(self.events, owns_bus=bus is None)
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
                system_prompt_template=self.config.resolved_system_prompt(),
                counter=counter,
                reserve_output_tokens=self.config.context.reserve_output_tokens,
                strategy=_strategy(self.config, self.llm, counter),
                prune_target=self.config.context.prune_target,
                environment_placement=self.config.context.environment_placement,
            )
        # The budget counts the prompt as this client sends it (XML tool mode rewrites it).
        self.context.prompt_format = prompt_format_of(llm)
        self._base_template = self.context.system_prompt_template
        self.tools = tools if tools is not None else tool_executor_from_config(self.config)
        self.tools.count_with(counter)  # one tokenizer: results cut in the budget's tokens
        if self.config.pricing is None:
            # Model calls are priced from genai-prices' data: load it while the agent gets
            # ready, not in the event loop when the first answer arrives.
            preload()
        self._hooks = _EventHooks(self._emit)
        # The approver goes with each execute call, never onto the executor: agents sharing
        # one ToolExecutor each answer for their own calls (None: the executor's default).
        self.approval = approval
        if self.config.control_tools:
            for control in control_tools():
                if control.name not in self.tools:
                    self.tools.register(control)
        #: Saves the session at step boundaries (None without a store); the loop uses only
        #: its `StepRecorder` protocol.
        self.recorder: StepRecorder | None = None
        if store is not None:
            # Imported here: the recorder imports this package (a cycle at module level).
            from agent_flow.sessions.recorder import SessionRecorder

            recorder = SessionRecorder(store, session_id)
            # A run that loses its claim on the session stops (its writes would be refused).
            recorder.cancels(self.cancel)
            self.recorder = recorder
        self.skill: Skill | None = None
        self._offer = _ToolOffer()
        self._run: _Run | None = None
        # Resources the agent owns: the MCP servers started on entry, with the names their
        # tools were registered under, and the close method of a model `from_config` built.
        self._state: Literal["new", "started", "closed"] = "new"
        self.mcp = AgentMCP(
            self.config,
            self.tools,
            shared=mcp_servers,
            current_run=weak_method(self._current_run_id, None),
        )
        self._close_llm: Callable[[], Awaitable[None]] | None = None

    @classmethod
    def from_config(
        cls,
        config: AgentConfig,
        *,
        llm: LLMClient | None = None,
        tools: ToolExecutor | None = None,
        environment: Environment | None = None,
        history: History | None = None,
        approval: ApprovalCallback | None = None,
        store: SessionStore | None = None,
        session_id: str | None = None,
        bus: EventBus | None = None,
        output_type: type[BaseModel] | None = None,
        stream: bool | None = None,
        mcp_servers: MCPServers | None = None,
    ) -> AgentExecutor:
        """Build the agent `config` describes; enter it to start its MCP servers.

        ```python
        async with AgentExecutor.from_config(load_config("agent.toml")) as agent:
            outcome = await agent.run("...")
        ```

        Args:
            config: The agent's settings.
            llm: The model client; when omitted, an `OpenAIClient` is built from
                ``config.resolved_llm()`` and the agent closes it in `aclose`.
            tools: As in the constructor.
            environment: As in the constructor.
            history: As in the constructor.
            approval: As in the constructor.
            store: As in the constructor.
            session_id: As in the constructor.
            bus: As in the constructor.
            output_type: As in the constructor.
            stream: As in the constructor.
            mcp_servers: As in the constructor.

        Raises:
            ConfigError: `llm` is omitted and the config names no model.
        """
        close_llm: Callable[[], Awaitable[None]] | None = None
        if llm is None:
            from agent_flow.llm.openai_client import OpenAIClient

            client = OpenAIClient.from_config(config.resolved_llm())
            llm, close_llm = client, client.aclose
        agent = cls(
            llm,
            config=config,
            tools=tools,
            environment=environment,
            history=history,
            approval=approval,
            store=store,
            session_id=session_id,
            bus=bus,
            output_type=output_type,
            stream=stream,
            mcp_servers=mcp_servers,
        )
        agent._close_llm = close_llm
        return agent

    async def __aenter__(self) -> Self:
        try:
            await self.start()
        except BaseException:
            await self.aclose()
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def start(self) -> None:
        """Start the MCP servers, register what the agent may use of them, and load resources.

        Servers start concurrently; the tools of those ``config.mcp`` allows (and of shared
        ones) are registered as ``<server>_<tool>`` (`mcp_tools` lists them), the resource
        tools when a server has resources, ``config.mcp.resources`` are loaded into the
        environment, and skills with an ``mcp_prompt`` get its text. ``async with agent:``
        calls this on entry.

        Raises:
            UserError: The agent was already started, or closed.
            MCPServerError: A required server could not be started (none is left running),
                or a configured resource or prompt could not be read.
            ConfigError: A configured resource or prompt names a server the agent cannot use,
                or a server of the config runs, configured differently, for another agent
                sharing the tool executor.
            DuplicateToolError: A server's tool name is already registered (by anything but
                an agent sharing the tool executor and that server).
        """
        if self._state != "new":
            raise UserError(
                f"this agent is already {self._state}; enter it (or call start) once, "
                "and build a new agent after aclose"
            )
        self._state = "started"  # taken while starting, so a second start fails at once
        if not self.mcp.needed:
            return
        try:
            await self.mcp.start(self.environment)
        except BaseException:
            if str(self._state) == "started":  # (not closed meanwhile: it may start again)
                self._state = "new"
            raise
        if str(self._state) == "closed":  # `aclose` came while they started: it found none
            await self.mcp.aclose()

    async def aclose(self) -> None:
        """Stop the MCP servers and close the model client `from_config` built.

        Their tools are unregistered from the tool executor (shared servers keep running, and
        so do servers and tools another agent sharing the tool executor still uses).
        Call it once the runs have finished; calling it again does nothing.
        """
        self._state = "closed"
        close_llm, self._close_llm = self._close_llm, None
        try:
            await self.mcp.aclose()
        finally:
            if close_llm is not None:
                await close_llm()

    @property
    def mcp_tools(self) -> Mapping[str, str]:
        """The registered names of the started MCP servers' tools, each with its server."""
        return MappingProxyType({name: server for name, (server, _) in self.mcp.registered.items()})

    async def skill_from_mcp_prompt(
        self,
        prompt: MCPPromptRef,
        *,
        name: str | None = None,
        allowed_tools: Iterable[str] = (),
        description: str = "",
    ) -> Skill:
        """Make a skill whose system prompt is an MCP server's prompt; activate it by name.

        Raises:
            ConfigError: The server is not available to this agent, or the prompt is excluded.
            MCPServerError: The server refused (unknown prompt, missing argument) or failed.
        """
        text = await self.mcp.render_prompt(prompt)
        skill = Skill(
            name=name or prompt.name,
            system_prompt=text,
            allowed_tools=tuple(allowed_tools),
            description=description,
        )
        self.mcp.skills[skill.name] = skill
        return skill

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
        settings = config if config is not None else AgentConfig()
        history, environment = resumed_state(await store.load(session_id), settings)
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

    @property
    def handlers(self) -> HandlerRegistry:
        """The tool executor's result handlers: ``agent.handlers.register("tool", fn)`` adds one.

        The built-in ones (`HandlerRegistry.with_defaults`) keep running for the other tools.
        """
        return self.tools.handlers

    def handler(self, pattern: str) -> Callable[[ResultHandler], ResultHandler]:
        """Register the decorated function as a result handler: ``@agent.handler("tool")``."""
        return self.tools.handlers.handler(pattern)

    @property
    def store(self) -> SessionStore | None:
        """The store the agent's `SessionRecorder` saves to (None without one)."""
        from agent_flow.sessions.recorder import SessionRecorder

        return self.recorder.store if isinstance(self.recorder, SessionRecorder) else None

    @property
    def session_id(self) -> str | None:
        """The stored session this agent writes to (None without a store, or before a run)."""
        return self.recorder.session_id if self.recorder is not None else None

    @property
    def run_id(self) -> str | None:
        """The id of the run under way, or claimed by `run` / `send` (None when idle)."""
        return self._run.run_id if self._running() and self._run is not None else None

    def subscribe(
        self,
        *,
        maxsize: int | None = None,
        policy: BackpressurePolicy | None = None,
        kinds: Iterable[str] | None = None,
    ) -> Subscription:
        """Subscribe to this agent's events of its current or next run; see `EventBus.subscribe`.

        The subscription ends when that run ends (events already queued can still be read),
        also on a shared bus: other agents' events stay out, its delegated children's come in.
        """
        return self._subscriptions.add(
            self.events.subscribe(maxsize=maxsize, policy=policy, kinds=kinds, where=self._is_mine)
        )

    def _is_mine(self, event: AgentEvent) -> bool:
        run = self._run
        return run is not None and (event.run_id == run.run_id or run.run_id in event.path)

    def activate_skill(self, name: str | None) -> None:
        """Switch to the skill called `name` (``None``: back to the agent's own prompt).

        Raises:
            ConfigError: No skill has that name.
        """
        if name is None:
            self.skill = None
            self.context.system_prompt_template = self._base_template
            return
        self.skill = self.mcp.skills.get(name) or self.config.skill(name)
        template = self.skill.system_prompt
        if "{environment}" not in template:
            template = template.rstrip() + "\n\n{environment}"
        self.context.system_prompt_template = template

    def offered_tools(self) -> list[ToolDefinition]:
        """The tools the model is offered now (config allow/deny lists and the active skill)."""
        return self._offer.offered(self)

    def _tool_filter(self) -> ToolFilter:
        return self._offer.gate(self)

    def run(
        self, task: str, *, run_id: str | None = None, defer_approvals: bool = False
    ) -> Coroutine[object, None, ExecutionOutcome]:
        """Run the agent on `task` until a stop condition; see the class docstring.

        `task` becomes the environment's objective (unless the environment was prepared for
        this first run: an objective set and no history yet), the task status becomes "in
        progress", and a plan made for another objective is cleared.

        The run is claimed when `run` is called, before the returned coroutine starts: a
        `cancel` right after ``asyncio.create_task(agent.run(...))`` cancels it.

        Cancelling the task running this coroutine cancels tools in flight, closes the
        history consistently and re-raises; `cancel` instead ends the run with
        `StopReason.CANCELLED` and returns its outcome.

        `run_id` names the run (a new random id if None); a durable run passes its own, so
        that a recovered run numbers its events under the same id. With `defer_approvals`,
        a call that needs approval ends the run with `StopReason.DEFERRED`, handed to the
        caller (answer it with `send`), instead of waiting for the approver.

        Raises:
            UserError: The agent is already running, or its config names MCP servers and it
                was not entered (``async with agent:``) or started (raised by this call,
                not when awaited).
        """
        return self._claimed(task, task, run_id, None, defer_approvals)

    def send(
        self,
        message: str | None = None,
        *,
        run_id: str | None = None,
        results: DeferredResults | None = None,
        defer_approvals: bool = False,
    ) -> Coroutine[object, None, ExecutionOutcome]:
        """Continue the conversation with a new user message (e.g. answering a question).

        A task "waiting" for the user's answer goes back to "in progress". Claimed when
        called, like `run`; `run_id` and `defer_approvals` as in `run`. `results` answers
        the calls the last run handed over (`ExecutionOutcome.deferred`): they come first,
        then `message`, if any (one of the two is needed).

        Raises:
            UserError: The agent is already running, or `results` do not fit the calls
                waiting (`agent_flow.agent._deferred.check_answers`).
        """
        check_answers(self, message, results)
        return self._claimed(message, None, run_id, results, defer_approvals)

    def cancel(self) -> None:
        """Cancel the current run: tools in flight are cancelled, `run` returns CANCELLED.

        A run whose task has not started yet ends as CANCELLED as soon as it starts.
        """
        if self._running() and self._run is not None:
            self._run.cancel()

    # -- the run -----------------------------------------------------------------------

    def _claimed(
        self,
        message: str | None,
        objective: str | None,
        run_id: str | None,
        answers: DeferredResults | None,
        defer_approvals: bool,
    ) -> Coroutine[object, None, ExecutionOutcome]:
        """Claim the next run now and return the coroutine that will execute it."""
        if self._running():
            raise UserError("this agent is already running; await the current run first")
        if self.mcp.needed and self._state != "started":
            # Running without them would silently offer the model fewer tools than configured.
            names = ", ".join(server.name for server in self.config.mcp_servers) or "shared"
            raise UserError(
                f"this agent's config names MCP servers ({names}) that are not running; "
                "use `async with agent:` (or `await agent.start()`) before running it"
            )
        run = _Run(
            self, run_id or uuid.uuid4().hex, answers=answers, defer_approvals=defer_approvals
        )
        coroutine = self._execute(run, message, objective=objective)
        run.coroutine = weakref.ref(coroutine)
        self._run = run
        return RunCoroutine(coroutine, functools.partial(let_go, self, run))

    def _current_run_id(self) -> str | None:
        return self._run.run_id if self._run is not None else None

    def _running(self) -> bool:
        """Whether a run is under way, or claimed by a coroutine that may still start it."""
        if self._run is not None and self._run.lapsed():
            self._run = None
        return self._run is not None

    async def _execute(
        self, run: _Run, message: str | None, *, objective: str | None
    ) -> ExecutionOutcome:
        try:
            set_task(self.environment, self.history, objective)
            return await run.execute(message)
        finally:
            if self._run is run:
                self._run = None

    def _run_ended(self) -> None:
        """End the subscriptions of the run that ended (see `RunSubscriptions`)."""
        self._subscriptions.end()

    async def _emit(self, kind: Callable[..., AgentEvent], /, **fields: object) -> None:
        """Publish an event of the current run; without a run there is nothing to report."""
        if self._run is not None:
            await self._run.emit(kind, **fields)
