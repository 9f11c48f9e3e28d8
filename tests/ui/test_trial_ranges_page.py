"""The experiment page's trials table filtered by ranges and exported as CSV, in Chromium
against a real server: the form's range joins the address, a reload shows it, a chip takes
it off, and the CSV link downloads what the table shows."""

from __future__ import annotations

import csv
import io
import re
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import expect

from tests.server.test_search_views import add_experiment, add_trial, losses, search_config
from tests.ui.conftest import Team

pytestmark = pytest.mark.lifecycle  # a real server, a real browser


@pytest.fixture(scope="module")
def searched(team: Team) -> dict[str, Any]:
    """A COMPLETED search of six trials: number n has lr 0.001 * (n + 1), val_loss
    0.1 * (n + 1) (number 5: no report)."""
    with team.server.store() as store, store.session_scope() as s:
        exp = add_experiment(s, search_config(max_trials=6), state="COMPLETED", max_trials=6)
        trials = [add_trial(s, exp, n, validation=[] if n == 5 else losses(0.1 * (n + 1)))
                  for n in range(6)]
        return {"id": exp.id, "trials": [t.id for t in trials]}


def _numbers(page: Any) -> list[str]:
    cells = page.locator("table.trials tbody tr td:nth-child(2)")
    return [text.strip() for text in cells.all_inner_texts()]


def test_a_range_filters_the_table_into_the_address_and_the_csv(
        page_of: Any, team: Team, searched: dict[str, Any]) -> None:
    page = page_of("vera")
    page.goto(f"{team.server.url}/experiments/{searched['id']}")
    page.evaluate("window.__notReloaded = true")
    page.get_by_label("range of").select_option("metric:val_loss")
    page.get_by_label("to", exact=True).fill("0.35")
    page.get_by_role("button", name="Filter").click()
    expect(page).to_have_url(re.compile(r"where=metric%3Aval_loss%3A%3A0\.35"))
    expect(page.locator(".tag.range")).to_have_text(re.compile(r"val_loss ≤ 0.35"))
    expect(page.locator("table.trials tbody tr")).to_have_count(3)
    page.get_by_label("range of").select_option("hparam:lr")
    page.get_by_label("from", exact=True).fill("0.0015")
    page.get_by_role("button", name="Filter").click()
    expect(page.locator("table.trials tbody tr")).to_have_count(2)
    assert _numbers(page) == ["1", "2"]
    assert page.evaluate("window.__notReloaded === true"), "the page was reloaded"

    with page.expect_download() as download:
        page.get_by_role("link", name="CSV").click()
    assert download.value.suggested_filename == f"experiment-{searched['id']}-trials.csv"
    text = Path(download.value.path()).read_text(encoding="utf-8")
    rows = list(csv.DictReader(io.StringIO(text, newline="")))
    assert [(r["number"], r["metric:val_loss"]) for r in rows] == [
        ("1", repr(0.1 * 2)), ("2", repr(0.1 * 3))]

    page.reload()  # the address holds the ranges
    expect(page.locator(".tag.range")).to_have_count(2)
    expect(page.locator("table.trials tbody tr")).to_have_count(2)
    page.get_by_role("link", name="remove the range val_loss ≤ 0.35").click()
    expect(page.locator("table.trials tbody tr")).to_have_count(5)  # lr ≥ 0.0015: numbers 1 to 5
    expect(page).not_to_have_url(re.compile("val_loss"))


def test_a_range_nothing_meets_says_so(page_of: Any, team: Team,
                                       searched: dict[str, Any]) -> None:
    page = page_of("vera")
    page.goto(f"{team.server.url}/experiments/{searched['id']}?where=hparam:lr:5:")
    expect(page.locator("table.trials tbody")).to_contain_text("No trial in these ranges.")
    page.goto(f"{team.server.url}/experiments/{searched['id']}?where=metric:loss:0:1")
    expect(page.locator("#live .banner.warn")).to_contain_text(
        "filter by one of its validation metrics: val_loss")


def test_columns_hide_and_show_again_with_the_address(
        page_of: Any, team: Team, searched: dict[str, Any]) -> None:
    page = page_of("vera")
    page.goto(f"{team.server.url}/experiments/{searched['id']}")
    heads = page.locator("table.trials thead th")
    expect(heads).to_contain_text(["lr", "model.hidden", "best val_loss"])
    page.locator('a.hide-column[data-column="hparam:model.hidden"]').click()
    expect(heads.filter(has_text="model.hidden")).to_have_count(0)  # swapped: click the new
    page.locator('a.hide-column[data-column="metric:val_loss"]').click()
    expect(page).to_have_url(re.compile(r"hide=hparam%3Amodel\.hidden&hide=metric%3Aval_loss"))
    expect(heads.filter(has_text="model.hidden")).to_have_count(0)
    expect(heads.filter(has_text="val_loss")).to_have_count(0)
    first = page.locator("table.trials tbody tr").first.locator("td")
    expect(first).to_have_count(heads.count())  # each row lost the same cells
    page.get_by_label("to", exact=True).fill("0.0025")  # a filter keeps the hidden columns
    page.get_by_label("range of").select_option("hparam:lr")
    page.get_by_role("button", name="Filter").click()
    expect(page.locator("table.trials tbody tr")).to_have_count(2)
    expect(heads.filter(has_text="model.hidden")).to_have_count(0)
    page.reload()
    expect(heads.filter(has_text="val_loss")).to_have_count(0)
    page.get_by_label("show the column val_loss").click()
    expect(heads.filter(has_text="best val_loss")).to_have_count(1)
    expect(page).to_have_url(re.compile(r"hide=hparam%3Amodel\.hidden"))
    expect(page).not_to_have_url(re.compile(r"metric%3Aval_loss"))
