"""A byte-pair-encoding token counter that holds its vocabulary in about 2 MB.

`TiktokenCounter` counts with the encodings tiktoken publishes (``cl100k_base``,
``o200k_base``); tiktoken's own Rust encoder keeps three copies of every token (a map each
way and a sorted list), 22-24 MB per process for ``cl100k_base`` and 43-47 MB for
``o200k_base``. Counting needs one: `RankTable` keeps the tokens once, concatenated in rank
order in one `bytes`, with an open-addressing hash table of ranks in an `array` and the ranks
of the two-byte tokens in another (2.2 MB for ``cl100k_base``, 4.3 MB for ``o200k_base``),
built while the rank file is read line by line, so no dictionary of 100,000 Python objects is
ever made.

`BytePairCounter.count` gives exactly ``len(encoding.encode_ordinary(text))``: the text is
split with the encoding's own pattern (the ``regex`` package, which tiktoken itself depends
on; ASCII text with the same pattern reduced to ASCII, for the faster ``re``), each piece in
the vocabulary is one token, and any other piece is merged the way tiktoken merges it, always
the lowest-ranked adjacent pair first and the leftmost of equal ranks. Where tiktoken
rescans the piece after every merge (quadratic), the merge here keeps its pairs in a heap, so
a long piece (a run of 100,000 letters in a hostile tool result) costs O(n log n). Pieces are
remembered (a bounded dictionary): most of a text is pieces seen before, each then one
lookup. On text never seen before this is slower than tiktoken's Rust; on text made of pieces
seen before it is about as fast (``benchmarks/bench_counting.py``).

Exactness is tested against tiktoken (hypothesis over arbitrary Unicode, long runs and every
code point in several contexts) in ``tests/test_bpe.py``.
"""

from __future__ import annotations

import base64
import binascii
import heapq
import re
from array import array
from collections.abc import Callable, Iterable, Iterator
from typing import Final

import regex

__all__ = ["BytePairCounter", "RankTable"]

_EMPTY: Final = -1
_NO_RANK: Final = 1 << 62

# Pieces remembered per counter; cleared when full (a bounded memory, not an LRU), and
# only pieces this short (a word, a number, a run of punctuation) are remembered.
_PIECES: Final = 16_384
_PIECE_CHARS: Final = 32


