"""The environment's renderer: section blocks and reports, cached per section version.

`_Renderer` keeps, per section, the blocks rendered under each pair of caps (with their
token counts per counter) until the section changes, and the reports of the environment's
current version by budget and counter (a version once passed is never rendered again, so its
reports go); `_Fit` (in `render`) does the search for one budget.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TypeAlias

from agent_flow._types import JsonObject
from agent_flow._utils import compact_json
from agent_flow.environment._trim import _SECTION_SHAPES, _Trim
from agent_flow.environment.render import RenderReport, _Fit
from agent_flow.environment.sections import _DEFAULT_STATE, RENDER_ORDER
from agent_flow.tokens import TokenCounter


@dataclass
class _Block:
    text: str
    elided: int
    shortened: int
    counts: dict[int, tuple[int, bool]] = field(default_factory=dict)  # counter id → count
    # counter id → exact count of the text with the separator after it (`_Fit.count_joined`)
    joined: dict[int, int] = field(default_factory=dict)


@dataclass
class _SectionCache:
    version: int
    longest_collection: int
    longest_string: int
    blocks: dict[tuple[int | None, int | None], _Block]


_Caps: TypeAlias = tuple[int | None, int | None]


def present(state: JsonObject) -> list[str]:
    """The sections not at their defaults, in render order: those a render shows."""
    return [name for name in RENDER_ORDER if state[name] != _DEFAULT_STATE[name]]


class _Renderer:
    """Renders an environment's state within budgets, caching per section version."""

    _MAX_BLOCKS_PER_SECTION = 128
    _MAX_REPORTS = 16

    def __init__(self) -> None:
        self._sections: dict[str, _SectionCache] = {}
        # The reports of `_version` (the newest version rendered), by budget and counter.
        self._version = -1
        self._reports: OrderedDict[tuple[int, int], RenderReport] = OrderedDict()
        # Strong references keep counter ids unique while counts keyed by them are cached.
        self._counters: dict[int, TokenCounter] = {}

    # -- caches ----------------------------------------------------------------------

    def _section(self, state: JsonObject, name: str, version: int) -> _SectionCache:
        cache = self._sections.get(name)
        if cache is None or cache.version != version:
            trim = _Trim(None, None)
            data = trim.value(state[name], _SECTION_SHAPES[name])
            block = _Block(f"## {name}\n{compact_json(data)}", 0, 0)
            cache = _SectionCache(
                version, trim.longest_collection, trim.longest_string, {(None, None): block}
            )
            self._sections[name] = cache
        return cache

    def _block(self, state: JsonObject, name: str, cache: _SectionCache, caps: _Caps) -> _Block:
        item_cap, string_cap = caps
        if item_cap is not None and item_cap >= cache.longest_collection:
            item_cap = None
        if string_cap is not None and string_cap >= cache.longest_string:
            string_cap = None
        key = (item_cap, string_cap)
        block = cache.blocks.get(key)
        if block is None:
            if len(cache.blocks) >= self._MAX_BLOCKS_PER_SECTION:
                full = cache.blocks[(None, None)]
                cache.blocks.clear()
                cache.blocks[(None, None)] = full
            trim = _Trim(item_cap, string_cap)
            data = trim.value(state[name], _SECTION_SHAPES[name])
            block = _Block(f"## {name}\n{compact_json(data)}", trim.elided, trim.shortened)
            cache.blocks[key] = block
        return block

    def _counter_id(self, counter: TokenCounter) -> int:
        key = id(counter)
        if self._counters.get(key) is not counter:
            if len(self._counters) >= 8:
                self._counters.clear()
                for cache in self._sections.values():
                    for block in cache.blocks.values():
                        block.counts.clear()
                        block.joined.clear()
                self._reports.clear()
            self._counters[key] = counter
        return key

    # -- rendering -------------------------------------------------------------------

    def longest_string(self, state: JsonObject, versions: Mapping[str, int]) -> int:
        """Characters of the longest string in the sections not at their defaults.

        Each section's full block is made and cached on the way (a render needs it next).
        """
        return max(
            (self._section(state, name, versions[name]).longest_string for name in present(state)),
            default=0,
        )

    def render(
        self,
        state: JsonObject,
        versions: Mapping[str, int],
        max_tokens: int,
        counter: TokenCounter,
    ) -> RenderReport:
        counter_id = self._counter_id(counter)
        version = max(versions.values())
        if version != self._version:
            # Versions only grow: the reports of the one before are never asked for again.
            self._version = version
            self._reports.clear()
        report_key = (max_tokens, counter_id)
        cached = self._reports.get(report_key)
        if cached is not None:
            self._reports.move_to_end(report_key)
            return cached
        shown = present(state)
        caches: dict[str, _SectionCache] = {
            name: self._section(state, name, versions[name]) for name in shown
        }
        report = _Fit(self, state, caches, max(max_tokens, 0), counter, counter_id).run(shown)
        self._reports[report_key] = report
        if len(self._reports) > self._MAX_REPORTS:
            self._reports.popitem(last=False)
        return report
