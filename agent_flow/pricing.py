"""What a model call costs, in US dollars, from its token usage.

Prices come from `genai-prices` (maintained price data for most providers and models, with
their changes over time), read from the snapshot bundled in the installed package: nothing is
downloaded. A `agent_flow.config.Pricing` given in the config overrides it (private or
self-hosted models). A model the data does not know, without an override, is priced
``None``: unknown, never 0.

genai-prices is a core dependency rather than part of an extra: it is small (pure Python,
its data a few MB, its own dependencies pydantic and httpx2, which the core already pulls
in), works offline, and the cost limit (``max_cost_usd``) is a core feature that must hold
whether or not telemetry is installed. ``import agent_flow`` does not load it: an agent,
when built, starts loading it in a background thread (`preload`), so neither the import nor
the first answer waits for its few hundred milliseconds.
"""

from __future__ import annotations

import sys
import threading
from typing import TYPE_CHECKING

from agent_flow.llm.base import Usage

if TYPE_CHECKING:
    from agent_flow.config import Pricing

__all__ = ["preload", "price_usage"]

_loader: threading.Thread | None = None
_loader_lock = threading.Lock()


def preload() -> None:
    """Load the price data in a background thread, once per process, and return at once.

    Loading it takes a few hundred milliseconds; an agent starts this when it is built so
    that its first priced call does not hold up the event loop (and the answer) meanwhile.
    """
    global _loader
    with _loader_lock:
        if _loader is not None or "genai_prices.data_snapshot" in sys.modules:
            return
        _loader = threading.Thread(target=_load, name="agent_flow-price-data", daemon=True)
        _loader.start()


def _load() -> None:
    try:
        from genai_prices import data_snapshot

        data_snapshot.get_snapshot()
    # Only a head start: pricing itself reports any real problem when it is asked.
    except Exception:
        return


def price_usage(
    model: str | None,
    usage: Usage,
    *,
    pricing: Pricing | None = None,
    base_url: str | None = None,
) -> float | None:
    """The cost of one model call in US dollars, or ``None`` when it is unknown.

    Args:
        model: The model's name as the server knows it (``gpt-4o-mini``,
            ``claude-sonnet-4-5``, ...).
        usage: The call's usage. Cached prompt tokens are billed at the model's cache-read
            price, reasoning tokens as output (they are part of ``completion_tokens``).
        pricing: Prices that override the price data (used for every model).
        base_url: The API root the call went to; it picks the provider when genai-prices
            knows it (a model served by several providers), else the model's name does.
    """
    if pricing is not None:
        return pricing.cost(
            usage.prompt_tokens, usage.completion_tokens, cached_tokens=usage.cached_tokens
        )
    if not model:
        return None
    cached = usage.cached_tokens or 0
    return _price(
        model,
        base_url or None,
        usage.prompt_tokens,
        min(cached, usage.prompt_tokens),
        usage.completion_tokens,
    )


# Models the price data does not know, with the API root they were called at: looking a
# name up searches every provider's models by pattern (about 100 µs), on every call.
_unknown: set[tuple[str, str | None]] = set()
_MAX_UNKNOWN = 1024


def _price(
    model: str, base_url: str | None, input_tokens: int, cached: int, output_tokens: int
) -> float | None:
    if (model, base_url) in _unknown:
        return None
    import genai_prices

    price_usage = genai_prices.Usage(
        input_tokens=input_tokens,
        cache_read_tokens=cached or None,
        output_tokens=output_tokens,
    )
    attempts: list[str | None] = [base_url, None] if base_url is not None else [None]
    for url in attempts:
        try:
            calculation = genai_prices.calc_price(
                price_usage, model_ref=model, provider_api_url=url
            )
        except LookupError:
            continue
        return float(calculation.total_price)
    if len(_unknown) >= _MAX_UNKNOWN:
        _unknown.clear()
    _unknown.add((model, base_url))
    return None
