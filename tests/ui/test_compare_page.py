"""Comparing trials in Chromium against a real server: trials picked in an experiment's
table are kept in the address across sorting and a reload, and open /compare, which shows
them side by side (differing rows marked), links each pair's snapshot diff and overlays
their curves from the public API."""

from __future__ import annotations

import re
from typing import Any

import pytest
from playwright.sync_api import expect

from tests.server.test_search_views import add_experiment, add_trial, losses, search_config
from tests.store.rows import add_metric
from tests.ui.conftest import Team

pytestmark = pytest.mark.lifecycle  # a real server, a real browser


@pytest.fixture(scope="module")
def searched(team: Team) -> dict[str, Any]:
    """A COMPLETED search of four trials: number n has lr 0.001 * (n + 1), hidden 64, and
    val_loss falling over three steps to 0.1 * (n + 1); number 0 also reported a training
    loss."""
    with team.server.store() as store, store.session_scope() as s:
        exp = add_experiment(s, search_config(max_trials=4), state="COMPLETED", max_trials=4)
        trials = [add_trial(s, exp, n, validation=losses(*(0.1 * (n + 1) * k for k in (3, 2, 1))))
                  for n in range(4)]
        add_metric(s, trials[0], {"loss": 1.0}, step=1, kind="training")
        return {"id": exp.id, "trials": [t.id for t in trials]}


def test_picked_trials_stay_in_the_address_and_open_the_compare_page(
        page_of: Any, team: Team, searched: dict[str, Any]) -> None:
    t0, t1, t2, _ = searched["trials"]
    page = page_of("vera")
    page.goto(f"{team.server.url}/experiments/{searched['id']}")
    link = page.locator("#compare-link")
    expect(link).to_be_hidden()
    page.get_by_label(f"compare trial {t2}").check()
    page.get_by_label(f"compare trial {t0}").check()
    expect(link).to_have_text("Compare 2 trials")
    expect(page).to_have_url(re.compile(f"compare={t2}%2C{t0}"))
    page.get_by_role("link", name="best val_loss").click()  # the table is swapped in again
    expect(page).to_have_url(re.compile(f"sort=val_loss.*compare={t2}%2C{t0}|compare={t2}%2C{t0}.*sort=val_loss"))
    expect(page.get_by_label(f"compare trial {t2}")).to_be_checked()
    page.reload()
    expect(page.get_by_label(f"compare trial {t0}")).to_be_checked()
    page.get_by_label(f"compare trial {t1}").check()
    page.get_by_label(f"compare trial {t2}").uncheck()
    expect(link).to_have_attribute("href", f"/compare?trials={t0},{t1}")
    link.click()

    page.wait_for_url(re.compile(r"/compare\?trials="))
    heads = page.locator("#compare-table thead th")
    expect(heads.nth(1)).to_contain_text(f"trial {t0}")
    expect(heads.nth(2)).to_contain_text(f"trial {t1}")
    expect(page.locator('tr[data-row="hparam:lr"]')).to_have_class("differs")
    expect(page.locator('tr[data-row="hparam:model.hidden"]')).not_to_have_class("differs")
    expect(page.locator('tr[data-row="best val_loss"] td')).to_have_text(["0.1", "0.2"])
    expect(page.locator('tr[data-row="last training loss"] td')).to_have_text(["1", "\N{EN DASH}"])
    expect(page.locator("#snapshot-diffs a")).to_have_attribute(
        "href", f"/trials/{t0}/diff?other={t1}")
    curves = page.locator("#compare-curves[data-drawn]")
    expect(curves).to_have_attribute("data-drawn", "validation:val_loss")
    expect(curves).to_have_attribute("data-curves", "2")
    expect(page.locator("#compare-curves canvas")).to_have_count(1)
    page.get_by_label("Metric", exact=True).select_option("training:loss")
    expect(curves).to_have_attribute("data-curves", "1")
    expect(page.locator("#compare-note")).to_have_text("1 of 2 trials reported training loss.")
    expect(page).to_have_url(re.compile(r"metric=training%3Aloss"))
    page.reload()  # the address keeps the metric drawn
    expect(curves).to_have_attribute("data-drawn", "training:loss")


@pytest.mark.parametrize(("query", "status", "says"), [
    ("trials=1;2", 400, "ids separated by commas"),
    ("trials=", 400, "compare 1 to 20 trials, got 0"),
    ("trials=999999", 404, "no trial 999999"),
    ("trials=1&experiments=1", 400, "not both at once"),
    ("experiments=999999", 404, "experiment 999999 does not exist"),
])
def test_a_bad_compare_address_is_a_page_that_says_why(
        page_of: Any, team: Team, query: str, status: int, says: str) -> None:
    page = page_of("vera")
    answer = page.goto(f"{team.server.url}/compare?{query}")
    assert answer is not None and answer.status == status
    expect(page.locator("main")).to_contain_text(says)


def test_two_experiments_compare_by_config_best_trial_and_curve(
        page_of: Any, team: Team, searched: dict[str, Any]) -> None:
    with team.server.store() as store, store.session_scope() as s:
        other = add_experiment(s, search_config(max_trials=2), state="COMPLETED", max_trials=2)
        best = add_trial(s, other, 0, validation=losses(0.9, 0.05))
        other_id, other_best = other.id, best.id
    page = page_of("vera")
    page.goto(f"{team.server.url}/experiments/{searched['id']}")
    page.get_by_label("experiments to compare").fill(f"{searched['id']},{other_id}")
    page.get_by_role("button", name="Compare", exact=True).click()
    page.wait_for_url(re.compile(r"/compare\?experiments="))
    stand_ins = page.locator('#compare-experiments tr[data-row="stand-in"] td')
    expect(stand_ins).to_have_text([f"trial {searched['trials'][0]}, its best",
                                    f"trial {other_best}, its best"])
    diff = page.locator(f'#config-diffs [data-diff="{other_id}"]')
    expect(diff).to_contain_text("-  max_trials: 4")
    expect(diff).to_contain_text("+  max_trials: 2")
    expect(page.locator('tr[data-row="best val_loss"] td')).to_have_text(["0.1", "0.05"])
    curves = page.locator("#compare-curves[data-drawn]")
    expect(curves).to_have_attribute("data-drawn", "validation:val_loss")
    expect(curves).to_have_attribute("data-curves", "2")
    expect(page.locator("#compare-note")).to_have_text(
        "2 of 2 trials reported validation val_loss.")
