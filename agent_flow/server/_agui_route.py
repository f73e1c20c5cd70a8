"""``POST /agui``: one AG-UI run of a thread's session, streamed as AG-UI events.

The thread id is the session id (a session is created for a new thread). Everything the run
input brings is taken while the session is held and claimed for the run (`SessionManager.send`
with a starter), so it lands in the state the run starts from and never in another run's:

1. the client's ``state``, by the rule of `agent_flow.server._agui_state` (written, or not
   applied and said so, or 422 ``invalid_state``);
2. a new thread's earlier messages, as its history (`seed_entries`);
3. ``context``, at ``/knowledge/extra/client_context``;
4. the front end's ``tools``, registered for this run beside the server's tools and under the
   same policy, unregistered when it ends (a call of one ends the run with the call handed to
   the client);
5. the answers to the calls the last run handed over (tool messages), given to the run first
   (`DeferredResults`), then the new user message.

A client that declares the tool ``approve_tool_call`` answers approvals itself: its runs hand
each call that needs approval over (``defer_approvals``) as a call of that tool. Other runs wait
for the answer on ``POST /sessions/{id}/approvals/{call_id}``, as runs started by
``POST /sessions/{id}/messages`` do.
"""

from __future__ import annotations

from collections.abc import Coroutine, Mapping
from typing import TYPE_CHECKING

from ag_ui.core import CustomEvent
from fastapi.responses import StreamingResponse

from agent_flow._unicode import unclean_path
from agent_flow.agent import AgentExecutor, DeferredResults, ExecutionOutcome
from agent_flow.errors import UserError
from agent_flow.server._agui import AgUiInput, AgUiRun
from agent_flow.server._agui_input import (
    FrontendTool,
    Turn,
    frontend_tools,
    read_turn,
    seed_entries,
    write_context,
)
from agent_flow.server._agui_state import (
    SECTIONS,
    StatePlan,
    agui_state,
    apply_client_state,
    plan_client_state,
)
from agent_flow.server._errors import ApiError
from agent_flow.server.models import CreateSession
from agent_flow.tools import ExternalTool, ToolExecutor

if TYPE_CHECKING:
    from agent_flow.server._auth import User
    from agent_flow.server._manager import SessionManager
    from agent_flow.server.settings import ServerSettings

__all__ = ["agui_run"]


async def agui_run(
    manager: SessionManager,
    settings: ServerSettings,
    body: AgUiInput,
    *,
    user: User,
    owner: str | None,
    trace: Mapping[str, str],
) -> StreamingResponse:
    """Start the run `body` asks for and return its AG-UI event stream (see the module doc).

    Raises:
        ApiError: 422 for an input that cannot be taken (messages, tools, state), 404 for
            another user's thread, 409 while the thread runs, 503 at shutdown.
    """
    _refuse_surrogates(body)
    turn = read_turn(body)
    thread = body.thread_id
    if manager.loaded(thread) is None:
        try:
            await manager.info(thread)
        except ApiError:
            # A copy for lists: PostgreSQL's text columns take no NUL (the message keeps it).
            title = (turn.text or "AG-UI thread")[:80].replace("\x00", "\ufffd")
            try:
                await manager.create(CreateSession(session_id=thread, title=title), owner=owner)
            except ApiError as err:
                if err.code != "session_exists":  # made meanwhile by another request
                    raise
    await manager.resume(thread, user)
    live = await manager.live(thread, user)
    subscription = live.bus.subscribe(
        policy="wait", maxsize=settings.watcher_queue, max_wait=settings.watcher_max_wait
    )
    runs: list[AgUiRun] = []

    def start(agent: AgentExecutor, run_id: str) -> Coroutine[object, None, ExecutionOutcome]:
        run, coroutine = _prepare(agent, run_id, body, turn)
        runs.append(run)
        return coroutine

    try:
        agent_run_id, _ = await manager.send(thread, turn.text or "", trace=trace, start=start)
    except BaseException:
        await subscription.aclose()
        raise
    return StreamingResponse(
        runs[0].stream(subscription, agent_run_id),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache"},
    )


def _refuse_surrogates(body: AgUiInput) -> None:
    r"""422 for a text anywhere in the input holding a lone surrogate (UTF-8 cannot carry it).

    JSON may escape one (``"\ud800"``), and no event, entry or store could hold it: seeded
    into the history it would fail every later run of the session.
    """
    where = unclean_path(body.model_dump(mode="python", by_alias=True))
    if where is not None:
        field = ".".join(map(str, where))
        raise ApiError(
            422,
            "invalid_field",
            f"{field}: the text holds a lone UTF-16 surrogate (an escape such as \\ud800 "
            "without its pair), which UTF-8 cannot carry; send the text whole",
            field=field,
        )


