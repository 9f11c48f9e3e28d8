"""The experiment page's parallel coordinates in Chromium against a real server: an axis per
searched hyperparameter and the searcher's metric, a line per trial; brushing an axis with
the mouse filters the trials table (its address too), and a reload draws the same brush."""

from __future__ import annotations

import re
from typing import Any

import pytest
from playwright.sync_api import expect

from tests.server.test_search_views import add_experiment, add_trial, losses, search_config
from tests.ui.conftest import Team
from tests.waiting import wait_until

pytestmark = pytest.mark.lifecycle  # a real server, a real browser


@pytest.fixture(scope="module")
def searched(team: Team) -> dict[str, Any]:
    """A COMPLETED search of eight trials: number n has val_loss 0.1 * (n + 1)."""
    with team.server.store() as store, store.session_scope() as s:
        exp = add_experiment(s, search_config(), state="COMPLETED")
        for n in range(8):
            add_trial(s, exp, n, validation=losses(0.1 * (n + 1)),
                      hparams={"lr": 0.001 * (n + 1), "model": {"hidden": 64 if n % 2 else 128}})
        return {"id": exp.id}


def _axis(page: Any, key: str) -> dict[str, float]:
    """Where the chart drew the axis `key`: its x and the y of its two ends, in the page."""
    return page.evaluate("""(key) => {
        const holder = document.getElementById("parallel");
        const chart = holder.chart;
        const index = chart.dimensions.findIndex((d) => d.key === key);
        const layout = chart._.dims.list[index].layout;
        const box = holder.querySelector("canvas").getBoundingClientRect();
        return {x: box.left + layout.bound.x + layout.axisDataStart.x,
                top: box.top + layout.bound.y + layout.axisDataStart.y,
                bottom: box.top + layout.bound.y + layout.axisDataStop.y};
    }""", key)


def test_brushing_an_axis_filters_the_table(page_of: Any, team: Team,
                                            searched: dict[str, Any]) -> None:
    page = page_of("vera")
    page.goto(f"{team.server.url}/experiments/{searched['id']}")
    page.locator("#parallel").scroll_into_view_if_needed()  # drawn once near the screen
    chart = page.locator("#parallel[data-axes]")
    expect(chart).to_have_attribute("data-axes", "3")  # lr, model.hidden, val_loss
    expect(chart).to_have_attribute("data-lines", "8")
    expect(page.locator("table.trials tbody tr")).to_have_count(8)
    # The charts above it, drawn once near the screen too, have their height now.
    expect(page.locator("#importance")).to_have_attribute("data-drawn", "true")
    expect(page.locator("#hp-charts")).to_have_attribute("data-drawn", "true")
    page.locator("#parallel").scroll_into_view_if_needed()
    axis = _axis(page, "metric:val_loss")
    span = axis["bottom"] - axis["top"]
    # The lower half of the axis: in horizontal layout its values grow upwards.
    page.mouse.move(axis["x"], axis["top"] + span * 0.55)
    page.mouse.down()
    page.mouse.move(axis["x"], axis["bottom"] - 1, steps=5)
    page.mouse.up()
    expect(page).to_have_url(re.compile(r"where=metric%3Aval_loss%3A"))
    rows = page.locator("table.trials tbody tr")
    expect(rows).not_to_have_count(8)
    expect(page.locator("#live")).to_have_count(1)  # the table replaced, not nested
    shown = rows.count()
    assert 1 <= shown < 8
    losses_shown = [float(text) for text in page.locator(
        "table.trials tbody tr td:nth-child(8)").all_inner_texts()]
    assert max(losses_shown) < 0.5, losses_shown  # the smaller half of the values
    page.reload()
    page.locator("#parallel").scroll_into_view_if_needed()
    expect(page.locator("#parallel[data-axes]")).to_have_attribute("data-lines", "8")
    expect(page.locator("table.trials tbody tr")).to_have_count(shown)
    # The address's range, drawn as the brush (once the chart has its size). Polled from
    # here: wait_for_function would evaluate a string in the page, which the CSP forbids.
    wait_until(lambda: page.evaluate(
        "Object.keys(document.getElementById('parallel').chart.filters)") == ["metric:val_loss"],
        timeout=15, what="the brush from the address")


def test_an_unfinished_search_s_chart_draws_its_new_trials_without_a_reload(
        page_of: Any, team: Team) -> None:
    """Drawn once scrolled near, then again as trials come (every 10 s, as the charts), while
    the experiment has not ended; the page is not reloaded."""
    with team.server.store() as store, store.session_scope() as s:
        exp = add_experiment(s, search_config(), state="PAUSED")  # not ended; nothing runs
        for n in range(3):
            add_trial(s, exp, n, validation=losses(0.1 * (n + 1)))
        experiment_id = exp.id
    page = page_of("vera")
    page.goto(f"{team.server.url}/experiments/{experiment_id}")
    page.evaluate("window.__notReloaded = true")
    page.locator("#parallel").scroll_into_view_if_needed()
    chart = page.locator("#parallel[data-axes]")
    expect(chart).to_have_attribute("data-lines", "3")
    with team.server.store() as store, store.session_scope() as s:
        add_trial(s, s.get(type(exp), experiment_id), 3, validation=losses(0.05))
    expect(chart).to_have_attribute("data-lines", "4", timeout=25_000)
    assert page.evaluate("window.__notReloaded") is True
