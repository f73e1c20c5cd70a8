"""The environment's text in a prompt: rendered within a budget, and what it costs where it goes.

Private to `agent_flow.context`. A `ContextManager` places the rendered environment in one of
two places (``environment_placement``):

- ``"system"`` (the default): inside the system message, where the template's
  ``{environment}`` marker is. Every change to the environment changes the first message,
  so a provider's prompt cache (OpenAI, DeepSeek, Gemini, vLLM and llama.cpp all cache by
  exact prefix) can serve no more of the next prompt than the tools and the template's text
  before the marker.
- ``"last"``: in a system message of its own after the history, the template's marker left
  out. The system message and the history before the newest step are then the same from one
  prompt to the next (until the history is pruned), so the cache serves all of them and only
  the new step and the environment are billed and computed in full. The model reads the
  environment right before it answers. Some chat templates accept a system message only
  first (Gemma's, some Mistral ones): keep ``"system"`` for models served with those.

`PlacedEnvironment` keeps the renderings one environment version needs (the full text, and
texts shrunk to a budget) and counts what each costs in its place.
"""

from __future__ import annotations

from typing import Final, Literal, TypeAlias

from agent_flow.environment import Environment
from agent_flow.errors import UserError
from agent_flow.messages import ChatMessage
from agent_flow.tokens import TOKENS_PER_MESSAGE, BaseTokenCounter, TokenCounter, splits_at_headings

__all__ = ["PLACEMENTS", "EnvironmentPlacement", "PlacedEnvironment", "checked_placement"]

#: Where the rendered environment goes in a prompt (see the module).
EnvironmentPlacement: TypeAlias = Literal["system", "last"]
PLACEMENTS: Final[tuple[EnvironmentPlacement, ...]] = ("system", "last")

# Large enough that the environment never degrades when only its full size is wanted.
_UNBOUNDED = 1 << 40


def checked_placement(value: object) -> EnvironmentPlacement:
    """`value` if it names a placement, else a `UserError` listing them."""
    for placement in PLACEMENTS:
        if value == placement:
            return placement
    raise UserError(f"environment_placement must be one of {PLACEMENTS}, got {value!r}")


def _base_message_rules(counter: TokenCounter) -> bool:
    """Whether `counter` counts a message as its content plus `TOKENS_PER_MESSAGE`."""
    return type(counter).count_message is BaseTokenCounter.count_message


class PlacedEnvironment:
    """The rendered environment of one `ContextManager` and its cost in the prompt.

    Each method takes the environment (a manager's ``environment`` attribute may be
    replaced); renderings are remembered for one environment and version at a time.

    Args:
        counter: The manager's token counter.
    """

    def __init__(self, counter: TokenCounter) -> None:
        self.counter = counter
        self._full: tuple[Environment, int, str, int] | None = None
        self._shrunk: dict[tuple[int, int], tuple[str, int]] = {}
        # The system template's text before the environment → its count.
        self._head_tokens: dict[str, int] = {}

    def full(self, environment: Environment) -> tuple[str, int]:
        """The environment rendered whole, and its tokens (remembered per version)."""
        version = environment.version
        known = self._full
        if known is None or known[0] is not environment or known[1] != version:
            # The report carries the text's count: no second pass of the tokenizer over it.
            report = environment.render_report(_UNBOUNDED, self.counter)
            known = self._full = (environment, version, report.text, report.tokens)
            self._shrunk.clear()
        return known[2], known[3]

    def text(self, environment: Environment, budget: int) -> tuple[str, int, bool]:
        """The environment rendered within `budget` tokens, its tokens, and whether it shrank."""
        text, tokens = self.full(environment)
        if tokens <= budget:
            return text, tokens, False
        key = (environment.version, budget)
        shrunk = self._shrunk.get(key)
        if shrunk is None:
            report = environment.render_report(max(budget, 0), self.counter)
            shrunk = (report.text, report.tokens)
            if len(self._shrunk) > 32:
                self._shrunk.clear()
            self._shrunk[key] = shrunk
        return shrunk[0], shrunk[1], True

    def message_overhead(self) -> int:
        """What a message of its own adds to the text's tokens, as far as known beforehand."""
        return TOKENS_PER_MESSAGE if _base_message_rules(self.counter) else 0

    def own_message_tokens(self, text: str, tokens: int) -> int:
        """What the environment costs as a message of its own (none when the text is empty)."""
        if not text:
            return 0
        if _base_message_rules(self.counter):
            return TOKENS_PER_MESSAGE + tokens
        return self.counter.count_message(ChatMessage(role="system", content=text))

    def system_tokens(self, head: str, text: str, tokens: int, tail: str) -> int:
        """What the system message ``head + text + tail`` costs.

        With a counter that splits at headings (`splits_at_headings`) and counts messages by
        the base rules, the environment's count is reused: every block of it starts with
        ``## `` after a line break, so only the template around it and the seam with what
        follows it (the last block and `tail`) are counted. Otherwise, the whole message.
        """
        counter = self.counter
        if not (
            text
            and (not head or head.endswith("\n"))
            and splits_at_headings(counter)
            and _base_message_rules(counter)
        ):
            return counter.count_message(ChatMessage(role="system", content=head + text + tail))
        head_tokens = self._head_tokens.get(head)
        if head_tokens is None:
            if len(self._head_tokens) > 64:
                self._head_tokens.clear()
            head_tokens = self._head_tokens[head] = counter.count(head)
        content = head_tokens + tokens
        if tail:
            # Blocks are joined by a blank line and hold none: the last starts after the last.
            last = text[text.rfind("\n\n") + 2 :] if "\n\n" in text else text
            content += counter.count(last + tail) - counter.count(last)
        return TOKENS_PER_MESSAGE + content
