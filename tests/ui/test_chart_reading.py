"""Charts one can read and trust (issue 33), in Chromium over a seeded search: each chart's
plotted points are the API's, an integer hyperparameter's shared value keeps every trial
(jittered by trial id), log axes are labelled at each decade, categories are strips;
hovering names the trial, x and y; a click opens the trial; a drag zooms and "Reset zoom"
or a double-click undoes it; the legend's search and selection highlight trials and dim
the rest."""

from __future__ import annotations

import math
import random
import re
import time
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from playwright.sync_api import expect
from sqlalchemy import insert, select

from muster.config import load_config
from muster.states import ExperimentState, TrialState
from muster.store import Experiment, Metric, Trial, User, series
from tests.ui.conftest import Team

pytestmark = pytest.mark.lifecycle  # a real server, a real browser

CONFIG = """\
name: chart-reading
entrypoint: python train.py
hyperparameters:
  k: {type: int, minval: 1, maxval: 5}
  lr: {type: log, minval: -6, maxval: -4, base: 10}
  opt: {type: categorical, vals: [adam, sgd]}
  flag: {type: categorical, vals: [true, false]}
searcher: {name: random, metric: val_loss, max_trials: 40}
"""
TRIALS = 40
TOP_K = 30  # trials with k=5, the top value: each one must be drawn


@pytest.fixture(scope="module")
def seeded(team: Team) -> int:
    """A COMPLETED search of TRIALS SUCCEEDED trials, three validation reports each, written
    as ingestion writes them; the pages read it through the API."""
    rng = random.Random(33)
    with team.server.store() as store, store.session_scope() as s:
        owner = s.scalar(select(User.id).where(User.name == "alice"))
        exp = Experiment(name="chart-reading", config=load_config(CONFIG).to_json_dict(),
                         config_yaml=CONFIG, context_dir="/nonexistent", owner_id=owner,
                         state=ExperimentState.COMPLETED.value, max_trials=TRIALS,
                         ended_at=time.time())
        s.add(exp)
        s.flush()
        for number in range(TRIALS):
            hparams = {"k": 5 if number < TOP_K else 1 + number % 4,
                       "lr": 10 ** rng.uniform(-6, -4), "opt": rng.choice(["adam", "sgd"]),
                       "flag": number % 3 == 0}
            trial = Trial(experiment_id=exp.id, number=number, state=TrialState.SUCCEEDED.value,
                          hparams=hparams, search_state={"params": hparams, "attrs": {}},
                          started_at=time.time() - 60, ended_at=time.time())
            s.add(trial)
            s.flush()
            rows = [{"trial_id": trial.id, "attempt": 1, "rank": 0, "kind": "validation",
                     "step": step, "time": 1.0 + step,
                     "values": {"val_loss": round(rng.uniform(0.1, 2.0) / step, 6)}}
                    for step in (10, 20, 30)]
            s.execute(insert(Metric), rows)
            series.record(s, trial.id, rows)
        return int(exp.id)


def api(team: Team, path: str) -> Any:
    answer = httpx.get(f"{team.server.url}/api/v1{path}", timeout=30,
                       headers={"Authorization": f"Bearer {team.tokens['vera']}"})
    answer.raise_for_status()
    return answer.json()


def opened(page_of: Any, team: Team, experiment: int) -> Any:
    page = page_of("vera")
    page.goto(f"{team.server.url}/experiments/{experiment}")
    expect(page.locator("#curves[data-drawn]")).to_have_attribute("data-curves", str(TRIALS))
    page.locator("#hp-charts").scroll_into_view_if_needed()  # drawn once near the screen
    expect(page.locator("#hp-charts[data-drawn] .hp-chart")).to_have_count(4)
    page.evaluate("window.scrollTo(0, 0)")
    return page


def plotted(page: Any, selector: str) -> list[dict[str, Any]]:
    points: list[dict[str, Any]] = page.evaluate(
        "s => document.querySelector(s).musterPlotted.map(p => ({trial: p.trial, x: p.x, "
        "y: p.y, at: p.at}))", selector)
    return points


def hp_points(team: Team, experiment: int, name: str) -> set[tuple[int, Any, float]]:
    trials = api(team, f"/experiments/{experiment}/trials?state=SUCCEEDED&limit=1000")
    return {(t["id"], t["hparams"][name], t["best_validation"]["val_loss"]) for t in trials}


