"""Searches with real trial processes: the supervisor draws each search's trials, honours
`max_concurrent_trials`, stops the trials its pruner gives up on (SUCCEEDED, early
stopped, processes gone), goes on past failed trials, and ends with exactly `max_trials`
trials, also under a new supervisor mid-search."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
import yaml
from sqlalchemy import select

from muster.launch.base import ProcessIdentity
from muster.launch.identity import is_alive
from muster.services.experiments import create_experiment, kill_experiment
from muster.states import ExperimentState, TrialState
from muster.store import Event, Experiment, Metric, Replica, Store, Trial
from tests.supervise.conftest import Rig, fixture_entrypoint

pytestmark = [pytest.mark.lifecycle, pytest.mark.timeout(180)]
LOSS = {"metric": "loss", "smaller_is_better": True}


def submit_search(rig: Rig, searcher: dict[str, Any], hyperparameters: dict[str, Any],
                  pause: float = 0.0, seed: int | None = 7, clock: str | None = None) -> int:
    variables = {"PAUSE": str(pause)} | ({"CLOCK": clock} if clock else {})
    config: dict[str, Any] = {
        "name": "search-test",
        "entrypoint": fixture_entrypoint("search_job.py"),
        "harness": True,
        "environment": {"variables": variables},
        "hyperparameters": hyperparameters,
        "searcher": searcher,
        "failure_policy": {"stop_grace": 10.0, "trial_retries": 0},
    }
    if seed is not None:
        config["reproducibility"] = {"experiment_seed": seed}
    return create_experiment(rig.store, rig.home, rig.admin, yaml.safe_dump(config), archive=None)


def trials_of(store: Store, experiment_id: int) -> list[Trial]:
    with store.session_scope() as s:
        trials = list(s.scalars(select(Trial).where(Trial.experiment_id == experiment_id)
                                .order_by(Trial.number)))
        s.expunge_all()
        return trials


def run_search(rig: Rig, experiment_id: int, check: Any = None) -> ExperimentState:
    """Tick until the experiment ends, calling `check()` after every pass."""
    def ended() -> ExperimentState | None:
        if check is not None:
            check()
        state = rig.experiment_state(experiment_id)
        return state if state.is_terminal() else None
    result: ExperimentState = rig.tick_until(ended, what=f"search {experiment_id} to end",
                                             timeout=150)
    return result


def test_a_grid_runs_every_point_once_and_completes(sqlite_rig: Rig) -> None:
    space = {"x": {"type": "double", "minval": 0, "maxval": 1, "count": 3},
             "y": {"type": "categorical", "vals": ["a", "b"]}, "const": 5,
             "nested": {"z": {"type": "int", "minval": 1, "maxval": 2}}}
    experiment_id = submit_search(sqlite_rig, {"name": "grid", **LOSS}, space)
    with sqlite_rig.store.session_scope() as s:
        assert s.get_one(Experiment, experiment_id).max_trials == 12
    assert run_search(sqlite_rig, experiment_id) is ExperimentState.COMPLETED
    trials = trials_of(sqlite_rig.store, experiment_id)
    assert [t.number for t in trials] == list(range(12))
    assert {t.state for t in trials} == {TrialState.SUCCEEDED.value}
    points = sorted((t.hparams["x"], t.hparams["y"], t.hparams["nested"]["z"]) for t in trials)
    assert points == sorted(itertools.product([0.0, 0.5, 1.0], ["a", "b"], [1, 2]))
    assert {t.hparams["const"] for t in trials} == {5}


def test_max_concurrent_trials_holds_and_max_trials_is_exact(sqlite_rig: Rig) -> None:
    experiment_id = submit_search(
        sqlite_rig, {"name": "random", "max_trials": 5, "max_concurrent_trials": 2, **LOSS},
        {"x": {"type": "double", "minval": 0, "maxval": 1}}, pause=0.05)
    seen: list[int] = []

    def unfinished_now() -> None:
        trials = trials_of(sqlite_rig.store, experiment_id)
        seen.append(sum(TrialState(t.state).is_unfinished() for t in trials))
        assert seen[-1] <= 2, [t.state for t in trials]

    assert run_search(sqlite_rig, experiment_id, unfinished_now) is ExperimentState.COMPLETED
    trials = trials_of(sqlite_rig.store, experiment_id)
    assert len(trials) == 5 and max(seen) == 2  # it did run two at once
    assert len({t.hparams["x"] for t in trials}) == 5
    assert all(0 <= t.hparams["x"] <= 1 for t in trials)


def test_asha_stops_poor_trials_early_and_they_end_succeeded(sqlite_rig: Rig) -> None:
    # One trial at a time: each later trial meets every earlier one at the rungs, and one
    # that is worse than the best there is stopped early.
    experiment_id = submit_search(
        sqlite_rig, {"name": "asha", "max_trials": 6, "max_concurrent_trials": 1,
                     "max_length": 8, "divisor": 2, "max_rungs": 4, **LOSS},
        {"x": {"type": "double", "minval": 0, "maxval": 1}}, pause=0.4)
    assert run_search(sqlite_rig, experiment_id) is ExperimentState.COMPLETED
    trials = trials_of(sqlite_rig.store, experiment_id)
    assert len(trials) == 6 and {t.state for t in trials} == {TrialState.SUCCEEDED.value}
    stopped = [t for t in trials if t.early_stopped]
    assert stopped, "with six sequential random trials some must fall behind the best"
    assert not trials[0].early_stopped  # alone at every rung
    with sqlite_rig.store.session_scope() as s:
        for trial in stopped:
            stop = (trial.search_state or {})["early_stop"]
            steps = [m.step for m in s.scalars(select(Metric).where(
                Metric.trial_id == trial.id, Metric.kind == "validation"))]
            assert max(steps) < 8 and stop["step"] <= max(steps)
            assert (trial.trial_retries, trial.replica_restarts) == (0, 0)
            # Verified without the checks a run cut short would fail; its checkpoint counts.
            checks = {c["name"]: c["passed"] for c in (trial.verification or {})["checks"]}
            assert checks["checkpoint"] and "finite_metrics" not in checks
            events = list(s.scalars(select(Event).where(Event.trial_id == trial.id)
                                    .order_by(Event.id)))
            # One word for the searcher's decision and the move it ends in.
            assert any(e.reason == "early stop" and e.to_state is None for e in events)
            assert (events[-1].to_state, events[-1].reason) == ("SUCCEEDED", "early stop")
            for replica in s.scalars(select(Replica).join(Replica.attempt).where(
                    Replica.attempt.has(trial_id=trial.id))):
                assert replica.reason == "STOPPED"
                assert replica.pid is not None and replica.start_ticks is not None
                assert not is_alive(ProcessIdentity(replica.pid, replica.start_ticks))
            # It was worse at the rung where it stopped than the best earlier trial there.
            earlier = [_value_at(s, t.id, stop["step"]) for t in trials
                       if t.number < trial.number]
            best = min(value for value in earlier if value is not None)
            assert stop["value"] > best


def test_bohb_stops_poor_trials_early_and_every_trial_ends_succeeded(sqlite_rig: Rig) -> None:
    """BOHB-style search with real trials: Hyperband's brackets stop the trials that fall
    behind at a rung (one bracket: plain successive halving, so the earliest trial meets
    no one), TPE draws each trial's x, and the search completes with all of them."""
    experiment_id = submit_search(
        sqlite_rig, {"name": "bohb", "max_trials": 6, "max_concurrent_trials": 1,
                     "max_length": 8, "divisor": 2, "max_rungs": 4, "mode": "aggressive",
                     **LOSS},
        {"x": {"type": "double", "minval": 0, "maxval": 1}}, pause=0.4)
    assert run_search(sqlite_rig, experiment_id) is ExperimentState.COMPLETED
    trials = trials_of(sqlite_rig.store, experiment_id)
    assert len(trials) == 6 and {t.state for t in trials} == {TrialState.SUCCEEDED.value}
    assert len({t.hparams["x"] for t in trials}) == 6
    stopped = [t for t in trials if t.early_stopped]
    assert stopped, "with six sequential trials some must fall behind the best at a rung"
    assert not trials[0].early_stopped
    with sqlite_rig.store.session_scope() as s:
        for trial in stopped:
            stop = (trial.search_state or {})["early_stop"]
            assert stop["step"] in (1, 2, 4)  # a rung: 8 / 2**k
            earlier = [_value_at(s, t.id, stop["step"]) for t in trials
                       if t.number < trial.number]
            assert stop["value"] > min(value for value in earlier if value is not None)
    full = [t for t in trials if not t.early_stopped]
    assert all((t.verification or {}).get("verified") is True for t in full)


