r"""Text JSON can carry and UTF-8 cannot: lone surrogates, mended where text comes in.

A JSON string may hold any UTF-16 code unit as an escape (``"\ud83d"``), and Python's JSON
reader turns one into a lone surrogate in a `str`. No UTF-8 encoder takes it: an event, a
history entry or a stored session holding one could never be written, and a run would die
with its session unsaved. That happens for real: a server that cuts a stream between the two
halves of an emoji sends each half escaped in its own chunk, and a tool that lists files with
undecodable names returns them escaped the same way (``surrogateescape``).

`mend` joins each pair of halves into the character they make and replaces a lone half with
U+FFFD; `Mender` does it for a stream's pieces, holding a first half that ends one piece for
the next. The model's answers (`agent_flow.agent._model_call`), tool results
(`agent_flow.tools.results.mended`) and user messages are mended where they enter a run.
Text that is ASCII, or holds no surrogate, is returned as it is (one C scan).
"""

from __future__ import annotations

import re
from typing import Final

from agent_flow._types import JsonValue

__all__ = [
    "Mender",
    "first_surrogate",
    "is_clean",
    "json_is_clean",
    "mend",
    "mend_json",
    "unclean_path",
]

_SURROGATE: Final = re.compile("[\ud800-\udfff]")
_FIRST_HALVES: Final = ("\ud800", "\udbff")  # a high surrogate: the first of a pair


def is_clean(text: str) -> bool:
    """Whether `text` holds no surrogate (then UTF-8 can encode it)."""
    return text.isascii() or _SURROGATE.search(text) is None


def first_surrogate(text: str) -> int | None:
    """The index of the first surrogate in `text`, or None when it holds none."""
    found = None if text.isascii() else _SURROGATE.search(text)
    return None if found is None else found.start()


def mend(text: str) -> str:
    """`text` with surrogate pairs joined and lone surrogates replaced by U+FFFD."""
    if is_clean(text):
        return text
    return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")


def json_is_clean(value: JsonValue) -> bool:
    """Whether no string in `value` (keys included) holds a surrogate."""
    if isinstance(value, str):
        return is_clean(value)
    if isinstance(value, list):
        return all(map(json_is_clean, value))
    if isinstance(value, dict):
        return all(is_clean(key) and json_is_clean(item) for key, item in value.items())
    return True


def unclean_path(value: object) -> list[str | int] | None:
    """Where the first string (or key) holding a surrogate is in `value`; None if nowhere.

    The path is of keys and list indexes (a key that holds one is its own path's end).
    """
    if isinstance(value, str):
        return None if is_clean(value) else []
    if isinstance(value, list | tuple):
        for index, item in enumerate(value):
            found = unclean_path(item)
            if found is not None:
                return [index, *found]
    elif isinstance(value, dict):
        for key, item in value.items():
            found = [] if isinstance(key, str) and not is_clean(key) else unclean_path(item)
            if found is not None:
                return [key, *found]
    return None


def mend_json(value: JsonValue) -> JsonValue:
    """`value` with every string in it (keys included) mended."""
    if isinstance(value, str):
        return mend(value)
    if isinstance(value, list):
        return [mend_json(item) for item in value]
    if isinstance(value, dict):
        return {mend(key): mend_json(item) for key, item in value.items()}
    return value


class Mender:
    """Mends the pieces of one stream of text as they arrive.

    A piece that ends with the first half of a pair keeps it back: the next piece may start
    with the second half. The pieces mended add up to the whole text mended.
    """

    __slots__ = ("_held",)

    def __init__(self) -> None:
        self._held = ""

    def feed(self, piece: str) -> str:
        """The part of `piece` that can be passed on now, mended ("" while one is held)."""
        if not self._held and is_clean(piece):
            return piece
        piece, self._held = self._held + piece, ""
        if piece and _FIRST_HALVES[0] <= piece[-1] <= _FIRST_HALVES[1]:
            piece, self._held = piece[:-1], piece[-1]
        return mend(piece)

    def flush(self) -> str:
        """What is held back at the stream's end: a lone first half, as U+FFFD."""
        held, self._held = self._held, ""
        return mend(held)