def test_the_curves_plot_the_apis_points(page_of: Any, team: Team, seeded: int) -> None:
    page = opened(page_of, team, seeded)
    answer = api(team, f"/experiments/{seeded}/curves")
    expected = sorted((t["trial_id"], x, y) for t in answer["trials"]
                      for x, y in zip(t["steps"], t["values"], strict=True))
    drawn = sorted((p["trial"], p["x"], p["y"]) for p in plotted(page, "#curves"))
    assert drawn == expected
    assert len(drawn) == TRIALS * 3


def test_an_integer_hyperparameter_draws_every_trial(page_of: Any, team: Team,
                                                     seeded: int) -> None:
    page = opened(page_of, team, seeded)
    points = plotted(page, '.hp-chart[data-hparam="k"]')
    assert {(p["trial"], p["x"], p["y"]) for p in points} == hp_points(team, seeded, "k")
    assert len(points) == TRIALS
    for p in points:
        assert abs(p["at"] - p["x"]) <= 0.3, p
    top = [p["at"] for p in points if p["x"] == 5]
    assert len(top) == TOP_K and len(set(top)) == TOP_K  # every one, each at its own place
    ticks = page.evaluate('document.querySelector(\'.hp-chart[data-hparam="k"]\').musterTicks')
    assert ticks["labels"] == ["1", "2", "3", "4", "5"]
    again = opened(page_of, team, seeded)  # the jitter is the trial's: the same picture
    assert plotted(again, '.hp-chart[data-hparam="k"]') == points


def test_a_log_hyperparameter_is_labelled_at_each_decade(page_of: Any, team: Team,
                                                         seeded: int) -> None:
    page = opened(page_of, team, seeded)
    chart = '.hp-chart[data-hparam="lr"]'
    points = plotted(page, chart)
    assert {(p["trial"], p["x"], p["y"]) for p in points} == hp_points(team, seeded, "lr")
    assert all(p["at"] == p["x"] for p in points)
    axis = page.evaluate("s => { const el = document.querySelector(s); return {ticks: "
                         "el.musterTicks, drawn: el.chart.axes[0]._values, "
                         "at: [1e-6, 1e-5, 1e-4].map(v => el.chart.valToPos(v, 'x'))}; }",
                         chart)
    assert axis["ticks"]["labels"] == ["1e-6", "1e-5", "1e-4"]
    assert axis["drawn"] == ["1e-6", "1e-5", "1e-4"]  # what uPlot wrote on the axis
    low, middle, high = axis["at"]
    assert math.isclose(middle - low, high - middle, rel_tol=1e-6)  # a log scale


def test_categories_are_strips_with_their_labels(page_of: Any, team: Team,
                                                 seeded: int) -> None:
    page = opened(page_of, team, seeded)
    for name, labels in (("opt", ["adam", "sgd"]), ("flag", ["false", "true"])):
        chart = f'.hp-chart[data-hparam="{name}"]'
        points = plotted(page, chart)
        assert {(p["trial"], p["x"], p["y"]) for p in points} == hp_points(team, seeded, name)
        ticks = page.evaluate("s => document.querySelector(s).musterTicks", chart)
        assert ticks["labels"] == labels
        for p in points:
            assert abs(p["at"] - labels.index(str(p["x"]).lower())) <= 0.3, p


def pixel_of_loneliest(page: Any, selector: str) -> dict[str, Any]:
    """The point of the chart farthest from any other, with where it is on the screen."""
    page.locator(selector).scroll_into_view_if_needed()
    found: dict[str, Any] = page.evaluate("""s => {
      const el = document.querySelector(s), u = el.chart, box = u.over.getBoundingClientRect();
      const at = el.musterPlotted.map(p => [u.valToPos(p.at, 'x'), u.valToPos(p.y, 'y'), p]);
      let best = null, far = -1;
      for (const [x, y, p] of at) {
        let near = Infinity;
        for (const [x2, y2, q] of at) {
          if (q !== p) { near = Math.min(near, Math.hypot(x - x2, y - y2)); }
        }
        if (near > far) { far = near; best = {trial: p.trial, x: p.x, y: p.y,
                                               left: box.left + x, top: box.top + y}; }
      }
      return best;
    }""", selector)
    return found


