"""tiktoken's own encoders, built from the rank files agent_flow reads: the reference counts.

agent_flow counts with its compact counter (`agent_flow._bpe`); the tests and
``benchmarks/bench_counting.py`` compare it with tiktoken's Rust encoder built here from the
same file and tiktoken's own split pattern (read from tiktoken's constructor, not from
agent_flow's copy).
"""

from __future__ import annotations

import base64
import functools
import gzip
from typing import Any
from unittest import mock

import tiktoken
from hypothesis import strategies as st

from agent_flow import tokens

#: Characters this Python's Unicode data has assigned, for texts compared with tiktoken. One
#: assigned since (U+323B0, a CJK ideograph of Unicode 17) is a letter to the `regex` module's
#: newer tables and not to the Rust regex tiktoken uses, which splits it apart from the next
#: word: agent_flow counts one token less there (tiktoken's tables, not a counting bug).
ASSIGNED = st.characters(exclude_categories=("Cn", "Cs"))


@functools.cache
def tiktoken_pattern(name: str) -> str:
    """The split pattern of tiktoken's own constructor for `name`."""
    import tiktoken_ext.openai_public as public

    # The constructors download their rank files; they get an empty one.
    with mock.patch.object(public, "load_tiktoken_bpe", return_value={}):
        pattern: str = getattr(public, name)()["pat_str"]
    return pattern


@functools.cache
def tiktoken_encoding(name: str) -> Any:
    """tiktoken's encoder for `name` (``cl100k_base`` or ``o200k_base``), built once."""
    source = tokens._RANK_FILES[name]
    path = tokens._rank_file_path(source)
    assert path is not None, f"the rank file of {name} is not installed"
    content = path.read_bytes()
    if path.suffix == ".gz":
        content = gzip.decompress(content)
    ranks = {
        base64.b64decode(token): int(rank)
        for token, rank in (line.split() for line in content.splitlines() if line)
    }
    pattern = tiktoken_pattern(name)
    return tiktoken.Encoding(name, pat_str=pattern, mergeable_ranks=ranks, special_tokens={})
