"""The Usage page in Chromium (issue 36, deliverable 6): reached from the top bar, it shows
the report `GET /api/v1/usage` serves (each cell's exact value in `data-value`, its text
rounded), a user's own experiments by default and a viewer everyone's, and its form
regroups the table by experiment."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import expect

from muster.server.usage_pages import COLUMNS
from tests.ui.conftest import Team

pytestmark = pytest.mark.lifecycle  # a real server, a real trial, a real browser

CONFIG = "name: usage-page\nentrypoint: python work.py\n"
WORK = "import time\nprint('working', flush=True)\ntime.sleep(0.5)\n"


def read_row(row: Any) -> dict[str, Any]:
    """The numbers of one table row as the page shows them: (exact value, text) by key."""
    cells = row.locator("td.num")  # (the first cell names the group)
    found = {key: (float(cells.nth(i).get_attribute("data-value")), cells.nth(i).inner_text())
             for i, (key, _) in enumerate(COLUMNS)}
    goodput = cells.nth(len(COLUMNS))
    found["goodput"] = (float(goodput.get_attribute("data-value")), goodput.inner_text())
    return found


def assert_shows(row: Any, expected: Mapping[str, Any]) -> None:
    shown = read_row(row)
    for key, _ in COLUMNS:
        value, text = shown[key]
        assert value == pytest.approx(expected[key], rel=1e-9, abs=1e-9), key
        assert text == f"{expected[key]:.2f}", key
    value, text = shown["goodput"]
    assert value == pytest.approx(expected["goodput"], rel=1e-9, abs=1e-6)
    assert text == f"{expected['goodput'] * 100:.1f}%"


def test_the_usage_page_shows_the_reports_numbers(page_of: Any, team: Team,
                                                  tmp_path: Path) -> None:
    context = tmp_path / "context"
    context.mkdir()
    (context / "work.py").write_text(WORK)
    exp = team.run_to_the_end(CONFIG, context)  # alice's
    with team.client("alice") as alice:
        report = alice.usage()
        by_experiment = alice.usage(by="experiment")
    assert report["owner"] == "alice" and [r["key"] for r in report["rows"]] == ["alice"]
    assert report["rows"][0]["productive_hours"] > 0

    page = page_of("alice")
    page.locator("header nav").get_by_role("link", name="Usage", exact=True).click()
    page.wait_for_url(f"{team.server.url}/usage")
    expect(page.locator("#usage-scope")).to_contain_text("alice's experiments")
    assert_shows(page.locator('table.usage tbody tr[data-key="alice"]'), report["rows"][0])
    assert_shows(page.locator('table.usage tfoot tr[data-key="total"]'), report["total"])

    page.locator("select[name=by]").select_option("experiment")
    page.get_by_role("button", name="Show").click()
    row = page.locator(f'table.usage tbody tr[data-key="{exp["id"]}"]')
    expect(row.get_by_role("link")).to_have_text(f"{exp['id']} usage-page")
    [expected] = [r for r in by_experiment["rows"] if r["key"] == str(exp["id"])]
    assert_shows(row, expected)

    viewer = page_of("vera")  # a viewer sees everyone's by default
    viewer.goto(f"{team.server.url}/usage?since=2h")
    expect(viewer.locator("#usage-scope")).to_contain_text("Everyone's experiments")
    expect(viewer.locator('table.usage tbody tr[data-key="alice"]')).to_be_visible()

    viewer.goto(f"{team.server.url}/usage?since=500d")
    expect(viewer.locator("body")).to_contain_text("since must be more than 0 and at most 400d")
