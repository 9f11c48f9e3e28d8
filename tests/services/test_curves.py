"""Charts' data from the store: an experiment's learning curves (downsampled, with ASHA's
stops), a trial's every metric, and a trials table paged, sorted and filtered on the
server. Real store on both backends; rows written as ingestion writes them."""

from __future__ import annotations

import math
from typing import Any

import pytest
from sqlalchemy import event

from muster.downsample import COARSE_POINTS, MAX_POINTS
from muster.errors import Conflict, InvalidRequest
from muster.services import curves, search
from muster.services.search import TrialQuery
from muster.states import AttemptState, TrialState
from muster.store import Attempt, MetricSeries, Store
from tests.server.test_search_views import add_experiment, add_trial, losses, search_config
from tests.store.rows import add_metric, add_reports


def test_every_trial_has_its_curve_and_asha_stops_show(shared_store: Store) -> None:
    with shared_store.session_scope() as s:
        exp = add_experiment(s, search_config())
        add_trial(s, exp, 0, validation=losses(0.9, 0.5, 0.3))
        add_trial(s, exp, 1, validation=losses(0.9, 0.8),
                  early_stop={"rung": 0, "step": 2, "value": 0.8})
        add_trial(s, exp, 2, "QUEUED")  # no reports: no curve
        exp_id = exp.id
    answer = curves.experiment_curves(shared_store, exp_id)
    assert (answer["metric"], answer["kind"], answer["smaller_is_better"]) == (
        "val_loss", "validation", True)
    by_number = {t["number"]: t for t in answer["trials"]}
    assert set(by_number) == {0, 1}
    assert (by_number[0]["steps"], by_number[0]["values"]) == ([1, 2, 3], [0.9, 0.5, 0.3])
    assert by_number[0]["early_stop"] is None
    assert by_number[1]["early_stop"] == {"rung": 0, "step": 2, "value": 0.8, "time": None}
    assert by_number[1]["hparams"] == {"lr": 0.002, "model": {"hidden": 64}}