class RankTable:
    """The mergeable ranks of an encoding: every token's bytes once, and its rank by hash.

    Tokens are stored in rank order, so a rank is an index into `starts`. Ranks must run
    from 0 without gaps (true of every encoding tiktoken publishes); `from_lines` refuses a
    file where they do not.
    """

    __slots__ = ("_blob", "_mask", "_pairs", "_starts", "_table", "size")

    def __init__(self, tokens: Iterable[bytes]) -> None:
        """Build the table from the tokens in rank order (rank 0 first)."""
        blob = bytearray()
        starts = array("I", [0])
        for token in tokens:
            blob += token
            starts.append(len(blob))
        self.size = len(starts) - 1
        capacity = 1
        while capacity < 2 * self.size:  # at most half full: short probe runs
            capacity *= 2
        mask = capacity - 1
        table = array("i", [_EMPTY]) * capacity
        # The rank of every two-byte token by its bytes (256 KB): the first pairs of a merge.
        pairs = array("i", [_EMPTY]) * 65536
        data = bytes(blob)
        for rank in range(self.size):
            token = data[starts[rank] : starts[rank + 1]]
            slot = hash(token) & mask
            while table[slot] != _EMPTY:
                slot = (slot + 1) & mask
            table[slot] = rank
            if len(token) == 2:
                pairs[token[0] << 8 | token[1]] = rank
        self._blob, self._starts, self._table, self._mask = data, starts, table, mask
        self._pairs = pairs

    def __reduce__(self) -> tuple[object, ...]:
        # The tokens only: the table is laid out by `hash`, whose seed is the process's own,
        # so another process (a pickle's reader) lays it out again.
        return (_rank_table, (self._blob, self._starts))

    @classmethod
    def from_lines(cls, lines: Iterable[bytes]) -> RankTable:
        """Read tiktoken's rank-file format: one ``<base64 token> <rank>`` per line.

        Raises:
            ValueError: A line is malformed, or the ranks are not 0, 1, 2, ... in order.
        """

        def tokens() -> Iterable[bytes]:
            expected = 0
            for line in lines:
                if not line.strip():
                    continue
                try:
                    token, rank = line.split()
                    found = int(rank)
                    data = base64.b64decode(token, validate=True)
                except (ValueError, binascii.Error) as error:
                    raise ValueError(
                        f"{line[:60]!r} is not a line of a rank file (<base64 token> <rank>)"
                    ) from error
                if found != expected:
                    raise ValueError(f"rank {found} where {expected} was expected")
                expected += 1
                yield data

        return cls(tokens())

    @classmethod
    def from_ranks(cls, ranks: dict[bytes, int]) -> RankTable:
        """Build the table from a ``{token: rank}`` mapping (a tiktoken constructor's).

        Raises:
            ValueError: The ranks are not 0, 1, 2, ... without gaps.
        """
        ordered = sorted(ranks.items(), key=lambda item: item[1])
        if any(rank != index for index, (_, rank) in enumerate(ordered)):
            raise ValueError("the ranks do not run from 0 without gaps")
        return cls(token for token, _ in ordered)

    def rank(self, token: bytes) -> int | None:
        """The rank of `token`, or None if it is not in the vocabulary."""
        table, starts, blob, mask = self._table, self._starts, self._blob, self._mask
        slot = hash(token) & mask
        while True:
            rank = table[slot]
            if rank == _EMPTY:
                return None
            if blob[starts[rank] : starts[rank + 1]] == token:
                return rank
            slot = (slot + 1) & mask

    def merged_length(self, data: bytes) -> int:
        """The number of tokens byte-pair merging leaves of `data` (two bytes or more).

        tiktoken's ``_byte_pair_merge`` merges the adjacent pair of parts whose joined bytes
        have the lowest rank, the leftmost of equal ranks, until no joined pair has a rank.
        The same order here: parts are a linked list by start offset, pairs wait in a heap of
        ``(rank, start)``; an entry whose part has since merged or whose pair changed is
        stale and skipped. The lookups are `rank`'s, written out (this is the hot loop of a
        text never seen before).
        """
        table, starts, blob, mask, pairs = (
            self._table,
            self._starts,
            self._blob,
            self._mask,
            self._pairs,
        )
        size = len(data)
        nexts = list(range(1, size + 1))  # the start of the next part; `size` after the last
        prevs = list(range(-1, size - 1))
        pair_rank = [_NO_RANK] * size  # the rank of part + next part, by the part's start
        heap: list[tuple[int, int]] = []
        for start in range(size - 1):
            found = pairs[data[start] << 8 | data[start + 1]]
            if found != _EMPTY:
                pair_rank[start] = found
                heap.append((found, start))
        heapq.heapify(heap)
        parts = size
        pop, push = heapq.heappop, heapq.heappush
        while heap:
            found, start = pop(heap)
            if pair_rank[start] != found:
                continue  # stale: this part merged into its left, or its pair changed
            gone = nexts[start]  # the part merged into this one
            after = nexts[start] = nexts[gone]
            pair_rank[gone] = _NO_RANK
            parts -= 1
            # The new pairs: this part with the next one, the previous part with this one.
            for left, right in (
                (start, nexts[after] if after < size else -1),
                (prevs[start], after),
            ):
                if left < 0 or right < 0:
                    if left >= 0:
                        pair_rank[left] = _NO_RANK
                    continue
                joined = data[left:right]
                slot = hash(joined) & mask
                while True:
                    rank = table[slot]
                    if rank == _EMPTY or blob[starts[rank] : starts[rank + 1]] == joined:
                        break
                    slot = (slot + 1) & mask
                if rank == _EMPTY:
                    pair_rank[left] = _NO_RANK
                else:
                    pair_rank[left] = rank
                    push(heap, (rank, left))
            if after < size:
                prevs[after] = start
        return parts

    def token(self, rank: int) -> bytes:
        """The bytes of the token of `rank`."""
        return self._blob[self._starts[rank] : self._starts[rank + 1]]

    @property
    def nbytes(self) -> int:
        """The memory its arrays hold, in bytes."""
        arrays = (self._starts, self._table, self._pairs)
        return len(self._blob) + sum(a.itemsize * len(a) for a in arrays)


class _Pieces(dict[str, int]):
    """Token counts of recently seen pieces, counted on a miss."""

    __slots__ = ("_count",)

    def __init__(self, count: Callable[[str], int]) -> None:
        super().__init__()
        self._count = count

    def __missing__(self, piece: str) -> int:
        count = self._count(piece)
        if len(piece) <= _PIECE_CHARS:
            if len(self) >= _PIECES:
                self.clear()
            self[piece] = count
        return count


