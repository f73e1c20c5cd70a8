"""Known secret values, and their redaction from what tools return: `SecretRedactor`.

This is the second line of defence. The first is that ``run_command`` starts commands with a
minimal environment that holds none of the agent's secrets (`ShellSettings`); but a tool can
still come across a secret elsewhere (a dotfile, another process's environment, an MCP
server's own output), and whatever a tool returns goes to the model, the events, the
environment, the session store, exports and the next prompt. So the `ToolExecutor` passes
every result through a `SecretRedactor` first, which replaces each known secret value with
``[REDACTED:NAME]``.

Known values are those of environment variables whose names look secret (`looks_secret`:
``*API_KEY*``, ``*TOKEN*``, ``*SECRET*``, ``*PASSWORD*`` and the like), of variables named
explicitly (the model's key variable, ``AgentConfig.secret_env``) and values added with
`SecretRedactor.add`, and what MCP servers were configured with (`SecretRedactor.add_server`:
their secret-looking ``env`` values and credential headers). Values shorter than
`MIN_SECRET_LENGTH` characters are ignored: redacting every ``1`` or ``true`` would destroy
output and protect nothing. Only exact
occurrences are found; a secret a tool transforms (base64, split across lines) is not.
"""

from __future__ import annotations

import functools
import os
import re
import threading
from collections.abc import Iterable, Mapping

from agent_flow._types import JsonValue
from agent_flow.tools.results import Attachment, ToolResult

#: Values shorter than this are never treated as secrets.
MIN_SECRET_LENGTH = 8

_SECRET_NAME = re.compile(
    r"API_?KEY|APIKEY|(?:^|_)KEY$|TOKEN(?!IZ)|SECRET|PASSW(?:OR)?D|PASSPHRASE|CREDENTIAL"
    r"|PRIVATE_?KEY|ACCESS_?KEY|COOKIE|(?:^|_)DSN$|AUTH$",
    re.IGNORECASE,
)

#: Headers that carry credentials whatever `looks_secret` says of their names.
_CREDENTIAL_HEADERS = frozenset({"authorization", "proxy-authorization"})


# Remembered: every agent built scans the whole environment, whose names rarely change.
@functools.lru_cache(maxsize=4096)
def looks_secret(name: str) -> bool:
    """Whether an environment variable's name says it holds a secret (``OPENAI_API_KEY``)."""
    return bool(_SECRET_NAME.search(name))


class SecretRedactor:
    """Replaces known secret values with ``[REDACTED:NAME]`` in text and tool results.

    Args:
        secrets: Secret values by the name shown in their place.
        min_length: Values shorter than this are ignored.

    Its `repr` and `names` never show a value.
    """

    def __init__(
        self, secrets: Mapping[str, str] | None = None, *, min_length: int = MIN_SECRET_LENGTH
    ) -> None:
        self.min_length = min_length
        self._values: dict[str, str] = {}  # value -> name
        self._pattern: re.Pattern[str] | None = None
        self._lock = threading.Lock()
        for name, value in (secrets or {}).items():
            self.add(name, value)

    @classmethod
    def from_environment(
        cls,
        environ: Mapping[str, str] | None = None,
        *,
        names: Iterable[str] = (),
        min_length: int = MIN_SECRET_LENGTH,
    ) -> SecretRedactor:
        """The values of the variables in `environ` (default: this process's) that are secret.

        Args:
            environ: The variables to look at (default ``os.environ``).
            names: Variables that are secret whatever their names look like.
            min_length: Values shorter than this are ignored.
        """
        source = os.environ if environ is None else environ
        redactor = cls(min_length=min_length)
        explicit = set(names)
        for name, value in source.items():
            if name in explicit or looks_secret(name):
                redactor.add(name, value)
        return redactor

    def __repr__(self) -> str:
        return f"SecretRedactor(names={self.names!r})"

    def __len__(self) -> int:
        return len(self._values)

    @property
    def names(self) -> list[str]:
        """The names of the known secrets, sorted (never their values)."""
        return sorted(set(self._values.values()))

    def add(self, name: str, value: str | None) -> None:
        """Treat `value` as a secret shown as ``[REDACTED:name]`` (short or empty values: no-op)."""
        if not value or len(value) < self.min_length:
            return
        with self._lock:
            if value not in self._values:  # one known already keeps the compiled pattern
                self._values[value] = name
                self._pattern = None

    def add_env(self, *names: str, environ: Mapping[str, str] | None = None) -> None:
        """Treat the values of the environment variables `names` as secrets (unset ones: no-op)."""
        source = os.environ if environ is None else environ
        for name in names:
            self.add(name, source.get(name))

    def add_server(
        self, server: str, env: Mapping[str, str] | None, headers: Mapping[str, str]
    ) -> None:
        """Treat what an MCP server was given as secret: env values and header credentials.

        Its ``env`` entries whose names look secret, and its headers that carry credentials
        (``Authorization``, ``Cookie``, ``X-Api-Key``, ...: whole, and the part after the scheme),
        shown as ``[REDACTED:<server>.<name>]``. A server may echo what it was given (a debug
        tool, an error quoting its request); whatever it returns goes to the model.
        """
        for name, value in (env or {}).items():
            if looks_secret(name):
                self.add(f"{server}.{name}", value)
        for name, value in headers.items():
            if name.lower() in _CREDENTIAL_HEADERS or looks_secret(name.replace("-", "_")):
                self.add(f"{server}.{name}", value)
                _, _, credential = value.strip().partition(" ")  # "Bearer <token>"
                self.add(f"{server}.{name}", credential.strip())

    def _compiled(self) -> re.Pattern[str] | None:
        with self._lock:
            if self._pattern is None and self._values:
                # Longest first, so a secret containing another is replaced whole.
                ordered = sorted(self._values, key=len, reverse=True)
                self._pattern = re.compile("|".join(re.escape(value) for value in ordered))
            return self._pattern

    def redact(self, text: str) -> str:
        """`text` with every known secret value replaced by ``[REDACTED:NAME]``."""
        pattern = self._compiled()
        if pattern is None or not text:
            return text
        values = self._values
        return pattern.sub(lambda match: f"[REDACTED:{values[match.group(0)]}]", text)

    def redact_json(self, value: JsonValue) -> JsonValue:
        """`value` with every string in it (keys included) redacted."""
        if isinstance(value, str):
            return self.redact(value)
        if isinstance(value, list):
            return [self.redact_json(item) for item in value]
        if isinstance(value, dict):
            return {self.redact(key): self.redact_json(item) for key, item in value.items()}
        return value

    def redact_result(self, result: ToolResult) -> ToolResult:
        """`result` with its content, data and attachment descriptions redacted.

        Returns `result` itself when it contains no secret.
        """
        if self._compiled() is None:
            return result
        content = self.redact(result.content)
        data = self.redact_json(result.data)
        attachments = tuple(self._redact_attachment(a) for a in result.attachments)
        if content == result.content and data == result.data and attachments == result.attachments:
            return result
        return result.model_copy(
            update={"content": content, "data": data, "attachments": attachments}
        )

    def _redact_attachment(self, attachment: Attachment) -> Attachment:
        description = self.redact(attachment.description)
        uri = self.redact(attachment.uri) if attachment.uri is not None else None
        if description == attachment.description and uri == attachment.uri:
            return attachment
        return attachment.model_copy(update={"description": description, "uri": uri})
