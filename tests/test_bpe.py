"""agent_flow's compact byte-pair counter gives tiktoken's counts exactly, in a tenth the memory.

tiktoken's own encoder is built here (only here) from the same rank files, and every count is
compared with ``len(encode_ordinary(text))``: any Unicode text, texts made of the pieces the
split pattern treats specially (contractions, digit runs, line breaks, trailing spaces), long
runs of one character (the merge of a long piece) and every code point of the Basic
Multilingual Plane in several contexts (the ``regex`` package's Unicode tables against the
Rust regex tiktoken uses). The merge itself is compared with a transcription of tiktoken's
quadratic ``_byte_pair_merge`` on arbitrary bytes.
"""

from __future__ import annotations

import pickle
import string
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent_flow import _bpe, tokens
from agent_flow._bpe import BytePairCounter, RankTable
from agent_flow.tokens import TiktokenCounter
from tests.helpers import run_python
from tests.tiktoken_reference import ASSIGNED, tiktoken_encoding, tiktoken_pattern

ENCODINGS = ("cl100k_base", "o200k_base")
MODEL = {"cl100k_base": "gpt-4", "o200k_base": "gpt-4o"}


def ours(name: str) -> TiktokenCounter:
    return TiktokenCounter(MODEL[name])


def assert_same(name: str, text: str) -> None:
    expected = len(tiktoken_encoding(name).encode_ordinary(text))
    counter = ours(name)
    assert counter._encoding.count(text) == expected, (name, text)
    assert counter.count(text) == expected  # through the remembered texts too


@pytest.mark.parametrize("name", ENCODINGS)
@settings(max_examples=300, deadline=None)
@given(text=st.text(ASSIGNED, max_size=300))
def test_any_text_counts_as_tiktoken_counts_it(name: str, text: str) -> None:
    assert_same(name, text)


# What the split patterns treat specially, and the characters that fold into it.
_FRAGMENTS = [
    "'s",
    "'S",
    "'ll",
    "'LL",
    "'re",
    "'ve",
    "'d",
    "'m",
    "'t",
    "\u017f",
    "\u212a",
    "don't",
    "I'M",
    "123",
    "4567890",
    "½",
    "٣",
    " ",
    "  ",
    "\t",
    "\n",
    "\r\n",
    "\r",
    " \n",
    "\n\n",
    "   \n  ",
    "#",
    "## ",
    "/",
    "//",
    "...",
    "!?",
    '{"a": 1}',
    "héllo",
    "Straße",
    "ÜBER",
    "CamelCase",
    "snake_case",
    "日本語",
    "テキスト",
    "🎉",
    "👍🏽",
    "é",
    "x",
    "The",
    " quick",
    "\u00a0",
    "\u2028",
    "\u3000",
    "\x0b",
    "\x1c",
    "\u0301",
]


@pytest.mark.parametrize("name", ENCODINGS)
@settings(max_examples=300, deadline=None)
@given(parts=st.lists(st.sampled_from(_FRAGMENTS), max_size=30))
def test_the_patterns_special_cases_count_as_tiktoken_counts_them(
    name: str, parts: list[str]
) -> None:
    assert_same(name, "".join(parts))


@pytest.mark.parametrize("name", ENCODINGS)
@settings(max_examples=60, deadline=None)
@given(
    char=st.sampled_from(["a", "Z", "é", "ж", "日", "1", ".", "-", "=", " ", "\n", "🎉", "ab"]),
    length=st.integers(min_value=1, max_value=3000),
)
def test_a_long_run_of_one_character_counts_as_tiktoken_counts_it(
    name: str, char: str, length: int
) -> None:
    assert_same(name, char * length)


_ASCII = st.characters(max_codepoint=127)


@pytest.mark.parametrize("name", ENCODINGS)
@settings(max_examples=500, deadline=None)
@given(
    text=st.one_of(
        st.text(_ASCII, max_size=200),
        st.lists(st.sampled_from([f for f in _FRAGMENTS if f.isascii()]), max_size=30).map("".join),
    )
)
def test_the_ascii_patterns_split_ascii_as_tiktokens_patterns_do(name: str, text: str) -> None:
    import re

    import regex

    source = tokens._RANK_FILES[name]
    theirs = regex.findall(tiktoken_pattern(name), text)
    assert re.findall(source.ascii_pattern, text) == theirs
    assert_same(name, text)


