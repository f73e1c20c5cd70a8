"""The subscriptions an agent made for its current or next run (`AgentExecutor.subscribe`).

Owner: the agent. They end when that run ends (events already queued can still be read),
and with them the whole bus, when the agent made it: an agent never closes a bus it was given.
"""

from __future__ import annotations

import weakref

from agent_flow.events import EventBus, Subscription

__all__ = ["RunSubscriptions"]


class RunSubscriptions:
    """An agent's subscriptions to its run's events, held weakly (see the module).

    Args:
        bus: The agent's event bus.
        owns_bus: Whether the agent made `bus` (then the end of a run closes it).
    """

    def __init__(self, bus: EventBus, *, owns_bus: bool) -> None:
        self._bus = bus
        self._owns_bus = owns_bus
        self._refs: list[weakref.ref[Subscription]] = []

    def add(self, subscription: Subscription) -> Subscription:
        """Keep `subscription` to end with the run; return it."""
        self._refs = [ref for ref in self._refs if ref() is not None]
        self._refs.append(weakref.ref(subscription))
        return subscription

    def end(self) -> None:
        """End the subscriptions of the run that ended: the whole bus only if it is the agent's."""
        if self._owns_bus:
            self._bus.close()
        for ref in self._refs:
            subscription = ref()
            if subscription is not None:
                subscription.end()
        self._refs = []
