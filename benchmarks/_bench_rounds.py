"""The order in which a benchmark's variants take turns, round by round, in one process."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

__all__ = ["interleaved"]


def interleaved(names: Sequence[str], rounds: int) -> Iterator[str]:
    """Each of `names` once per round for `rounds` rounds, the order rotating from round to
    round, so that every variant meets the machine (caches, other load) as the others do."""
    names = list(names)
    for index in range(rounds):
        shift = index % len(names)
        yield from names[shift:] + names[:shift]
