"""Charts in Chromium over a real search: one learning curve per trial, the best trial
marked, the metric against each hyperparameter, importance by PED-ANOVA, a trial's metrics,
and the trials table sorted, filtered and paged on the server."""

from __future__ import annotations

import re
from typing import Any

import httpx
import pytest
from playwright.sync_api import expect

from tests.ui.conftest import Team

pytestmark = pytest.mark.lifecycle  # a real server, real trials, a real browser

# Validation loss falls with the epochs, lower for a larger lr: the best trial is the one
# with the largest lr.
TRAIN = """\
import muster.harness as mh

with mh.init() as ctx:
    lr = ctx.hparams["lr"]
    for epoch in range(1, 6):
        ctx.report_training(epoch, {"loss": 1.0 / epoch})
        ctx.report_validation(epoch, {"val_loss": (1.0 - lr) / epoch})
"""

SEARCH = """\
name: chart-search
entrypoint: python train.py
harness: true
verify: {require_checkpoint: false}  # a few metrics, no model: nothing to keep
hyperparameters:
  lr: {type: double, minval: 0.05, maxval: 0.95}
  width: {type: categorical, vals: [8, 16]}
searcher: {name: random, metric: val_loss, max_trials: 12, max_concurrent_trials: 4}
"""


@pytest.fixture(scope="module")
def finished_search(team: Team, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    context = tmp_path_factory.mktemp("chart-search")
    (context / "train.py").write_text(TRAIN)
    ended = team.run_to_the_end(SEARCH, context)
    with team.client("alice") as alice:
        best = alice.best_trial(ended["id"])
    return {"id": ended["id"], "trials": ended["trials"], "best": best}


def test_one_curve_per_trial_and_the_best_trial(page_of: Any, team: Team,
                                                finished_search: dict[str, Any]) -> None:
    page = page_of("vera")
    page.goto(f"{team.server.url}/experiments/{finished_search['id']}")
    curves = page.locator("#curves[data-drawn]")
    expect(curves).to_have_attribute("data-curves", "12")
    expect(curves).to_have_attribute("data-best", str(finished_search["best"]["number"]))
    expect(page.locator("#curves canvas")).to_have_count(1)
    expect(page.locator("#curves-note")).to_contain_text(
        f"black: the best trial, #{finished_search['best']['number']}")
    expect(page.locator(".best")).to_contain_text(f"trial #{finished_search['best']['number']}")
    expect(page.locator("tr.best-row")).to_contain_text(f"trial {finished_search['best']['id']}")
    page.locator("#hp-charts").scroll_into_view_if_needed()  # drawn once near the screen
    hp = page.locator("#hp-charts[data-drawn] .hp-chart")
    expect(hp).to_have_count(2)
    expect(hp.first).to_contain_text("lr")
    bars = page.locator("#importance[data-drawn] .bar")
    expect(bars).to_have_count(2)  # width varies too ...
    expect(bars.first).to_contain_text("lr")  # ... but only lr drives the metric: first
    expect(page.locator("#importance")).to_contain_text("PedAnovaImportanceEvaluator")


def test_the_charts_under_the_curves_are_read_once_scrolled_near(
        page_of: Any, team: Team, finished_search: dict[str, Any]) -> None:
    """A visit that never scrolls down reads neither the hyperparameters' trials nor the
    importance; scrolling near them draws them."""
    page = page_of("vera")
    page.set_viewport_size({"width": 1280, "height": 300})
    fetched: list[str] = []
    page.on("request", lambda request: fetched.append(request.url))
    page.goto(f"{team.server.url}/experiments/{finished_search['id']}")
    expect(page.locator("#curves")).to_have_attribute("data-drawn", "true")
    # Out of reach (the page reads what comes within 400 px of the screen), as laid out.
    assert page.evaluate("document.getElementById('hp-charts').getBoundingClientRect().top"
                         " - innerHeight") > 400
    page.wait_for_timeout(500)  # room for a wrong eager fetch to show
    assert not [url for url in fetched if "/importance" in url or "state=SUCCEEDED" in url]
    assert page.locator("#hp-charts").get_attribute("data-drawn") is None
    page.locator("#importance").scroll_into_view_if_needed()
    expect(page.locator("#hp-charts[data-drawn] .hp-chart")).to_have_count(2)
    expect(page.locator("#importance[data-drawn] .bar")).to_have_count(2)
    assert [url for url in fetched if "/importance" in url]


def test_the_trials_table_sorts_and_filters_on_the_server(
        page_of: Any, team: Team, finished_search: dict[str, Any]) -> None:
    """Sorting, filtering and paging fetch the table alone: the page is not reloaded, its
    charts are not fetched again, and the address carries the table's words beside the
    events' (a reload shows the same)."""
    page = page_of("vera")
    page.goto(f"{team.server.url}/experiments/{finished_search['id']}?ev_kind=created")
    expect(page.locator("#curves")).to_have_attribute("data-drawn", "true")
    # Every chart's first fetch answered before the count starts (the importance's last).
    page.locator("#importance").scroll_into_view_if_needed()
    expect(page.locator("#importance")).to_have_attribute("data-drawn", "true")
    page.evaluate("window.scrollTo(0, 0)")
    page.evaluate("window.__notReloaded = true")
    fetched: list[str] = []
    page.on("request", lambda request: fetched.append(request.url))
    page.get_by_role("link", name="best val_loss").click()
    first = page.locator("table.trials tbody tr").first
    expect(first).to_contain_text(f"trial {finished_search['best']['id']}")
    expect(page).to_have_url(re.compile(r"ev_kind=created&sort=val_loss"))
    page.get_by_role("link", name="lr").click()
    lrs = [t["hparams"]["lr"] for t in finished_search["trials"]]
    expect(page.locator("table.trials tbody tr").first).to_contain_text(f"{min(lrs):.4g}")
    page.get_by_label("FAILED").check()
    page.get_by_role("button", name="Filter").click()
    expect(page.locator("table.trials tbody")).to_contain_text("No trial in these states.")
    expect(page).to_have_url(re.compile(r"state=FAILED"))
    assert page.evaluate("window.__notReloaded === true"), "the page was reloaded"
    assert not [url for url in fetched if "/curves" in url or "/importance" in url], fetched
    page.reload()  # the address holds the table's state
    expect(page.get_by_label("FAILED")).to_be_checked()
    expect(page.locator("table.trials tbody")).to_contain_text("No trial in these states.")


def test_a_trial_page_charts_each_metric(page_of: Any, team: Team,
                                         finished_search: dict[str, Any]) -> None:
    page = page_of("vera")
    page.goto(f"{team.server.url}/trials/{finished_search['best']['id']}")
    charts = page.locator("#metric-charts[data-drawn]")
    expect(charts).to_have_attribute("data-curves", "2")
    expect(charts).to_contain_text("training loss (5 reports")
    expect(charts).to_contain_text("validation val_loss (5 reports")


def test_charts_read_only_the_public_api(team: Team, finished_search: dict[str, Any]) -> None:
    """What the page draws is what the API answers: the curves' points are the reports."""
    with team.client("vera") as vera:
        trial = finished_search["best"]
        reports = vera.all_metrics(trial["id"], kind="validation")
        answer = httpx.get(f"{team.server.url}/api/v1/experiments/{finished_search['id']}/curves",
                           headers={"Authorization": f"Bearer {team.tokens['vera']}"},
                           timeout=30).json()
    (mine,) = [t for t in answer["trials"] if t["trial_id"] == trial["id"]]
    assert mine["steps"] == [r["step"] for r in reports]
    assert mine["values"] == [r["metrics"]["val_loss"] for r in reports]