def test_a_long_search_shares_a_point_budget(shared_store: Store,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(curves, "CURVES_BUDGET", 3_000)
    with shared_store.session_scope() as s:
        exp = add_experiment(s, search_config(max_trials=30), max_trials=30)
        for number in range(30):
            add_reports(s, add_trial(s, exp, number), [  # 300 reports each
                (step, {"val_loss": math.exp(-step / 200) + number / 1000})
                for step in range(0, 600, 2)])
        exp_id = exp.id
    answer = curves.experiment_curves(shared_store, exp_id)
    each = answer["points_per_trial"]
    assert each == 100
    assert all(len(t["steps"]) <= each and t["reports"] == 300 for t in answer["trials"])
    assert sum(len(t["steps"]) for t in answer["trials"]) <= curves.CURVES_BUDGET
    first = answer["trials"][0]
    assert (first["steps"][0], first["steps"][-1]) == (0, 598)  # the whole run, both ends
    fewer = curves.experiment_curves(shared_store, exp_id, points=10)
    assert all(len(t["steps"]) <= 10 for t in fewer["trials"])


def test_many_curves_at_few_points_are_drawn_from_their_coarse_copies(
        shared_store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """At 40 points a curve, the coarse copies (32 buckets) are read, not the curves (250):
    each curve keeps both ends, its lowest and its highest value; a row from before the
    copies existed is drawn from its curve; more points a curve read the whole curves."""
    monkeypatch.setattr(curves, "CURVES_BUDGET", 1_200)  # 30 trials: 40 points each
    with shared_store.session_scope() as s:
        exp = add_experiment(s, search_config(max_trials=30), max_trials=30)
        trials = [add_trial(s, exp, number) for number in range(30)]
        for number, trial in enumerate(trials):
            add_reports(s, trial, [(step, {"val_loss": 1 / (step + 1) + number / 100
                                           + (5.0 if step == 777 else 0.0)})
                                   for step in range(1000)])
        exp_id, old_id = exp.id, trials[0].id
    with shared_store.session_scope() as s:  # as a row from before migration 0030
        s.query(MetricSeries).filter(MetricSeries.trial_id == old_id).update(
            {MetricSeries.coarse: None})
    statements: list[str] = []

    def seen(conn: Any, cursor: Any, statement: str, *rest: Any) -> None:
        statements.append(statement)

    engine = shared_store.engine
    event.listen(engine, "before_cursor_execute", seen)
    try:
        answer = curves.experiment_curves(shared_store, exp_id)
    finally:
        event.remove(engine, "before_cursor_execute", seen)
    assert answer["points_per_trial"] == 40
    series_reads = [x for x in statements if "FROM metric_series" in x]
    assert len(series_reads) == 2, series_reads  # the copies, then trial 0's curve alone
    assert "metric_series.coarse" in series_reads[0] and "metric_series.curve" not in \
        series_reads[0]
    for trial in answer["trials"]:
        steps, values = trial["steps"], trial["values"]
        assert 0 < len(steps) <= 40 and (steps[0], steps[-1]) == (0, 999)
        offset = trial["number"] / 100
        assert min(values) == pytest.approx(1 / 1000 + offset)
        assert max(values) == pytest.approx(1 / 778 + offset + 5.0)  # the spike is kept
        assert 777 in steps
    whole = curves.experiment_curves(shared_store, exp_id, points=400)
    assert all(COARSE_POINTS < len(t["steps"]) <= 400 for t in whole["trials"])  # whole


def test_another_metric_and_bad_requests(shared_store: Store) -> None:
    with shared_store.session_scope() as s:
        exp = add_experiment(s, search_config())
        trial = add_trial(s, exp, 0, validation=[{"val_loss": 0.5, "acc": 0.7}])
        add_metric(s, trial, {"loss": 2.0}, step=1, kind="training")
        add_metric(s, trial, {"loss": math.nan}, step=2, kind="training")  # no point
        add_metric(s, trial, {"loss": 1.0}, step=3, kind="training")
        exp_id, trial_id = exp.id, trial.id
        bare = add_experiment(s, search_config(metric=None, searcher="single"))
        bare_id = bare.id
    acc = curves.experiment_curves(shared_store, exp_id, metric="acc")
    assert acc["smaller_is_better"] is None and acc["trials"][0]["values"] == [0.7]
    training = curves.experiment_curves(shared_store, exp_id, metric="loss", kind="training")
    assert training["trials"][0]["steps"] == [1, 3]
    # A name no series can hold (PostgreSQL's text has no NUL): nothing drawn, no error.
    assert curves.experiment_curves(shared_store, exp_id, metric="val\x00loss")["trials"] == []
    with pytest.raises(Conflict, match=r"\?metric=NAME"):
        curves.experiment_curves(shared_store, bare_id)
    with pytest.raises(InvalidRequest, match="kind must be one of"):
        curves.experiment_curves(shared_store, exp_id, kind="test")
    with pytest.raises(InvalidRequest, match=f"points must be 4 to {MAX_POINTS}"):
        curves.trial_series(shared_store, trial_id, points=2)
    series = {(r["kind"], r["name"]): r for r in curves.trial_series(shared_store, trial_id)[
        "series"]}
    assert set(series) == {("training", "loss"), ("validation", "acc"),
                           ("validation", "val_loss")}
    loss = series[("training", "loss")]
    assert (loss["reports"], loss["lowest"], loss["highest"], loss["last_step"]) == (
        3, 1.0, 2.0, 3)


def test_a_partial_trial_s_curves_come_from_its_reports(shared_store: Store) -> None:
    """A trial stored before series existed (migration 0011 marks it partial)."""
    with shared_store.session_scope() as s:
        exp = add_experiment(s, search_config())
        trial = add_trial(s, exp, 0, validation=losses(0.4, 0.2))
        trial.series_partial = True
        exp_id, trial_id = exp.id, trial.id
    with shared_store.session_scope() as s:
        s.query(MetricSeries).filter(MetricSeries.trial_id == trial_id).delete()
    assert curves.experiment_curves(shared_store, exp_id)["trials"][0]["values"] == [0.4, 0.2]
    (only,) = curves.trial_series(shared_store, trial_id)["series"]
    assert (only["name"], only["steps"], only["lowest"]) == ("val_loss", [1, 2], 0.2)


# -- the trials table ---------------------------------------------------------------------


@pytest.fixture
def table(shared_store: Store) -> int:
    """Six trials: number n has lr 10^-(n+1) or text, val_loss as given, states mixed."""
    values: list[Any] = [0.4, None, 0.2, 0.4, 0.3, None]
    states = ["SUCCEEDED", "RUNNING", "SUCCEEDED", "FAILED", "SUCCEEDED", "QUEUED"]
    with shared_store.session_scope() as s:
        exp = add_experiment(s, search_config())
        for n, (value, state) in enumerate(zip(values, states, strict=True)):
            lr: Any = 10.0 ** -(n + 1) if n != 4 else "auto"
            add_trial(s, exp, n, state, validation=[] if value is None else losses(value),
                      hparams={"lr": lr, "model": {"hidden": 64 * (6 - n)}})
        return exp.id


def numbers(store: Store, exp_id: int, **query: Any) -> list[int]:
    return [row["number"] for row in search.trial_page(store, exp_id, TrialQuery(**query)).rows]


def test_the_trials_table_sorts_filters_and_pages(shared_store: Store, table: int) -> None:
    assert numbers(shared_store, table) == [0, 1, 2, 3, 4, 5]
    assert numbers(shared_store, table, descending=True) == [5, 4, 3, 2, 1, 0]
    assert numbers(shared_store, table, sort="val_loss") == [2, 4, 0, 3, 1, 5]
    # Reversed, the worst first, and still no value last.
    assert numbers(shared_store, table, sort="val_loss", descending=True) == [0, 3, 4, 2, 1, 5]
    assert numbers(shared_store, table, order_by="hparam:lr") == [5, 3, 2, 1, 0, 4]
    assert numbers(shared_store, table, order_by="hparam:model.hidden") == [5, 4, 3, 2, 1, 0]
    assert numbers(shared_store, table, order_by="hparam:absent") == [0, 1, 2, 3, 4, 5]
    assert numbers(shared_store, table, order_by="state") == [3, 5, 1, 0, 2, 4]
    assert numbers(shared_store, table, states=frozenset(
        {TrialState.SUCCEEDED, TrialState.FAILED})) == [0, 2, 3, 4]
    assert numbers(shared_store, table, order_by="restarts") == [0, 1, 2, 3, 4, 5]
    page = search.trial_page(shared_store, table, TrialQuery(sort="val_loss", offset=2,
                                                             limit=2))
    assert ([r["number"] for r in page.rows], page.total) == ([0, 3], 6)
    assert page.rows[0]["best_validation"] == {"val_loss": 0.4}
    assert page.rows[0]["early_stop"] is None


@pytest.mark.parametrize(("query", "problem"), [
    ({"sort": "val_loss", "order_by": "number"}, "not both"),
    ({"order_by": "loss"}, "order_by must be one of"),
    ({"order_by": "hparam:"}, "order_by must be one of"),
    ({"limit": 0}, "limit must be 1 to 1000"),
    ({"sort": "nothing"}, "no trial of experiment"),
    ({"sort": "val\x00loss"}, "no trial of experiment"),
])
def test_a_bad_table_query_says_what_to_ask(shared_store: Store, table: int,
                                            query: dict[str, Any], problem: str) -> None:
    with pytest.raises(InvalidRequest, match=problem):
        search.trial_page(shared_store, table, TrialQuery(**query))


def test_the_table_reads_no_report(shared_store: Store, table: int) -> None:
    """The trials' values come from their series: the reports table is not read."""
    seen: list[str] = []

    def record(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        seen.append(statement)

    event.listen(shared_store.engine, "before_cursor_execute", record)
    try:
        search.trial_page(shared_store, table, TrialQuery(sort="val_loss", limit=3))
    finally:
        event.remove(shared_store.engine, "before_cursor_execute", record)
    assert seen and not any("FROM metrics" in statement for statement in seen)


def test_the_table_orders_by_restarts_counting_no_standby(shared_store: Store) -> None:
    """Restarts: a trial's attempts less one, warm standbys not counted; the page's rows
    carry their attempts (the count shown matches the order)."""
    attempts = {0: [False, False, False], 1: [False], 2: [False, True, True], 3: [False, False]}
    with shared_store.session_scope() as s:
        exp = add_experiment(s, search_config())
        for n, standbys in attempts.items():
            trial = add_trial(s, exp, n, "RUNNING" if n == 2 else "SUCCEEDED")
            for k, standby in enumerate(standbys, start=1):
                s.add(Attempt(trial_id=trial.id, number=k, state=AttemptState.SUCCEEDED,
                              run_dir=f"/nonexistent/{n}/{k}", standby=standby))
        exp_id = exp.id
    page = search.trial_page(shared_store, exp_id, TrialQuery(order_by="restarts"))
    assert [(r["number"], r["restarts"]) for r in page.rows] == [(1, 0), (2, 0), (3, 1), (0, 2)]
    flipped = search.trial_page(shared_store, exp_id, TrialQuery(order_by="restarts",
                                                                descending=True, limit=1))
    assert ([r["number"] for r in flipped.rows], flipped.total) == ([0], 4)
