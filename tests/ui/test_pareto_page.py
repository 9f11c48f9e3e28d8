"""A multi-objective search end to end: real trials drawn by NSGA-II on two objectives
that disagree, their Pareto front from the API, on the command line and drawn on the
experiment's page in Chromium."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import expect

from tests.cli.test_cli import muster
from tests.ui.conftest import Team

pytestmark = pytest.mark.lifecycle  # a real server, real trials, a real browser

# val_loss is best at lr = 0.2, latency at the smallest lr: below 0.2 they disagree.
TRAIN = """\
import muster.harness as mh

with mh.init() as ctx:
    lr = ctx.hparams["lr"]
    for epoch in range(1, 4):
        ctx.report_validation(epoch, {"val_loss": (lr - 0.2) ** 2 + 1.0 / epoch,
                                      "latency": 10 * lr + 1.0 / epoch})
"""

SEARCH = """\
name: pareto-search
entrypoint: python train.py
harness: true
verify: {require_checkpoint: false}
hyperparameters:
  lr: {type: double, minval: 0.05, maxval: 0.95}
searcher:
  name: nsga2
  metrics: [{name: val_loss}, {name: latency}]
  max_trials: 12
  max_concurrent_trials: 4
reproducibility: {experiment_seed: 5}
"""


def _front(trials: dict[int, float]) -> set[int]:
    """The trials no other beats on both objectives, from their lr (as train.py ends)."""
    costs = {t: ((lr - 0.2) ** 2 + 1 / 3, 10 * lr + 1 / 3) for t, lr in trials.items()}
    return {t for t, (a, b) in costs.items()
            if not any(x <= a and y <= b and (x, y) != (a, b) for x, y in costs.values())}


@pytest.fixture(scope="module")
def finished(team: Team, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    context = tmp_path_factory.mktemp("pareto-search")
    (context / "train.py").write_text(TRAIN)
    ended = team.run_to_the_end(SEARCH, context)
    with team.client("alice") as alice:
        front = alice.pareto_front(ended["id"])
        whole = alice.get_experiment(ended["id"])
    lrs = {t["id"]: t["hparams"]["lr"] for t in whole["trials"]}
    return {"id": ended["id"], "front": front, "lrs": lrs, "search": whole["search"]}


def test_the_front_is_the_trials_no_other_beats(finished: dict[str, Any]) -> None:
    front, lrs = finished["front"], finished["lrs"]
    assert len(lrs) == 12 and finished["search"]["searcher"] == "nsga2"
    assert finished["search"]["objectives"] == [
        {"name": "val_loss", "smaller_is_better": True},
        {"name": "latency", "smaller_is_better": True}]
    assert (len(front["points"]), front["without_values"]) == (12, 0)
    on_front = [p for p in front["points"] if p["on_front"]]
    assert {p["trial_id"] for p in on_front} == _front(lrs)
    assert front["points"][:front["front"]] == on_front  # the front first ...
    losses = [p["values"]["val_loss"] for p in on_front]
    assert losses == sorted(losses)  # ... by the first objective
    for point in front["points"]:  # each as it ended: its epoch 3 report
        lr = lrs[point["trial_id"]]
        assert point["values"] == pytest.approx({"val_loss": (lr - 0.2) ** 2 + 1 / 3,
                                                 "latency": 10 * lr + 1 / 3})


def test_experiment_best_prints_the_front(team: Team, finished: dict[str, Any],
                                          tmp_path: Path) -> None:
    args = ("experiment", "best", str(finished["id"]))
    done = muster(tmp_path, team.server.url, *args, "--json", token=team.tokens["vera"])
    assert done.returncode == 0, done.stderr
    listed = json.loads(done.stdout)
    assert [p["trial_id"] for p in listed] == [
        p["trial_id"] for p in finished["front"]["points"] if p["on_front"]]
    text = muster(tmp_path, team.server.url, *args, token=team.tokens["vera"])
    assert text.returncode == 0, text.stderr
    assert text.stdout.startswith(f"Pareto front of experiment {finished['id']}: "
                                  f"{finished['front']['front']} trial")
    assert "val_loss (smaller is better), latency (smaller is better)" in text.stdout


def test_the_page_draws_the_front(page_of: Any, team: Team, finished: dict[str, Any]) -> None:
    page = page_of("vera")
    page.goto(f"{team.server.url}/experiments/{finished['id']}")
    box = page.locator("#pareto[data-drawn]")
    on_front = [p for p in finished["front"]["points"] if p["on_front"]]
    expect(box).to_have_attribute("data-front", ",".join(str(p["trial_id"]) for p in on_front))
    expect(box).to_have_attribute("data-points", "12")
    expect(page.locator("#pareto canvas")).to_have_count(1)
    expect(page.locator("#pareto .pareto-list tbody tr")).to_have_count(len(on_front))
    expect(page.locator("#pareto-note")).to_contain_text(
        f"{len(on_front)} trial{'s are' if len(on_front) != 1 else ' is'} on the front")
    first = page.locator("#pareto .pareto-list tbody tr").first
    expect(first.locator("a")).to_have_attribute("href", f"/trials/{on_front[0]['trial_id']}")
    plotted = page.evaluate(
        "document.querySelector('#pareto .pareto-chart').musterPlotted.filter(p => p.front)"
        ".map(p => p.trial)")
    assert sorted(plotted) == sorted(p["trial_id"] for p in on_front)