def test_hover_names_the_trial_and_a_click_opens_it(page_of: Any, team: Team,
                                                    seeded: int) -> None:
    page = opened(page_of, team, seeded)
    point = pixel_of_loneliest(page, '.hp-chart[data-hparam="k"]')
    page.mouse.move(point["left"], point["top"])
    tip = page.locator('.hp-chart[data-hparam="k"] .chart-tip')
    expect(tip).to_be_visible()
    expect(tip).to_contain_text(f"trial {point['trial']} ")
    expect(tip).to_contain_text(f"k {point['x']} ")
    expect(tip).to_contain_text(f"val_loss {point['y']:.4g}")  # as the page writes numbers
    # the hovered trial stands out in every chart of the page
    best = api(team, f"/experiments/{seeded}/best")["id"]
    expect(page.locator("#curves")).to_have_js_property(
        "musterHighlighted", sorted({best, point["trial"]}, key=lambda t: t == point["trial"]))
    page.mouse.click(point["left"], point["top"])
    page.wait_for_url(f"**/trials/{point['trial']}")
    expect(page.locator("h1")).to_contain_text(str(point["trial"]))


def test_a_curve_click_opens_its_trial(page_of: Any, team: Team, seeded: int) -> None:
    page = opened(page_of, team, seeded)
    point = pixel_of_loneliest(page, "#curves")
    page.mouse.move(point["left"], point["top"])
    expect(page.locator("#curves .chart-tip")).to_contain_text(
        f"trial {point['trial']} (#")
    expect(page.locator("#curves .chart-tip")).to_contain_text(f"step {point['x']} ")
    page.mouse.click(point["left"], point["top"])
    page.wait_for_url(f"**/trials/{point['trial']}")


def x_scale(page: Any) -> list[float]:
    scale: list[float] = page.evaluate(
        "() => { const s = document.querySelector('#curves').chart.scales.x; "
        "return [s.min, s.max]; }")
    return scale


def test_drag_zooms_and_reset_or_double_click_undoes_it(page_of: Any, team: Team,
                                                        seeded: int) -> None:
    page = opened(page_of, team, seeded)
    whole = x_scale(page)
    page.locator("#curves").scroll_into_view_if_needed()
    box = page.locator("#curves .u-over").bounding_box()
    y = box["y"] + box["height"] / 2
    for undo in ("button", "double-click"):
        page.mouse.move(box["x"] + box["width"] * 0.25, y)
        page.mouse.down()
        page.mouse.move(box["x"] + box["width"] * 0.4, y, steps=5)
        page.mouse.move(box["x"] + box["width"] * 0.5, y, steps=5)
        page.mouse.up()
        page.wait_for_function(
            "w => document.querySelector('#curves').chart.scales.x.min > w", arg=whole[0])
        low, high = x_scale(page)
        span = whole[1] - whole[0]
        assert math.isclose(low, whole[0] + 0.25 * span, rel_tol=0.02)
        assert math.isclose(high, whole[0] + 0.5 * span, rel_tol=0.02)
        assert urlsplit(page.url).path == f"/experiments/{seeded}"  # a drag is not a click
        if undo == "button":
            page.locator("#curves").get_by_role("button", name="Reset zoom").click()
        else:
            page.mouse.dblclick(box["x"] + box["width"] * 0.9, box["y"] + 4)
        page.wait_for_function(
            "w => document.querySelector('#curves').chart.scales.x.min === w", arg=whole[0])
        assert x_scale(page) == whole


def highlighted(page: Any, selector: str) -> set[int]:
    return set(page.evaluate("s => document.querySelector(s).musterHighlighted", selector))


def test_the_legend_finds_and_selects_trials_and_dims_the_rest(page_of: Any, team: Team,
                                                               seeded: int) -> None:
    page = opened(page_of, team, seeded)
    trials = api(team, f"/experiments/{seeded}/trials?state=SUCCEEDED&limit=1000")
    best = api(team, f"/experiments/{seeded}/best")["id"]
    assert highlighted(page, "#curves") == {best}  # nothing asked: only the best stands out
    page.get_by_label("Find trials").fill("k=3 opt=sgd")
    found = {t["id"] for t in trials if t["hparams"]["k"] == 3 and t["hparams"]["opt"] == "sgd"}
    assert found
    expect(page.locator(".legend-count")).to_have_text(f"{len(found)} of {TRIALS} trials match")
    expect(page.locator("ul.legend-list li:visible")).to_have_count(len(found))
    for chart in ("#curves", '.hp-chart[data-hparam="lr"]'):
        page.wait_for_function("([s, n]) => document.querySelector(s).musterHighlighted.length"
                               " === n", arg=[chart, len(found | {best})])
        assert highlighted(page, chart) == found | {best}
    page.get_by_label("Find trials").fill("")
    other = next(t for t in trials if t["id"] not in found | {best})
    page.locator(f'ul.legend-list li[data-trial="{other["id"]}"] input').check()
    page.wait_for_function("() => document.querySelector('#curves').musterHighlighted.length"
                           " === 2")
    assert highlighted(page, "#curves") == {other["id"], best}
    page.get_by_role("button", name="Clear selection").click()
    page.wait_for_function("() => document.querySelector('#curves').musterHighlighted.length"
                           " === 1")