@pytest.mark.parametrize("name", ENCODINGS)
@settings(max_examples=300, deadline=None)
@given(lines=st.lists(st.text(ASSIGNED, max_size=30), max_size=12))
def test_a_text_of_ascii_and_other_lines_counts_as_tiktoken_counts_it(
    name: str, lines: list[str]
) -> None:
    # Cut after the line breaks followed by an ASCII letter or digit, each part split by its own
    # pattern: the sum is the whole's count.
    assert_same(name, "\n".join(lines))


_AROUND_WORDS = [
    " ",
    "a",
    "Z",
    "'",
    ".",
    "(",
    "-",
    "/",
    "1",
    "é",
    "…",
    "日",
    "\u0301",
    "\n",
    "\t",
    "  ",
]


@pytest.mark.parametrize("name", ENCODINGS)
@settings(max_examples=400, deadline=None)
@given(
    text=st.lists(
        st.sampled_from(_AROUND_WORDS) | ASSIGNED | st.sampled_from(_FRAGMENTS),
        max_size=120,
    ).map("".join)
)
def test_a_long_line_cut_before_its_words_counts_as_tiktoken_counts_it(
    name: str, text: str
) -> None:
    # A line that is not all ASCII is cut before a space after a visible ASCII character, in
    # parts of at least `_PART_CHARS` characters; with parts of two characters, nearly every
    # such place in these short texts is a cut.
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_bpe, "_PART_CHARS", 2)
        assert_same(name, text + "é")


@settings(max_examples=200, deadline=None)
@given(
    line=st.lists(
        st.sampled_from(["word", " ", "é", ".", "x1", "  ", "…", "Q"]), max_size=3000
    ).map("".join),
)
def test_a_line_is_cut_only_before_a_space_after_a_visible_character(
    line: str,
) -> None:
    parts = list(_bpe._parts(line))
    assert "".join(parts) == line
    assert all(len(part) >= _bpe._PART_CHARS for part in parts[:-1])
    at = 0
    for part in parts[:-1]:
        at += len(part)
        assert line[at - 1] in string.punctuation + string.ascii_letters + string.digits
        assert line[at] == " "


_CONTEXTS = ("a{}a", "{}1", " {}", "{}\n", "1{}", "{}{}a", "'{}", "{} x", "x{}  y")


@pytest.mark.parametrize("name", ENCODINGS)
def test_every_character_of_the_basic_plane_counts_as_tiktoken_counts_it(name: str) -> None:
    # Nine contexts per character, joined: a letter, a number, a space, a line break and an
    # apostrophe on either side tell the pattern's character classes apart.
    encoding, counter = tiktoken_encoding(name), ours(name)._encoding
    wrong = []
    for code in range(0x10000):
        if 0xD800 <= code <= 0xDFFF:
            continue
        text = "|".join(context.replace("{}", chr(code)) for context in _CONTEXTS)
        if counter.count(text) != len(encoding.encode_ordinary(text)):
            wrong.append(hex(code))
    assert wrong == []


@pytest.mark.parametrize("name", ENCODINGS)
@settings(max_examples=300, deadline=None)
@given(char=st.characters(min_codepoint=0x10000), context=st.sampled_from(_CONTEXTS))
def test_characters_beyond_the_basic_plane_count_as_tiktoken_counts_them(
    name: str, char: str, context: str
) -> None:
    assert_same(name, context.replace("{}", char))


