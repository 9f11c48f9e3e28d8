"""Trials side by side (the compare page's service), on the real store, both backends."""

from __future__ import annotations

import pytest

from muster.errors import InvalidRequest, NotFound
from muster.services import comparison
from muster.store import Store
from tests.server.test_search_views import add_experiment, add_trial, losses, search_config
from tests.store.rows import add_metric


def test_trials_of_two_experiments_side_by_side(shared_store: Store) -> None:
    with shared_store.session_scope() as s:
        smaller = add_experiment(s, search_config())
        larger = add_experiment(s, search_config(metric="val_acc", smaller_is_better=False))
        a = add_trial(s, smaller, 0, validation=losses(0.5, 0.2, 0.3),
                      hparams={"lr": 0.1, "model": {"hidden": 64}})
        b = add_trial(s, smaller, 1, "RUNNING", validation=losses(0.4),
                      hparams={"lr": 0.2, "model": {"hidden": 64}})
        c = add_trial(s, larger, 0, validation=[{"val_acc": 0.7}, {"val_acc": 0.6}],
                      hparams={"lr": 0.1, "depth": 3})
        add_metric(s, a, {"loss": 2.0}, step=1, kind="training")
        add_metric(s, a, {"loss": 1.5}, step=2, kind="training")
        ids = [c.id, a.id, b.id]
    found = comparison.compare_trials(shared_store, ids)
    assert [(t.id, t.number, t.state) for t in found.trials] == [
        (ids[0], 0, "SUCCEEDED"), (ids[1], 0, "SUCCEEDED"), (ids[2], 1, "RUNNING")]
    rows = {row.name: (row.values, row.differs) for row in found.hparams}
    assert rows == {"lr": ((0.1, 0.1, 0.2), True), "depth": ((3, None, None), True),
                    "model.hidden": ((None, 64, 64), True)}
    metrics = {row.name: (row.values, row.differs) for row in found.metrics}
    assert metrics["best val_acc"] == ((0.7, None, None), True)  # larger is better there
    assert metrics["best val_loss"] == ((None, 0.2, 0.4), True)
    assert metrics["last validation val_loss"] == ((None, 0.3, 0.4), True)
    assert metrics["last training loss"] == ((None, 1.5, None), True)
    assert found.series == ["training:loss", "validation:val_acc", "validation:val_loss"]


def test_rows_that_agree_are_not_marked(shared_store: Store) -> None:
    with shared_store.session_scope() as s:
        exp = add_experiment(s, search_config())
        same = {"lr": 0.1, "model": {"hidden": 64}}
        ids = [add_trial(s, exp, n, validation=losses(0.5), hparams=same).id for n in range(2)]
    found = comparison.compare_trials(shared_store, ids)
    assert not any(row.differs for row in [*found.hparams, *found.metrics])


def test_an_unknown_trial_is_named(shared_store: Store) -> None:
    with shared_store.session_scope() as s:
        known = add_trial(s, add_experiment(s, search_config()), 0).id
    with pytest.raises(NotFound, match="no trial 999999, 999998"):
        comparison.compare_trials(shared_store, [known, 999_999, 999_998])


@pytest.mark.parametrize(("text", "ids"), [
    ("12,15,19", [12, 15, 19]), (" 3, 3 ,1,", [3, 1]), ("7", [7])])
def test_ids_are_read_in_order_once(text: str, ids: list[int]) -> None:
    assert comparison.parse_ids(text, "trials") == ids


@pytest.mark.parametrize(("text", "problem"), [
    ("", "compare 1 to 20 trials, got 0"),
    (",".join(str(n) for n in range(1, 22)), "compare 1 to 20 trials, got 21"),
    ("12;15", "ids separated by commas"),
    ("0,1", "ids separated by commas"),
    ("1,-2", "ids separated by commas"),
    ("99999999999", "ids separated by commas"),
    ("١٢", "ids separated by commas"),  # digits, but not ASCII ones
])
def test_bad_ids_say_how_to_ask(text: str, problem: str) -> None:
    with pytest.raises(InvalidRequest, match=problem):
        comparison.parse_ids(text, "trials")


def test_experiments_side_by_side_through_the_trials_that_stand_for_them(
        shared_store: Store) -> None:
    with shared_store.session_scope() as s:
        first = add_experiment(s, search_config())
        second = add_experiment(s, search_config(metric="val_acc", smaller_is_better=False,
                                                 max_trials=3), max_trials=3)
        empty = add_experiment(s, search_config())
        add_trial(s, first, 0, validation=losses(0.3))
        best = add_trial(s, first, 1, validation=losses(0.2))
        add_trial(s, second, 0, validation=[{"val_acc": 0.1}])
        latest = add_trial(s, second, 1, "RUNNING", validation=[{"val_acc": 0.9}])
        ids = [first.id, second.id, empty.id]
    found = comparison.compare_experiments(shared_store, ids)
    assert [(e.id, e.metric, e.trials, e.stand_in, e.basis) for e in found.experiments] == [
        (ids[0], "val_loss", 2, best.id, "best"),
        (ids[1], "val_acc", 2, found.experiments[1].stand_in, "best"),
        (ids[2], "val_loss", 0, None, None)]
    assert found.experiments[1].stand_in != latest.id  # RUNNING: not a best
    assert found.experiments[0].config_diff == []
    diff = found.experiments[1].config_diff
    assert diff[:2] == [f"--- experiment {ids[0]}", f"+++ experiment {ids[1]}"]
    assert "-  metric: val_loss" in diff and "+  metric: val_acc" in diff
    assert "+  max_trials: 3" in diff
    assert found.trials is not None
    assert [t.id for t in found.trials.trials] == [best.id, found.experiments[1].stand_in]
    with pytest.raises(NotFound, match="experiment 999999 does not exist"):
        comparison.compare_experiments(shared_store, [ids[0], 999_999])
