"""What a model call costs, in US dollars, from its token usage.

Prices come from `genai-prices` (maintained price data for most providers and models, with
their changes over time), read from the snapshot bundled in the installed package: nothing is
downloaded. A `Pricing` given in the config overrides it (private or
self-hosted models). A model the data does not know, without an override, is priced
``None``: unknown, never 0.

genai-prices is a core dependency rather than part of an extra: it is small (pure Python,
its data a few MB, its own dependencies pydantic and httpx2, which the core already pulls
in), works offline, and the cost limit (``max_cost_usd``) is a core feature that must hold
whether or not telemetry is installed. ``import agent_flow`` does not load it: an agent,
when built, starts loading it in a background thread (`preload`), so neither the import nor
the first answer waits for its few hundred milliseconds.

Pricing is on every model call's path, and genai-prices' general calculation (units,
decompositions, validation) takes some hundreds of microseconds a call. A model whose price
has no tiers is linear in its tokens: its per-token rates are read off genai-prices' own
calculation once (then again every `_RATES_TTL` seconds, as prices can change with time) and
a call is priced from them in a microsecond; a checked mixed usage must agree with
genai-prices, else, and for tiered prices, every call takes the full calculation.
"""

from __future__ import annotations

import sys
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Final, Literal, TypeAlias

from pydantic import BaseModel, ConfigDict, Field

from agent_flow.llm.base import Usage

__all__ = ["Pricing", "preload", "price_usage"]

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


@dataclass(frozen=True, slots=True)
class _Rates:
    """A linear price: dollars per call and per token of each kind."""

    url: str | None  # the provider_api_url genai-prices found the model with
    call: float
    fresh_input: float
    cached_input: float
    output: float


#: Seconds a model's rates are reused before they are read again.
_RATES_TTL: Final = 60.0
_Found: TypeAlias = _Rates | Literal["unknown"] | tuple[Literal["tiered"], str | None]
_rates: dict[tuple[str, str | None], tuple[float, _Found]] = {}


def _price(
    model: str, base_url: str | None, input_tokens: int, cached: int, output_tokens: int
) -> float | None:
    key = (model, base_url)
    now = time.monotonic()
    entry = _rates.get(key)
    if entry is None or entry[0] < now:
        entry = _rates[key] = (now + _RATES_TTL, _find_rates(model, base_url))
    found = entry[1]
    if isinstance(found, _Rates):
        return (
            found.call
            + (input_tokens - cached) * found.fresh_input
            + cached * found.cached_input
            + output_tokens * found.output
        )
    if found == "unknown":
        return None
    return _calc(model, found[1], input_tokens, cached, output_tokens)


def _find_rates(model: str, base_url: str | None) -> _Found:
    """The model's linear rates, ``"tiered"`` (priced in full each call), or ``"unknown"``."""
    from genai_prices import data_snapshot
    from genai_prices.types import TieredPrices

    snapshot = data_snapshot.get_snapshot()
    for url in [base_url, None] if base_url is not None else [None]:
        try:
            _, info = snapshot.find_provider_model(model, None, None, url)
        except LookupError:
            continue
        prices = info.get_prices(datetime.now(tz=UTC))
        if any(isinstance(value, TieredPrices) for value in vars(prices).values()):
            return ("tiered", url)
        million = 1_000_000
        call = _calc(model, url, 0, 0, 0)
        fresh = _calc(model, url, million, 0, 0)
        cached = _calc(model, url, million, million, 0)
        output = _calc(model, url, 0, 0, million)
        if call is None or fresh is None or cached is None or output is None:
            return ("tiered", url)
        rates = _Rates(
            url,
            call,
            (fresh - call) / million,
            (cached - call) / million,
            (output - call) / million,
        )
        # Linear as far as a mixed usage shows; anything else is priced in full.
        mixed = _calc(model, url, 12_345, 2_345, 678)
        linear = call + 10_000 * rates.fresh_input + 2_345 * rates.cached_input
        linear += 678 * rates.output
        if mixed is None or abs(mixed - linear) > 1e-9 * max(1.0, abs(mixed)):
            return ("tiered", url)
        return rates
    return "unknown"


def _calc(
    model: str, url: str | None, input_tokens: int, cached: int, output_tokens: int
) -> float | None:
    """genai-prices' own calculation for `model` at `url` (``None``: it does not know it)."""
    import genai_prices

    usage = genai_prices.Usage(
        input_tokens=input_tokens, cache_read_tokens=cached or None, output_tokens=output_tokens
    )
    try:
        calculation = genai_prices.calc_price(usage, model_ref=model, provider_api_url=url)
    except LookupError:
        return None
    return float(calculation.total_price)


class Pricing(BaseModel):
    """Prices in US dollars per million tokens, overriding the price data for every model.

    Without it, model calls are priced from genai-prices' data (see `agent_flow.pricing`);
    set it for private or self-hosted models that data does not know.

    Attributes:
        input_per_million: Price of a million prompt tokens.
        output_per_million: Price of a million completion tokens (reasoning included).
        cached_input_per_million: Price of a million prompt tokens served from the
            provider's cache (``None``: the input price).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    input_per_million: float = Field(ge=0)
    output_per_million: float = Field(ge=0)
    cached_input_per_million: float | None = Field(default=None, ge=0)

    def cost(
        self, prompt_tokens: int, completion_tokens: int, *, cached_tokens: int | None = None
    ) -> float:
        """The cost of this many tokens (`cached_tokens` are part of `prompt_tokens`)."""
        cached = min(cached_tokens or 0, prompt_tokens)
        cached_price = (
            self.input_per_million
            if self.cached_input_per_million is None
            else self.cached_input_per_million
        )
        return (
            (prompt_tokens - cached) * self.input_per_million
            + cached * cached_price
            + completion_tokens * self.output_per_million
        ) / 1_000_000
