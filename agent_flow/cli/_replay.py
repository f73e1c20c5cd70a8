"""`agent-flow replay SESSION`: a stored session's events rendered again, as they happened.

The events go through the same `EventRenderer` that ``agent-flow run --trace`` shows a live run
with (or, with ``--json``, the same JSON lines as ``run --json``), paced by their recorded
timestamps: the pause before each event is its gap to the previous one divided by ``--speed``
(``0``: no pauses), and never longer than ``--max-wait`` seconds, so runs of one session made
hours apart replay in moments. SESSION is a stored session's id or an export file (see
`agent_flow.cli._source`).
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Awaitable, Callable, Sequence

from agent_flow.cli._exit import EXIT_OK, _Streams
from agent_flow.cli._source import _load_session
from agent_flow.events import AgentEvent

#: Waits the given seconds (``asyncio.sleep``; tests pass one that records the pauses).
Sleep = Callable[[float], Awaitable[None]]


async def replay_events(
    events: Sequence[AgentEvent],
    render: Callable[[AgentEvent], None],
    *,
    speed: float,
    max_wait: float,
    sleep: Sleep = asyncio.sleep,
) -> float:
    """Render `events` in order, pausing before each as the recorded gap says.

    Args:
        events: The events, in the order they were saved.
        render: Called with each event (an `EventRenderer` or a `JsonLinesWriter`).
        speed: How many times faster than recorded; 0 renders everything at once.
        max_wait: The longest single pause, in seconds (after `speed`).
        sleep: How to wait.

    Returns:
        The seconds paused in all.
    """
    waited = 0.0
    previous = None
    for event in events:
        if previous is not None and speed > 0:
            gap = (event.timestamp - previous).total_seconds() / speed
            pause = min(max(gap, 0.0), max_wait)
            if pause > 0:
                await sleep(pause)
                waited += pause
        render(event)
        previous = event.timestamp
    return waited


async def _replay_command(args: argparse.Namespace, streams: _Streams) -> int:
    from agent_flow.cli.render import EventRenderer, JsonLinesWriter, make_console

    loaded = await _load_session(args.session, args)
    events = loaded.events
    span = (events[-1].timestamp - events[0].timestamp).total_seconds() if events else 0.0
    pace = "at once" if args.speed == 0 else f"at {args.speed:g}x"
    streams.stderr.write(
        f"replaying {loaded.origin} ({loaded.state.info.status}): {len(events)} events "
        f"recorded over {span:.1f} s, {pace}\n"
    )
    if args.json:
        await replay_events(
            events, JsonLinesWriter(streams.stdout), speed=args.speed, max_wait=args.max_wait
        )
        return EXIT_OK
    renderer = EventRenderer(make_console(streams.stdout))
    try:
        await replay_events(events, renderer, speed=args.speed, max_wait=args.max_wait)
    finally:
        renderer.stop_spinner()
    return EXIT_OK
