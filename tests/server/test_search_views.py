"""Search progress on the store, on SQLite and PostgreSQL: the best trial, `best_validation`,
the `search` block of an experiment's view, and trial lists sorted by a metric.

Experiments, trials and metric reports are stored directly (test setup, not transitions);
the configs are real, validated ones with a searcher block. The helpers here are shared
with the API and CLI tests, which store the same rows in a running server's database.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import pytest
from sqlalchemy import event, insert
from sqlalchemy.orm import Session

from muster.config import load_config
from muster.errors import Conflict, InvalidRequest, NotFound
from muster.services import views
from muster.services.experiments import DESCRIBE_TRIALS, TrialWindow, describe_experiment
from muster.services.search import best_trial, list_trials, pareto_front
from muster.services.validation import best_validation
from muster.store import Attempt, Experiment, Metric, Replica, Store, Trial, series
from tests.store.rows import add_metric


@pytest.fixture
def store(shared_store: Store) -> Store:
    """One migrated store per module and backend: each test makes and reads its own rows."""
    return shared_store

_names = itertools.count(1)
SEARCH_KEYS = {"searcher", "metric", "smaller_is_better", "max_trials", "max_concurrent_trials",
               "max_length", "max_length_unit", "time_metric", "ended", "running", "queued",
               "remaining", "best", "objectives"}
SUMMARY_KEYS = {"id", "number", "state", "hparams", "early_stopped", "best_validation",
                "restarts", "started_at", "ended_at", "verified", "verdict", "early_stop",
                "progress"}


# -- rows ---------------------------------------------------------------------------------


def search_config(
    searcher: str = "random", metric: str | None = "val_loss", smaller_is_better: bool = True,
    max_trials: int = 8, **more: Any,
) -> dict[str, Any]:
    """A validated experiment config (as stored) with this searcher block (and `more` of
    its keys)."""
    block: dict[str, Any] = {"name": searcher, "smaller_is_better": smaller_is_better, **more}
    if metric is not None:
        block["metric"] = metric
    if searcher != "single":
        block |= {"max_trials": max_trials, "max_concurrent_trials": 4}
    space: dict[str, Any] = {"lr": {"type": "log", "minval": -4, "maxval": -1, "base": 10},
                             "model": {"hidden": {"type": "categorical", "vals": [64, 128]}}}
    if searcher == "single":
        space = {"lr": 0.001, "model": {"hidden": 64}}  # it searches nothing
    config = {"name": f"search-{next(_names)}", "entrypoint": ["python", "train.py"],
              "hyperparameters": space, "searcher": block}
    return load_config(json.dumps(config), source="a test").to_json_dict()


def add_experiment(
    s: Session, config: dict[str, Any], state: str = "ACTIVE", max_trials: int = 8
) -> Experiment:
    exp = Experiment(name=config["name"], config=config, config_yaml=json.dumps(config),
                     context_dir="/nonexistent/context", state=state, max_trials=max_trials)
    s.add(exp)
    s.flush()
    return exp


def add_trial(
    s: Session, exp: Experiment, number: int, state: str = "SUCCEEDED", *,
    validation: Sequence[dict[str, float]] = (), early_stop: dict[str, Any] | None = None,
    hparams: dict[str, Any] | None = None,
) -> Trial:
    """A trial with rank 0's validation reports (steps 1, 2, ...) and, with `early_stop`,
    stopped early by the searcher there."""
    trial = Trial(experiment=exp, number=number, state=state,
                  hparams=hparams or {"lr": 0.001 * (number + 1), "model": {"hidden": 64}},
                  early_stopped=early_stop is not None,
                  search_state=None if early_stop is None else {"early_stop": early_stop,
                                                                "optuna": {"rungs": 1}})
    s.add(trial)
    s.flush()
    for step, values in enumerate(validation, start=1):
        report(s, trial, step, values)
    return trial


def add_many_trials(s: Session, exp: Experiment, count: int, best_at: int) -> list[int]:
    """`count` trials in one flush: SUCCEEDED, each with one attempt of one replica and one
    validation report (val_loss 0.5; trial number `best_at`'s is 0.1, the best); the last one
    RUNNING. Their ids, by number."""
    trials = [Trial(experiment=exp, number=n, state="SUCCEEDED" if n < count - 1 else "RUNNING",
                    hparams={"lr": 0.001 * (n + 1), "model": {"hidden": 64}})
              for n in range(count)]
    s.add_all(trials)
    s.flush()
    attempts = [Attempt(trial=t, number=1, state="SUCCEEDED", run_dir=f"/nonexistent/{t.id}")
                for t in trials]
    s.add_all(attempts)
    s.flush()
    s.add_all(Replica(attempt=a, rank=0, host="localhost", log_path="rank-0.log", exit_code=0)
              for a in attempts)
    rows = [{"trial_id": t.id, "attempt": 1, "rank": 0, "kind": "validation", "step": 1,
             "time": 1.0, "values": {"val_loss": 0.1 if t.number == best_at else 0.5}}
            for t in trials]
    s.execute(insert(Metric), rows)
    for row in rows:
        series.record(s, row["trial_id"], [row])
    return [t.id for t in trials]


def report(s: Session, trial: Trial, step: int, values: dict[str, float], *, rank: int = 0,
           kind: str = "validation") -> None:
    add_metric(s, trial, values, step=step, kind=kind, rank=rank)
    s.flush()


def losses(*values: float) -> list[dict[str, float]]:
    return [{"val_loss": v} for v in values]


@contextmanager
def queries(store: Store) -> Iterator[list[str]]:
    """The SELECT statements the store runs inside the block (not SQLite's BEGIN)."""
    seen: list[str] = []

    def note(conn: Any, cursor: Any, sql: str, *rest: Any) -> None:
        if sql.lstrip().upper().startswith("SELECT"):
            seen.append(sql)

    event.listen(store.engine, "before_cursor_execute", note)
    try:
        yield seen
    finally:
        event.remove(store.engine, "before_cursor_execute", note)


# -- the pure parts -----------------------------------------------------------------------


@pytest.mark.parametrize(("reports", "goals", "expected"), [
    ([(1, {"a": 3.0}), (1, {"a": 1.0}), (1, {"a": 2.0})], {"a": True}, {1: {"a": 1.0}}),
    ([(1, {"a": 3.0}), (1, {"a": 1.0}), (1, {"a": 2.0})], {"a": False}, {1: {"a": 3.0}}),
    ([(1, {"a": math.nan}), (1, {"a": -math.inf}), (1, {"a": 5})], {"a": True}, {1: {"a": 5.0}}),
    ([(1, {"a": math.nan}), (1, {"a": math.inf})], {"a": False}, {}),
    ([(1, {"a": True}), (1, {"a": "0.1"}), (1, {"a": None})], {"a": True}, {}),
    ([(1, {"a": 1.0, "b": 9.0}), (2, {"b": 4.0})], {"a": True, "b": False},
     {1: {"a": 1.0, "b": 9.0}, 2: {"b": 4.0}}),
    ([(1, {"a": 1.0})], {}, {}),
])
def test_best_validation_of_stored_reports(
    shared_store: Store, reports: list[tuple[int, dict[str, Any]]], goals: dict[str, bool],
    expected: dict[int, dict[str, float]],
) -> None:
    """A trial's best value of each metric over its reports, as ingestion stores them: NaN,
    ±inf and anything not a number are no value; a trial with none is left out."""
    with shared_store.session_scope() as s:
        exp = add_experiment(s, search_config())
        trials = {n: add_trial(s, exp, n - 1) for n in {n for n, _ in reports}}
        for step, (n, values) in enumerate(reports, start=1):
            report(s, trials[n], step, values)
        ids = {trial.id: n for n, trial in trials.items()}
        best = best_validation(s, list(ids), goals)
    assert {ids[trial_id]: values for trial_id, values in best.items()} == expected


@pytest.mark.parametrize(("values", "smaller_is_better", "expected"), [
    ([3.0, None, 1.0, 2.0], True, [1.0, 2.0, 3.0, None]),
    ([3.0, None, 1.0, 2.0], False, [3.0, 2.0, 1.0, None]),
    ([-1.0, 0.0, None], True, [-1.0, 0.0, None]),
])
def test_metric_order_puts_the_best_first_and_missing_last(
    values: list[float | None], smaller_is_better: bool, expected: list[float | None]
) -> None:
    assert sorted(values, key=lambda v: views.metric_order(v, smaller_is_better)) == expected


# -- the best trial -----------------------------------------------------------------------


@pytest.mark.parametrize(("smaller_is_better", "winner", "value"),
                         [(True, 1, 0.2), (False, 2, 0.95)])
def test_best_trial_follows_the_searchers_direction(
    shared_store: Store, smaller_is_better: bool, winner: int, value: float
) -> None:
    with shared_store.session_scope() as s:
        exp = add_experiment(s, search_config(smaller_is_better=smaller_is_better))
        ids = [add_trial(s, exp, 0, validation=losses(0.9, 0.5)).id,
               add_trial(s, exp, 1, validation=losses(0.7, 0.2, 0.4)).id,
               add_trial(s, exp, 2, validation=losses(0.95, 0.3)).id]
    best = best_trial(shared_store, exp.id)
    assert (best["id"], best["number"], best["best_validation"]) == (
        ids[winner], winner, {"val_loss": value})
    assert {"hparams", "state", "attempts", "early_stop"} <= set(best)
    search = describe_experiment(shared_store, exp.id)["search"]
    assert search["best"] == {"trial_id": ids[winner], "number": winner,
                              "hparams": best["hparams"], "metric": "val_loss",
                              "value": value, "early_stopped": False}


def test_nan_and_infinity_are_no_value(shared_store: Store) -> None:
    with shared_store.session_scope() as s:
        exp = add_experiment(s, search_config())
        spoiled = add_trial(s, exp, 0, validation=losses(math.nan, -math.inf, 0.5))
        steady = add_trial(s, exp, 1, validation=losses(0.3))
        only_nan = add_trial(s, exp, 2, validation=losses(math.nan))
    assert best_trial(shared_store, exp.id)["id"] == steady.id
    trials = {t["id"]: t for t in describe_experiment(shared_store, exp.id)["trials"]}
    assert trials[spoiled.id]["best_validation"] == {"val_loss": 0.5}
    assert trials[only_nan.id]["best_validation"] == {}


def test_only_rank_0_validation_reports_count(shared_store: Store) -> None:
    with shared_store.session_scope() as s:
        exp = add_experiment(s, search_config())
        other_ranks = add_trial(s, exp, 0, validation=losses(0.9))
        report(s, other_ranks, 1, {"val_loss": 0.01}, rank=1)
        report(s, other_ranks, 1, {"val_loss": 0.01}, kind="training")
        plain = add_trial(s, exp, 1, validation=losses(0.5))
    best = best_trial(shared_store, exp.id)
    assert (best["id"], best["best_validation"]) == (plain.id, {"val_loss": 0.5})


def test_an_early_stopped_trial_can_be_the_best(shared_store: Store) -> None:
    stop = {"rung": 1, "step": 2, "value": 0.1}
    with shared_store.session_scope() as s:
        exp = add_experiment(s, search_config())
        add_trial(s, exp, 0, validation=losses(0.6, 0.4))
        stopped = add_trial(s, exp, 1, validation=losses(0.3, 0.1), early_stop=stop)
    best = best_trial(shared_store, exp.id)
    shown = {**stop, "time": None}  # stored before time_metric: no time, said as null
    assert (best["id"], best["early_stopped"], best["early_stop"]) == (stopped.id, True, shown)
    view = describe_experiment(shared_store, exp.id)
    assert view["search"]["best"]["early_stopped"] is True
    assert [t["early_stop"] for t in view["trials"]] == [None, shown]


def test_only_succeeded_trials_compete(shared_store: Store) -> None:
    with shared_store.session_scope() as s:
        exp = add_experiment(s, search_config())
        for number, state in enumerate(["RUNNING", "FAILED", "SUSPECT", "CANCELED"]):
            add_trial(s, exp, number, state, validation=losses(0.01))
        winner = add_trial(s, exp, 4, validation=losses(0.5))
    assert best_trial(shared_store, exp.id)["id"] == winner.id
    assert describe_experiment(shared_store, exp.id)["search"]["best"]["trial_id"] == winner.id


def test_a_tie_goes_to_the_lowest_number(shared_store: Store) -> None:
    with shared_store.session_scope() as s:
        exp = add_experiment(s, search_config())
        add_trial(s, exp, 3, validation=losses(0.2))  # made first: the lower id
        lower = add_trial(s, exp, 1, validation=losses(0.4, 0.2))
    assert best_trial(shared_store, exp.id)["id"] == lower.id


def test_no_successful_trial_with_the_metric_yet(shared_store: Store) -> None:
    with shared_store.session_scope() as s:
        exp = add_experiment(s, search_config())
        add_trial(s, exp, 0, "RUNNING", validation=losses(0.2))
        add_trial(s, exp, 1, "FAILED", validation=losses(0.1))
        add_trial(s, exp, 2, validation=[{"val_acc": 0.9}, {"val_loss": math.nan}])
    with pytest.raises(NotFound, match=rf"experiment {exp.id} has no SUCCEEDED trial with a "
                                       rf"finite 'val_loss' yet; `muster trial list {exp.id}`"):
        best_trial(shared_store, exp.id)
    assert describe_experiment(shared_store, exp.id)["search"]["best"] is None


def test_without_a_searcher_metric_there_is_no_best(shared_store: Store) -> None:
    with shared_store.session_scope() as s:
        exp = add_experiment(s, search_config("single", metric=None), max_trials=1)
        add_trial(s, exp, 0, validation=losses(0.2))
    with pytest.raises(Conflict, match=r"no searcher metric .* --sort METRIC.*searcher.metric"):
        best_trial(shared_store, exp.id)
    view = describe_experiment(shared_store, exp.id)
    assert view["search"] == {
        "searcher": "single", "metric": None, "smaller_is_better": True, "max_trials": 1,
        "max_concurrent_trials": 16, "max_length": None, "max_length_unit": "steps",
        "time_metric": None, "ended": 1, "running": 0, "queued": 0, "remaining": 0, "best": None,
        "objectives": []}
    assert view["trials"][0]["best_validation"] == {}
    assert view["trials"][0]["number"] == 0


def test_an_experiment_from_before_search_is_single(shared_store: Store) -> None:
    config = search_config("single", metric=None)
    del config["searcher"]  # as stored before the searcher block existed
    with shared_store.session_scope() as s:
        exp = add_experiment(s, config, max_trials=1)
        add_trial(s, exp, 0)
    search = describe_experiment(shared_store, exp.id)["search"]
    assert (search["searcher"], search["metric"], search["best"]) == ("single", None, None)


def test_unknown_experiment(shared_store: Store) -> None:
    with pytest.raises(NotFound, match="experiment 999999 does not exist"):
        best_trial(shared_store, 999_999)
    with pytest.raises(NotFound, match="experiment 999999 does not exist"):
        list_trials(shared_store, 999_999)


# -- the search block ---------------------------------------------------------------------


def test_the_search_block_counts_trials_by_stage(shared_store: Store) -> None:
    states = ["SUCCEEDED", "FAILED", "CANCELED", "SUSPECT", "STARTING", "RUNNING",
              "RESTARTING", "QUEUED", "PAUSED"]
    with shared_store.session_scope() as s:
        exp = add_experiment(s, search_config(max_trials=12), max_trials=12)
        for number, state in enumerate(states):
            add_trial(s, exp, number, state)
    view = describe_experiment(shared_store, exp.id)
    search = view["search"]
    assert set(search) == SEARCH_KEYS
    assert {k: search[k] for k in ("searcher", "metric", "smaller_is_better", "max_trials",
                                    "max_concurrent_trials", "ended", "running", "queued",
                                    "remaining")} == {
        "searcher": "random", "metric": "val_loss", "smaller_is_better": True,
        "max_trials": 12, "max_concurrent_trials": 4, "ended": 4, "running": 3, "queued": 2,
        "remaining": 3}
    assert [t["number"] for t in view["trials"]] == list(range(len(states)))
    assert all(t["early_stop"] is None and t["best_validation"] == {} for t in view["trials"])


def test_describe_pages_the_trials_and_counts_them_all(shared_store: Store) -> None:
    """A search of 2,345 trials: the description holds the first 1,000 whole, says how
    many there are and where the next page starts; every count, the best trial and the
    states are of all of them; a later page's trials have their attempts and values."""
    with shared_store.session_scope() as s:
        exp = add_experiment(s, search_config(max_trials=2_345), max_trials=2_345)
        ids = add_many_trials(s, exp, 2_345, best_at=2_100)
    with queries(shared_store) as seen:
        first = describe_experiment(shared_store, exp.id)
    assert len(seen) <= 20, "\n\n".join(q[:150] for q in seen)  # not one per trial
    assert [t["id"] for t in first["trials"]] == ids[:DESCRIBE_TRIALS]
    assert (first["trials_total"], first["trials_offset"], first["trials_next_offset"]) == (
        2_345, 0, 1_000)
    assert len(first["trial_states"]) == 2_345 and first["trial_states"][-1] == "RUNNING"
    assert first["search"]["best"]["trial_id"] == ids[2_100]  # beyond the page
    assert (first["search"]["ended"], first["search"]["running"]) == (2_344, 1)

    last = describe_experiment(shared_store, exp.id, window=TrialWindow(2_000, 1_000))
    assert [t["id"] for t in last["trials"]] == ids[2_000:]
    assert (last["trials_offset"], last["trials_next_offset"]) == (2_000, None)
    assert last["trials"][100]["best_validation"] == {"val_loss": 0.1}
    assert last["trials"][100]["attempts"][0]["replicas"][0]["exit_code"] == 0
    assert {key: last[key] for key in ("search", "trial_states", "verdicts")} == {
        key: first[key] for key in ("search", "trial_states", "verdicts")}

    small = describe_experiment(shared_store, exp.id, window=TrialWindow(1_990, 10))
    assert ([t["number"] for t in small["trials"]], small["trials_next_offset"]) == (
        list(range(1_990, 2_000)), 2_000)
    beyond = describe_experiment(shared_store, exp.id, window=TrialWindow(9_999, 10))
    assert (beyond["trials"], beyond["trials_total"], beyond["trials_next_offset"]) == (
        [], 2_345, None)


def test_best_validation_takes_one_query(shared_store: Store) -> None:
    with shared_store.session_scope() as s:
        exp = add_experiment(s, search_config())
        ids = [add_trial(s, exp, n, validation=losses(0.5 - n / 10, 0.9)).id for n in range(4)]
    with shared_store.session_scope() as s, queries(shared_store) as seen:
        best = best_validation(s, ids, {"val_loss": True})
    assert len(seen) == 1, seen
    assert best == {trial_id: {"val_loss": pytest.approx(0.5 - n / 10)}
                    for n, trial_id in enumerate(ids)}


# -- trial lists --------------------------------------------------------------------------


@pytest.fixture
def ranked(shared_store: Store) -> Experiment:
    """Five trials: val_loss 0.4, none, 0.2, 0.4, 0.3 (number 0-4); val_acc on some."""
    with shared_store.session_scope() as s:
        exp = add_experiment(s, search_config())
        first = add_trial(s, exp, 0, validation=[{"val_loss": 0.4, "val_acc": 0.7}])
        add_trial(s, exp, 1, "RUNNING", validation=[{"val_acc": 0.2}])
        add_trial(s, exp, 2, validation=[{"val_loss": 0.2, "val_acc": 0.9}])
        add_trial(s, exp, 3, "FAILED", validation=[{"val_loss": 0.4}, {"val_loss": math.nan}])
        add_trial(s, exp, 4, validation=[{"val_loss": 0.3, "val_acc": 0.8}],
                  early_stop={"rung": 0, "step": 1, "value": 0.3})
        report(s, first, 1, {"loss": 0.01}, kind="training")
    return exp


def numbers(rows: list[dict[str, Any]]) -> list[int]:
    return [row["number"] for row in rows]


def test_trials_are_listed_by_number(shared_store: Store, ranked: Experiment) -> None:
    rows = list_trials(shared_store, ranked.id)
    assert numbers(rows) == [0, 1, 2, 3, 4]
    assert all(set(row) == SUMMARY_KEYS for row in rows)
    assert [row["best_validation"] for row in rows] == [
        {"val_loss": 0.4}, {}, {"val_loss": 0.2}, {"val_loss": 0.4}, {"val_loss": 0.3}]
    assert [row["early_stopped"] for row in rows] == [False, False, False, False, True]
    assert rows[0]["hparams"] == {"lr": 0.001, "model": {"hidden": 64}}


@pytest.mark.parametrize(("smaller_is_better", "expected"),
                         [(True, [2, 4, 0, 3, 1]), (False, [0, 3, 4, 2, 1])])
def test_sorting_by_the_searchers_metric_follows_its_direction(
    shared_store: Store, smaller_is_better: bool, expected: list[int]
) -> None:
    with shared_store.session_scope() as s:
        exp = add_experiment(s, search_config(smaller_is_better=smaller_is_better))
        for number, value in enumerate([0.4, None, 0.2, 0.4, 0.3]):
            add_trial(s, exp, number, validation=[] if value is None else losses(value))
    assert numbers(list_trials(shared_store, exp.id, sort="val_loss")) == expected


def test_sorting_by_another_metric_is_smallest_first(
    shared_store: Store, ranked: Experiment
) -> None:
    rows = list_trials(shared_store, ranked.id, sort="val_acc")
    assert numbers(rows) == [1, 0, 4, 2, 3]  # trial 3 never reported val_acc
    assert rows[0]["best_validation"] == {"val_acc": 0.2}
    assert rows[1]["best_validation"] == {"val_loss": 0.4, "val_acc": 0.7}


def test_sorting_by_an_unknown_metric_names_the_known_ones(
    shared_store: Store, ranked: Experiment
) -> None:
    with pytest.raises(InvalidRequest, match=(
            rf"no trial of experiment {ranked.id} reported a validation metric 'loss'; sort "
            r"by one of its validation metrics: val_acc, val_loss$")):
        list_trials(shared_store, ranked.id, sort="loss")  # a training metric


def test_the_searchers_metric_sorts_before_any_report(shared_store: Store) -> None:
    with shared_store.session_scope() as s:
        exp = add_experiment(s, search_config())
        add_trial(s, exp, 0, "RUNNING")
    assert numbers(list_trials(shared_store, exp.id, sort="val_loss")) == [0]
    with pytest.raises(InvalidRequest, match=r"validation metrics: val_loss$"):
        list_trials(shared_store, exp.id, sort="val_acc")


# -- several objectives: the Pareto front --------------------------------------------------


def test_the_pareto_front_keeps_the_trials_no_other_beats(shared_store: Store) -> None:
    """Two objectives, accuracy up and latency down, each trial's last report of each: the
    front is best-first by the first objective; a beaten trial, one that ended on NaN and
    one missing an objective are not on it, and only SUCCEEDED trials count."""
    two = [{"name": "val_acc", "smaller_is_better": False}, {"name": "latency"}]
    with shared_store.session_scope() as s:
        exp = add_experiment(s, search_config("nsga2", metric=None, metrics=two))
        def trial(number: int, *reports: dict[str, float], state: str = "SUCCEEDED") -> int:
            return add_trial(s, exp, number, state, validation=reports).id
        fast = trial(0, {"val_acc": 0.9, "latency": 9.0}, {"val_acc": 0.7, "latency": 2.0})
        accurate = trial(1, {"val_acc": 0.95, "latency": 5.0})
        beaten = trial(2, {"val_acc": 0.6, "latency": 6.0})
        tie = trial(3, {"val_acc": 0.95, "latency": 5.0})
        trial(4, {"val_acc": math.nan, "latency": 1.0})
        trial(5, {"val_acc": 0.99})
        trial(6, {"val_acc": 0.99, "latency": 0.5}, state="FAILED")
        late = trial(7, {"val_acc": 0.5, "latency": 9.0}, {"latency": 1.5})
    front = pareto_front(shared_store, exp.id)
    assert front["objectives"] == [{"name": "val_acc", "smaller_is_better": False},
                                   {"name": "latency", "smaller_is_better": True}]
    assert [(p["trial_id"], p["on_front"]) for p in front["points"]] == [
        (accurate, True), (tie, True), (fast, True), (late, True), (beaten, False)]
    assert (front["front"], front["without_values"]) == (4, 2)
    assert front["points"][2]["values"] == {"val_acc": 0.7, "latency": 2.0}  # as it ended
    assert front["points"][3]["values"] == {"val_acc": 0.5, "latency": 1.5}
    view = describe_experiment(shared_store, exp.id)["search"]
    assert (view["metric"], view["smaller_is_better"]) == ("val_acc", False)
    assert [o["name"] for o in view["objectives"]] == ["val_acc", "latency"]


def test_a_front_needs_a_metric_and_of_one_is_its_best(shared_store: Store) -> None:
    with shared_store.session_scope() as s:
        none = add_experiment(s, search_config("single", metric=None), max_trials=1)
        one = add_experiment(s, search_config())
        worse = add_trial(s, one, 0, validation=losses(0.3))
        best = add_trial(s, one, 1, validation=losses(0.5, 0.2))
    with pytest.raises(Conflict, match="no searcher metric"):
        pareto_front(shared_store, none.id)
    front = pareto_front(shared_store, one.id)
    assert [(p["trial_id"], p["on_front"]) for p in front["points"]] == [
        (best.id, True), (worse.id, False)]
    assert front["front"] == 1
