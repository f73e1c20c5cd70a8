"""``gen_ai.provider.name`` from a server's URL: every provider the conventions name, by host.

A host names a provider only when it is that provider's API host, or a resource subdomain of
a domain that only serves that provider's API (``<resource>.openai.azure.com``): matched as
whole DNS labels, never as a substring, so ``notanthropic.com`` or
``api.openai.com.example.net`` are ``_OTHER``. Anything else speaking the OpenAI API (Ollama,
vLLM, a proxy) is the conventions' catch-all ``_OTHER``: the host is in ``server.address``.
"""

from __future__ import annotations

import functools
import re
from typing import Final
from urllib.parse import urlsplit

__all__ = ["PROVIDERS", "provider_name"]

#: The hosts of each provider the conventions (1.44.0) name: exact hosts, and ``*.``-suffixes
#: meaning any subdomain of the domain (never the domain itself unless listed).
PROVIDERS: Final[dict[str, tuple[str, ...]]] = {
    "openai": ("api.openai.com",),
    "azure.ai.openai": ("*.openai.azure.com", "*.cognitiveservices.azure.com"),
    "azure.ai.inference": (
        "models.inference.ai.azure.com",
        "*.services.ai.azure.com",
        "*.models.ai.azure.com",
    ),
    "anthropic": ("api.anthropic.com",),
    "gcp.gemini": ("generativelanguage.googleapis.com",),
    # Vertex AI's regional endpoints put the region before a dash: us-central1-aiplatform...
    "gcp.vertex_ai": ("aiplatform.googleapis.com", "*-aiplatform.googleapis.com"),
    "cohere": ("api.cohere.com", "api.cohere.ai"),
    "ibm.watsonx.ai": ("*.ml.cloud.ibm.com",),
    # Bedrock's OpenAI-compatible runtime: bedrock-runtime.<region>.amazonaws.com.
    "aws.bedrock": ("bedrock-runtime.*.amazonaws.com", "bedrock-runtime-fips.*.amazonaws.com"),
    "mistral_ai": ("api.mistral.ai",),
    "groq": ("api.groq.com",),
    "deepseek": ("api.deepseek.com",),
    "x_ai": ("api.x.ai",),
    "perplexity": ("api.perplexity.ai",),
}

_LABEL = r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?"


def _pattern(host: str) -> str:
    """A host pattern as a regex: ``*.`` is one or more labels, ``*-`` a label's head."""
    if host.startswith("*."):
        return rf"(?:{_LABEL}\.)+" + re.escape(host[2:])
    if host.startswith("*-"):
        return r"[a-z0-9][a-z0-9-]*-" + re.escape(host[2:])
    head, star, tail = host.partition("*")
    if star:
        return re.escape(head) + _LABEL + re.escape(tail)
    return re.escape(host)


_MATCHERS: Final = tuple(
    (re.compile(_pattern(host)), name) for name, hosts in PROVIDERS.items() for host in hosts
)


@functools.lru_cache(maxsize=256)
def provider_name(base_url: str | None) -> str:
    """The ``gen_ai.provider.name`` of a server's base URL (``_OTHER`` when not a known host)."""
    if not base_url:
        return "_OTHER"
    try:
        host = (urlsplit(base_url).hostname or "").rstrip(".")
    except ValueError:
        return "_OTHER"
    for pattern, name in _MATCHERS:
        if pattern.fullmatch(host):
            return name
    return "_OTHER"