def _tiktoken_merge(ranks: RankTable, piece: bytes) -> int:
    """tiktoken's ``_byte_pair_merge`` (src/lib.rs), transcribed: rescans after each merge."""
    none = 1 << 62

    def rank(data: bytes) -> int:
        found = ranks.rank(data)
        return none if found is None else found

    parts = [[i, rank(piece[i : i + 2])] for i in range(len(piece) - 1)]
    parts += [[len(piece) - 1, none], [len(piece), none]]

    def get_rank(i: int) -> int:
        return rank(piece[parts[i][0] : parts[i + 3][0]]) if i + 3 < len(parts) else none

    while True:
        lowest, at = min((part[1], i) for i, part in enumerate(parts[:-1]))
        if lowest == none:
            return len(parts) - 1
        if at > 0:
            parts[at - 1][1] = get_rank(at - 1)
        parts[at][1] = get_rank(at)
        del parts[at + 1]


@pytest.mark.parametrize("name", ENCODINGS)
@settings(max_examples=300, deadline=None)
@given(
    data=st.one_of(
        st.binary(min_size=2, max_size=80),
        st.text(min_size=1, max_size=40).map(str.encode).filter(lambda b: len(b) >= 2),
    )
)
def test_the_heap_merge_merges_in_tiktokens_order(name: str, data: bytes) -> None:
    ranks = ours(name)._encoding.ranks
    assert ranks.merged_length(data) == _tiktoken_merge(ranks, data)


def test_a_rank_table_finds_every_token_and_nothing_else() -> None:
    ranks = ours("cl100k_base")._encoding.ranks
    for rank in range(0, ranks.size, 97):
        assert ranks.rank(ranks.token(rank)) == rank
    assert ranks.rank(b"no such token \x00\xff") is None
    assert ranks.nbytes < 3 * 2**20  # tiktoken's encoder holds ~22 MB for the same


def test_a_rank_file_with_a_gap_or_a_bad_line_is_refused() -> None:
    with pytest.raises(ValueError, match="rank 2 where 1 was expected"):
        RankTable.from_lines([b"YQ== 0", b"Yg== 2"])
    with pytest.raises(ValueError, match="is not a line of a rank file"):
        RankTable.from_lines([b"not base64! 0"])
    with pytest.raises(ValueError, match="is not a line of a rank file"):
        RankTable.from_lines([b"YQ== zero"])
    with pytest.raises(ValueError, match="do not run from 0"):
        RankTable.from_ranks({b"a": 1})


def test_a_counter_pickles_with_its_table() -> None:
    counter = ours("cl100k_base")._encoding
    copy = pickle.loads(pickle.dumps(counter))
    assert isinstance(copy, BytePairCounter)
    text = "a text to count, with 12345 and some ünïcödé"
    assert (
        copy.count(text)
        == counter.count(text)
        == len(tiktoken_encoding("cl100k_base").encode_ordinary(text))
    )


def test_a_counter_pickled_counts_the_same_in_a_process_of_another_hash_seed(
    tmp_path: Path,
) -> None:
    # The rank table is laid out by `hash`, seeded per process: a copy must not carry it.
    counter = ours("cl100k_base")._encoding
    text = "hello world, a test of pickling counters: 12345 ünïcödé"
    pickled = tmp_path / "counter.pickle"
    pickled.write_bytes(pickle.dumps(counter))
    code = (
        "import pickle, pathlib\n"
        f"counter = pickle.loads(pathlib.Path({str(pickled)!r}).read_bytes())\n"
        f"assert counter.count({text!r}) == {counter.count(text)}, counter.count({text!r})\n"
    )
    for seed in ("0", "123"):
        run_python(code, env={"PYTHONHASHSEED": seed})


def test_building_a_counter_never_makes_tiktokens_encoder_or_its_dictionary() -> None:
    # The Python dictionary of ranks alone is 17 MB for cl100k_base; tiktoken's encoder 22.
    code = (
        "import tracemalloc, tiktoken\n"
        "made = []\n"
        "tiktoken.Encoding.__init__ = lambda *a, **k: made.append(1)\n"
        "from agent_flow.tokens import TiktokenCounter\n"
        "tracemalloc.start()\n"
        "assert TiktokenCounter('gpt-4').count('hello world') == 2\n"
        "peak = tracemalloc.get_traced_memory()[1]\n"
        "assert not made, 'a tiktoken encoder was built'\n"
        "assert peak < 8 * 2**20, f'{peak / 2**20:.1f} MB at the peak'\n"
    )
    run_python(code)