def test_asha_with_a_time_metric_counts_its_rungs_and_length_in_the_metrics_values(
        sqlite_rig: Rig) -> None:
    """Determined's time_metric: the script reports validation at steps 10, 20, ... with
    `epochs: 1, 2, ...`; max_length 8 and the rungs are epochs, so trials are judged (and
    stopped) at epochs, and a trial that ran them all is verified complete by its epochs
    although its steps (80) say nothing of them."""
    experiment_id = submit_search(
        sqlite_rig, {"name": "asha", "max_trials": 5, "max_concurrent_trials": 1,
                     "max_length": 8, "divisor": 2, "max_rungs": 4, "time_metric": "epochs",
                     **LOSS},
        {"x": {"type": "double", "minval": 0, "maxval": 1}}, pause=0.2, clock="epochs")
    assert run_search(sqlite_rig, experiment_id) is ExperimentState.COMPLETED
    trials = trials_of(sqlite_rig.store, experiment_id)
    assert {t.state for t in trials} == {TrialState.SUCCEEDED.value}
    stopped = [t for t in trials if t.early_stopped]
    assert stopped, "with five sequential random trials some must fall behind the best"
    with sqlite_rig.store.session_scope() as s:
        for trial in stopped:
            stop = (trial.search_state or {})["early_stop"]
            assert stop["time"] in (1, 2, 4)  # a rung, in epochs (8 / 2**k)
            assert stop["step"] == 10 * stop["time"]  # the report it was judged at
            events = [e.message or "" for e in s.scalars(select(Event).where(
                Event.trial_id == trial.id, Event.reason == "early stop"))]
            assert any(f"at epochs {stop['time']} (rung" in m for m in events), events
    full = [t for t in trials if not t.early_stopped]
    assert full
    for trial in full:
        verification = trial.verification or {}
        assert verification.get("verified") is True, verification
        checks = {c["name"]: c for c in verification["checks"]}
        assert checks["completed"]["detail"] == "reached epoch 8 of 8 (searcher.max_length)"


