"""The events of a model call that is retried (part of the `agent_flow.events` union).

Defined here to keep `agent_flow.events` small; import them from `agent_flow.events`.
"""

from __future__ import annotations

from typing import Literal

from agent_flow._event_base import _Event

__all__ = ["ModelOutputDiscarded", "ModelRetrying"]


class ModelRetrying(_Event):
    """A model call failed and is tried again after `delay` seconds (one event per retry).

    ``attempt`` is the attempt that failed, of at most ``max_attempts``.
    """

    kind: Literal["model_retrying"] = "model_retrying"
    iteration: int
    attempt: int
    max_attempts: int
    delay: float
    reason: str


class ModelOutputDiscarded(_Event):
    """The deltas streamed by an abandoned model attempt are void: drop them.

    Published before the `ModelRetrying` of that attempt; ``text`` is the text that was
    streamed (a consumer joining `TextDelta` texts removes this much).
    """

    kind: Literal["model_output_discarded"] = "model_output_discarded"
    iteration: int
    attempt: int
    text: str