def _prepare(
    agent: AgentExecutor, run_id: str, body: AgUiInput, turn: Turn
) -> tuple[AgUiRun, Coroutine[object, None, ExecutionOutcome]]:
    """Check everything the input brings, then write it and start the run (or write nothing)."""
    new_thread = len(agent.history) == 0
    server_tools = [
        name
        for name, registered in agent.tools.tools.items()
        if not isinstance(registered.tool, FrontendTool)
    ]
    tools = frontend_tools(body, server_tools)
    external = {tool.name for tool in tools} | {
        name
        for name, r in agent.tools.tools.items()
        if isinstance(r.tool, ExternalTool) and not isinstance(r.tool, FrontendTool)
    }
    state = agui_state(agent.environment)
    plan = plan_client_state(
        {section: state[section] for section in SECTIONS}, agent.environment.version, body.state
    )
    answers = None if new_thread else _answers(agent, turn, external)
    if turn.text is None and (new_thread or answers is None):
        raise ApiError(
            422,
            "invalid_field",
            "messages holds no new user message after the last assistant message"
            + ("" if new_thread else ", and answers no call the thread waits for"),
            field="messages",
        )
    # Everything is checked (the state on a copy): now write, in the order the run sees it.
    apply_client_state(agent.environment, plan)
    if new_thread:
        for entry in seed_entries(turn.seed):
            agent.history.add(entry)
    write_context(agent.environment, body)
    _register(agent.tools, tools)
    run = AgUiRun(
        body.thread_id,
        body.run_id,
        agent.environment,
        results=answers.calls if answers is not None else (),
        approved=answers.approvals if answers is not None else (),
        approvals_in_band=turn.approvals_in_band,
        notices=_notices(plan, agent.environment.version),
    )
    try:
        if new_thread:
            assert turn.text is not None  # checked above
            coroutine = agent.run(turn.text, run_id=run_id, defer_approvals=turn.approvals_in_band)
        else:
            coroutine = agent.send(
                turn.text,
                run_id=run_id,
                results=answers,
                defer_approvals=turn.approvals_in_band,
            )
    except UserError as err:
        _register(agent.tools, [])
        raise ApiError(422, "invalid_field", str(err), field="messages") from None
    return run, _then_forget(agent.tools, coroutine)


def _answers(agent: AgentExecutor, turn: Turn, external: set[str]) -> DeferredResults | None:
    """The input's answers to the calls the thread waits for (None: it answers none).

    Raises:
        ApiError: 422 when a tool message gives the result of a call of a server tool (only
            its approval is the client's to give), or approves a front-end tool's call.
    """
    waiting = {entry.call_id: entry.call.name for entry in agent.history.pending_calls()}
    results = {k: v for k, v in turn.results.items() if k in waiting}
    approvals = {k: v for k, v in turn.approvals.items() if k in waiting}
    for call_id in results:
        if waiting[call_id] not in external:
            raise ApiError(
                422,
                "invalid_field",
                f"call {call_id!r} is a call of the server's tool {waiting[call_id]!r}: its "
                f"result is the server's; answer the approval call 'approval:{call_id}' instead",
                field="messages",
            )
    for call_id in approvals:
        if waiting[call_id] in external:
            raise ApiError(
                422,
                "invalid_field",
                f"call {call_id!r} is a call of your tool {waiting[call_id]!r}: answer it with "
                "its result, under its own id",
                field="messages",
            )
    if not results and not approvals:
        return None
    return DeferredResults(calls=results, approvals=approvals)


def _register(executor: ToolExecutor, tools: list[ExternalTool]) -> None:
    """Make `tools` the front-end tools registered in `executor` (replacing the last run's)."""
    for name, registered in executor.tools.items():
        if isinstance(registered.tool, FrontendTool):
            executor.unregister(name)
    for tool in tools:
        executor.register(tool)


async def _then_forget(
    executor: ToolExecutor, coroutine: Coroutine[object, None, ExecutionOutcome]
) -> ExecutionOutcome:
    """Run `coroutine`, then unregister the front-end tools: they are offered in AG-UI runs only."""
    try:
        return await coroutine
    finally:
        _register(executor, [])


def _notices(plan: StatePlan, version: int) -> list[CustomEvent]:
    if plan.applied:
        return []
    return [
        CustomEvent(
            name="state_not_applied",
            value={
                "client_version": plan.client_version,
                "server_version": version,
                "reason": f"your state was not applied: {plan.reason}; the snapshot before "
                "this event is the server's state",
            },
        )
    ]