def test_a_trial_page_plots_its_series_with_hover(page_of: Any, team: Team,
                                                  seeded: int) -> None:
    trial = api(team, f"/experiments/{seeded}/best")["id"]
    page = page_of("vera")
    page.goto(f"{team.server.url}/trials/{trial}")
    expect(page.locator("#metric-charts[data-drawn]")).to_have_attribute("data-curves", "1")
    (only,) = api(team, f"/trials/{trial}/series")["series"]
    drawn = plotted(page, "#metric-charts .hp-chart")
    assert [(p["x"], p["y"]) for p in drawn] == list(zip(only["steps"], only["values"],
                                                         strict=True))
    point = pixel_of_loneliest(page, "#metric-charts .hp-chart")
    page.mouse.move(point["left"], point["top"])
    expect(page.locator("#metric-charts .chart-tip")).to_contain_text(
        f"step {point['x']} · val_loss")
    # between two reports, on the line: the curve is found, and its report nearer the cursor
    between = page.evaluate("""() => {
      const el = document.querySelector('#metric-charts .hp-chart'), u = el.chart;
      const box = u.over.getBoundingClientRect(), [a, b] = el.musterPlotted;
      const [ax, ay] = [u.valToPos(a.at, 'x'), u.valToPos(a.y, 'y')];
      const [bx, by] = [u.valToPos(b.at, 'x'), u.valToPos(b.y, 'y')];
      return {left: box.left + ax + 0.4 * (bx - ax), top: box.top + ay + 0.4 * (by - ay),
              step: a.x};
    }""")
    page.mouse.move(between["left"], between["top"])
    expect(page.locator("#metric-charts .chart-tip")).to_contain_text(
        f"step {between['step']} · val_loss")
    page.mouse.move(between["left"], between["top"] - 40)  # off the line: no tip
    expect(page.locator("#metric-charts .chart-tip")).to_be_hidden()


def test_the_charts_keep_their_zoom_search_and_selection_in_the_address(
        page_of: Any, team: Team, seeded: int) -> None:
    """A reload (or the link, shared) shows the same picture: the zoom, the legend's search
    and the selected trials are words of the address, beside the table's."""
    page = opened(page_of, team, seeded)
    trials = api(team, f"/experiments/{seeded}/trials?state=SUCCEEDED&limit=1000")
    whole = x_scale(page)
    page.locator("#curves").scroll_into_view_if_needed()
    box = page.locator("#curves .u-over").bounding_box()
    y = box["y"] + box["height"] / 2
    page.mouse.move(box["x"] + box["width"] * 0.25, y)
    page.mouse.down()
    page.mouse.move(box["x"] + box["width"] * 0.5, y, steps=5)
    page.mouse.up()
    page.wait_for_function(
        "w => document.querySelector('#curves').chart.scales.x.min > w", arg=whole[0])
    zoomed = x_scale(page)
    page.get_by_label("Find trials").fill("k=3")
    chosen = next(t["id"] for t in trials if t["hparams"]["k"] == 3)
    page.locator(f'ul.legend-list li[data-trial="{chosen}"] input').check()
    expect(page).to_have_url(re.compile(r"zoom\.curves="))
    expect(page).to_have_url(re.compile(rf"sel={chosen}"))
    expect(page).to_have_url(re.compile(r"find=k%3D3"))
    page.get_by_role("link", name="State").click()  # the table's sort keeps the charts' words
    expect(page).to_have_url(re.compile(r"order_by=state"))
    expect(page).to_have_url(re.compile(rf"sel={chosen}"))

    page.reload()
    expect(page.locator("#curves[data-drawn]")).to_have_attribute("data-curves", str(TRIALS))
    page.wait_for_function(
        "w => document.querySelector('#curves').chart.scales.x.min > w", arg=whole[0])
    assert x_scale(page) == pytest.approx(zoomed)
    expect(page.get_by_label("Find trials")).to_have_value("k=3")
    expect(page.locator(f'ul.legend-list li[data-trial="{chosen}"] input')).to_be_checked()
    assert chosen in highlighted(page, "#curves")
