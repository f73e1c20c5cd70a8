"""The lab's HTML page in a real browser: Debian's chromium driven by Playwright, offline.

`agent-flow lab --html` writes the page for two recorded sessions (one priced, one whose model
has no price) and candidates of which two pairs draw identical lines; the browser opens the file
and the test reads what a person sees: which lines coincide, each probe's row and lane chart,
and the cost's known part. A screenshot is kept in ``test-artifacts/``. Without chromium the
test skips with the reason, except under CI (CI=true), where it fails.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from agent_flow.lab import LabReport
from agent_flow.lab.html import _DASHES, _look
from agent_flow.sessions import SQLiteSessionStore
from tests.inspector_browser import CHROMIUM, ROOT, browser_or_skip
from tests.test_cli import invoke_async
from tests.test_lab import RESERVE, record

PROBES = ("MARK-01 disk 1", "MARK-06 disk 6")


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("AGENT_FLOW_HOME", str(tmp_path / "home"))


def test_no_two_of_the_first_candidates_are_drawn_alike() -> None:
    looks = [_look(i) for i in range(42)]
    assert len(set(looks)) == 42
    assert "4 4" not in _DASHES  # the budget lines' pattern


async def test_the_lab_page_shows_coinciding_lines_probes_and_the_known_cost(
    tmp_path: Path,
) -> None:
    browser_or_skip()
    playwright_api = pytest.importorskip("playwright.async_api")
    async with SQLiteSessionStore(tmp_path / "s.db") as store:
        priced = await record(store)
        local = await record(store, model="my-local-gguf")
        await store.export(priced, tmp_path / "priced.jsonl")
        await store.export(local, tmp_path / "local.jsonl")
    page_file = tmp_path / "lab.html"
    result = await invoke_async(
        ["lab", str(tmp_path / "priced.jsonl"), str(tmp_path / "local.jsonl"),
         "--budget", "1500", "--budget", "100000", "--strategy", "drop_oldest",
         "--strategy", "elide_then_drop", "--reserve", str(RESERVE),
         "--probe", PROBES[0], "--probe", PROBES[1], "--json", "--html", str(page_file)]
    )  # fmt: skip
    assert result.code == 0, result.err
    report = LabReport.model_validate_json(result.out)
    names = [c.name for c in report.candidates]
    first_session = [c.sessions[0] for c in report.candidates]
    # Which candidates draw the same token line in the first session (as an earlier one),
    # from the report itself.
    lines = [[(s.step, s.tokens) for s in session.steps] for session in first_session]
    same_tokens = {
        names[i]: names[lines.index(line)] for i, line in enumerate(lines) if lines.index(line) < i
    }
    assert same_tokens  # elide and drop never differ here: the answers are never elided first

    async with playwright_api.async_playwright() as playwright:
        browser = await playwright.chromium.launch(
            executable_path=CHROMIUM,
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--no-first-run",
            ],
        )
        try:
            page = await browser.new_page(viewport={"width": 1280, "height": 900})
            requested: list[str] = []
            page.on("request", lambda request: requested.append(request.url))
            errors: list[str] = []
            page.on("pageerror", lambda err: errors.append(str(err)))
            await page.goto(page_file.as_uri())
            assert requested == [page_file.as_uri()] and errors == []

            # 1. Identical lines: the legend says so, and each candidate has its own look.
            tokens_chart = page.locator("figure.chart").first
            for name, earlier in same_tokens.items():
                note = tokens_chart.locator(f'.legend span[data-candidate="{name}"] .same')
                assert f"same line as {earlier}" in await note.inner_text()
            looks = await tokens_chart.locator("polyline[data-candidate]").evaluate_all(
                "lines => lines.map(l => [getComputedStyle(l).stroke,"
                " getComputedStyle(l).strokeDasharray])"
            )
            assert len(looks) == len(names) and len({tuple(look) for look in looks}) == len(names)

            # 2. Each probe: its own row, and its own lane chart per session.
            rows = page.locator("table.probes tr[data-probe]")
            assert await rows.count() == len(PROBES)
            for index, probe in enumerate(PROBES):
                cells = await rows.nth(index).locator("td").all_inner_texts()
                assert cells[0] == probe
                for name, cell in zip(names, cells[1:], strict=True):
                    result_ = next(c for c in report.candidates if c.name == name).probes[index]
                    assert cell.startswith(
                        f"{result_.steps_visible}/{result_.steps_available} steps"
                    )
            charts = page.locator(f'svg.probe[data-probe="{PROBES[0]}"]')
            assert await charts.count() == 2  # one per session
            chart = charts.first
            for candidate in report.candidates:
                lane = chart.locator(f'g.lane[data-candidate="{candidate.name}"]')
                steps = candidate.sessions[0].steps
                shown = sum("probe:1" in s.visible for s in steps)
                left_out = sum(
                    "probe:1" in s.available and "probe:1" not in s.visible for s in steps
                )
                assert await lane.locator("circle.in").count() == shown
                assert await lane.locator("circle.out").count() == left_out
                box = await lane.bounding_box()
                assert box is not None and box["height"] > 0
            tight = chart.locator(f'g.lane[data-candidate="{names[0]}"] circle.out').first
            assert "left out" in (await tight.locator("title").text_content() or "")

            # 3. The cost: the known part, and that some is unknown.
            costs = await page.locator("table.summary tr td:nth-child(7)").all_inner_texts()
            assert costs and all(c.startswith("≥ $") and c.endswith("+ unknown") for c in costs)
            for cost, candidate in zip(costs, report.candidates, strict=True):
                assert candidate.cost_usd is None
                assert float(cost.split("$")[1].split()[0]) == pytest.approx(
                    candidate.cost_known_usd, rel=1e-3
                )

            artifacts = ROOT / "test-artifacts"
            artifacts.mkdir(exist_ok=True)
            await page.screenshot(path=str(artifacts / "lab.png"), full_page=True)
        finally:
            await browser.close()