class BytePairCounter:
    """Counts the tokens of a byte-pair encoding without encoding: ``len(encode_ordinary)``.

    Args:
        ranks: The encoding's mergeable ranks.
        pattern: The encoding's split pattern (tiktoken's ``pat_str``), for the ``regex``
            package.
        ascii_pattern: Optionally, the same pattern written for the standard library's
            ``re`` with every class reduced to ASCII: it must split any ASCII text as
            `pattern` does, and the encoding's pieces must never run from a line break into
            a following ASCII letter or digit, nor from a visible ASCII character into a
            space (true of ``cl100k_base`` and ``o200k_base``). ``re`` splits ASCII two to
            three times faster than ``regex`` with its Unicode classes; a text that is not
            ASCII is cut after each line break followed by an ASCII letter or digit, a long
            line of it before a space after a visible character every few thousand
            characters (`_parts`), and its ASCII parts split with it.

    Special tokens are counted as the plain text they are made of, as ``encode_ordinary``
    does. Thread-safe: the remembered pieces are a dictionary only ever added to or cleared.
    """

    __slots__ = ("_pieces", "_split", "_split_ascii", "ascii_pattern", "pattern", "ranks")

    def __init__(self, ranks: RankTable, pattern: str, *, ascii_pattern: str | None = None) -> None:
        """Count with `ranks`, splitting texts with `pattern` (`ascii_pattern` for ASCII)."""
        self.ranks = ranks
        self.pattern = pattern
        self.ascii_pattern = ascii_pattern
        self._split = regex.compile(pattern).findall
        self._split_ascii = (
            self._split if ascii_pattern is None else re.compile(ascii_pattern).findall
        )
        self._pieces = _Pieces(self._count_piece)

    def __reduce__(self) -> tuple[object, ...]:
        # The pieces seen are not kept.
        return (_rebuilt, (self.ranks, self.pattern, self.ascii_pattern))

    def count(self, text: str) -> int:
        """Return the number of tokens tiktoken encodes `text` into (as ordinary text)."""
        pieces = self._pieces.__getitem__
        if text.isascii():
            return sum(map(pieces, self._split_ascii(text)))
        if self.ascii_pattern is None:
            return sum(map(pieces, self._split(text)))
        total = 0
        for lines in _at_lines_starting_alphanumeric(text):
            if lines.isascii():
                total += sum(map(pieces, self._split_ascii(lines)))
                continue
            for part in _parts(lines):  # a long line with a few other characters, say
                split = self._split_ascii if part.isascii() else self._split
                total += sum(map(pieces, split(part)))
        return total

    def _count_piece(self, piece: str) -> int:
        data = piece.encode()
        if len(data) == 1 or self.ranks.rank(data) is not None:
            return 1
        return self.ranks.merged_length(data)


def _rank_table(blob: bytes, starts: array[int]) -> RankTable:
    return RankTable(blob[starts[rank] : starts[rank + 1]] for rank in range(len(starts) - 1))


def _rebuilt(ranks: RankTable, pattern: str, ascii_pattern: str | None) -> BytePairCounter:
    return BytePairCounter(ranks, pattern, ascii_pattern=ascii_pattern)


# Cuts a text after each line break followed by an ASCII letter or digit: no piece of the
# encodings given an `ascii_pattern` crosses such a place.
_at_lines_starting_alphanumeric: Final = re.compile(r"(?<=\n)(?=[A-Za-z0-9])").split

# A space after a visible ASCII character: no piece of those encodings crosses the place
# before it either (a piece holding anything but white space never runs on into a space, and
# their patterns look behind nothing, so the pieces after it are the same alone).
_space_after_visible: Final = re.compile(r"(?<=[!-~]) ").search

#: The length of a part `_parts` cuts a line into, at least (a line is cut at most once in
#: that many characters, so the parts cost no more than the line whole).
_PART_CHARS: Final = 4096


def _parts(line: str) -> Iterator[str]:
    """`line` cut before a space after a visible ASCII character, about every `_PART_CHARS`.

    So that the ASCII parts of a long line that is not all ASCII split with the faster
    pattern: a JSON document on one line with one "…" in it, for instance.
    """
    start = 0
    while len(line) - start > 2 * _PART_CHARS:
        found = _space_after_visible(line, start + _PART_CHARS)
        if found is None:
            break
        yield line[start : found.start()]
        start = found.start()
    yield line[start:]
