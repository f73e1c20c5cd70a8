"""Debian's Chromium driven by Playwright for the inspector's tests, and where screenshots go.

Without chromium a test skips with the reason, except under CI (CI=true), where it fails.
Screenshots go to ``test-artifacts/``; with ``UPDATE_DOCS_SCREENSHOTS=1`` to ``docs/``, the
README's pictures (``UPDATE_DOCS_SCREENSHOTS=1 pytest tests/test_server_inspector*.py``).
Playwright never downloads a browser here: it launches the system's.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ROOT = Path(__file__).resolve().parent.parent
ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
]


def browser_or_skip() -> Any:
    """The Playwright module, or a skip (a failure under CI) when chromium is missing."""
    if not Path(CHROMIUM).exists():
        reason = "the inspector tests need Debian's chromium (apt-get install chromium)"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{reason}; CI must install it (.ci/run does)")
        pytest.skip(reason)
    return pytest.importorskip("playwright.async_api")


@dataclass
class Page:
    """A page of the inspector, with every error its scripts raised."""

    page: Any
    errors: list[str] = field(default_factory=list)

    async def shot(self, name: str) -> Path:
        """Save a screenshot named `name` (PNG) where this run keeps them."""
        folder = ROOT / ("docs" if os.environ.get("UPDATE_DOCS_SCREENSHOTS") else "test-artifacts")
        folder.mkdir(exist_ok=True)
        path = folder / f"{name}.png"
        await self.page.screenshot(path=str(path))
        return path


@asynccontextmanager
async def inspector(url: str, *, width: int = 1400, height: int = 900) -> AsyncIterator[Page]:
    """Open the inspector at `url` in a fresh Chromium; fail on any error of its scripts."""
    playwright_api = browser_or_skip()
    async with playwright_api.async_playwright() as playwright:
        # Playwright gives every launch a fresh temporary profile (its own --user-data-dir).
        browser = await playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            page = await browser.new_page(viewport={"width": width, "height": height})
            opened = Page(page)
            page.on("pageerror", lambda err: opened.errors.append(str(err)))
            await page.goto(url)
            yield opened
            assert opened.errors == []
        finally:
            await browser.close()


async def scrolled_to_end(locator: Any) -> bool:
    """Whether the scrolling element `locator` shows its last line."""
    return bool(
        await locator.evaluate("el => el.scrollHeight - el.scrollTop - el.clientHeight < 4")
    )