def _value_at(s: Any, trial_id: int, step: int) -> float | None:
    values = [m.values["loss"] for m in s.scalars(select(Metric).where(
        Metric.trial_id == trial_id, Metric.kind == "validation", Metric.step == step))]
    return values[0] if values else None


def test_failed_trials_do_not_stall_the_search(sqlite_rig: Rig) -> None:
    experiment_id = submit_search(
        sqlite_rig, {"name": "grid", **LOSS},
        {"x": {"type": "categorical", "vals": [0.1, 0.2]},
         "fail": {"type": "categorical", "vals": [False, True]}})
    assert run_search(sqlite_rig, experiment_id) is ExperimentState.COMPLETED
    trials = trials_of(sqlite_rig.store, experiment_id)
    assert sorted((t.hparams["fail"], t.state) for t in trials) == [
        (False, "SUCCEEDED"), (False, "SUCCEEDED"), (True, "FAILED"), (True, "FAILED")]


def test_a_search_where_every_trial_fails_ends_in_error(sqlite_rig: Rig) -> None:
    experiment_id = submit_search(
        sqlite_rig, {"name": "random", "max_trials": 3, **LOSS},
        {"x": {"type": "double", "minval": 0, "maxval": 1}, "fail": True})
    assert run_search(sqlite_rig, experiment_id) is ExperimentState.ERROR
    assert [t.state for t in trials_of(sqlite_rig.store, experiment_id)] == ["FAILED"] * 3


def test_a_new_supervisor_mid_search_draws_no_trial_twice(rig: Rig) -> None:
    experiment_id = submit_search(
        rig, {"name": "tpe", "max_trials": 6, "max_concurrent_trials": 2, **LOSS},
        {"x": {"type": "double", "minval": 0, "maxval": 1},
         "width": {"type": "categorical", "vals": [8, 16, 32]}}, pause=0.1)
    rig.tick_until(lambda: sum(t.state == TrialState.SUCCEEDED.value
                               for t in trials_of(rig.store, experiment_id)) >= 2,
                   what="two trials to succeed")
    before = {t.number: t.hparams for t in trials_of(rig.store, experiment_id)}
    restarted = rig.restarted()
    assert run_search(restarted, experiment_id) is ExperimentState.COMPLETED
    trials = trials_of(rig.store, experiment_id)
    assert [t.number for t in trials] == list(range(6))
    assert {t.number: t.hparams for t in trials if t.number in before} == before
    assert len({t.hparams["x"] for t in trials}) == 6


def test_the_same_seed_draws_the_same_hyperparameters(sqlite_rig: Rig) -> None:
    space = {"lr": {"type": "log", "minval": -4, "maxval": -1},
             "hidden": {"type": "categorical", "vals": [64, 128, 256]},
             "dropout": {"type": "double", "minval": 0, "maxval": 0.5},
             "layers": {"type": "int", "minval": 1, "maxval": 4}}
    searcher = {"name": "random", "max_trials": 4, "max_concurrent_trials": 4, **LOSS}
    ids = [submit_search(sqlite_rig, searcher, space, seed=seed) for seed in (11, 11, 12)]
    sqlite_rig.supervisor.tick()  # draws every trial; they have not run yet
    draws = [[t.hparams for t in trials_of(sqlite_rig.store, i)] for i in ids]
    assert len(draws[0]) == 4 and draws[0] == draws[1] and draws[0] != draws[2]
    for hparams in draws[0]:
        assert 1e-4 <= hparams["lr"] <= 1e-1 and hparams["hidden"] in (64, 128, 256)
        assert isinstance(hparams["layers"], int) and 1 <= hparams["layers"] <= 4


def test_a_search_killed_before_its_first_draw_ends_canceled(sqlite_rig: Rig) -> None:
    experiment_id = submit_search(
        sqlite_rig, {"name": "random", "max_trials": 3, **LOSS},
        {"x": {"type": "double", "minval": 0, "maxval": 1}})
    kill_experiment(sqlite_rig.store, sqlite_rig.admin, experiment_id)
    sqlite_rig.supervisor.tick()
    assert sqlite_rig.experiment_state(experiment_id) is ExperimentState.CANCELED
    assert trials_of(sqlite_rig.store, experiment_id) == []  # and nothing was drawn
