"""Issue 30 item 12: no experiment waits for ever in silence.

Every searcher, with `max_trials` 1 and 2 (a grid: 1 and 2 points), runs its trials and ends
COMPLETED, under one real supervisor with real trial processes (tests/fixtures/search_job.py)
on each database backend. Before, a `random` or `tpe` search of `max_trials: 1` never drew
its trial (the top-up looked only at experiments of more than one trial): it stayed ACTIVE,
with 0 trials, for ever. And an ACTIVE experiment with nothing running, queued or left to
draw (a single experiment that lost its trial) ends ERROR with an event that says why.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import yaml
from sqlalchemy import delete, select

from muster.home import Home
from muster.launch.local import LocalLauncher
from muster.schedule.local_placement import LocalPlacement
from muster.services.experiments import create_experiment
from muster.states import EventReason, ExperimentState, TrialState
from muster.store import Event, Experiment, Store, Trial
from muster.supervise.supervisor import Supervisor
from tests.accounts import first_admin
from tests.processes import kill_home_processes
from tests.supervise.conftest import Rig, fixture_entrypoint

pytestmark = [pytest.mark.lifecycle, pytest.mark.timeout(300)]

LOSS = {"metric": "loss", "smaller_is_better": True}
X = {"type": "double", "minval": 0, "maxval": 1}
# (name, searcher, hyperparameters, trials it runs)
CASES: list[tuple[str, dict[str, Any], dict[str, Any], int]] = [
    ("single", {"name": "single"}, {"x": 0.2}, 1),
    ("single-max_trials-1", {"name": "single", "max_trials": 1}, {"x": 0.2}, 1),
    ("grid-1-point", {"name": "grid", **LOSS}, {"x": {"type": "categorical", "vals": [0.2]}}, 1),
    ("grid-2-points", {"name": "grid", **LOSS}, {"x": {"type": "categorical",
                                                       "vals": [0.2, 0.4]}}, 2),
    *[(f"{name}-{n}", {"name": name, "max_trials": n, **LOSS}, {"x": X}, n)
      for name in ("random", "tpe") for n in (1, 2)],
    *[(f"{name}-{n}", {"name": name, "max_trials": n, "max_length": 4, **LOSS}, {"x": X}, n)
      for name in ("asha", "adaptive_asha", "bohb") for n in (1, 2)],
]
QUIET_PASSES = 30  # passes with no trial left to run after which a search is stuck


@dataclass(frozen=True)
class Ended:
    state: ExperimentState
    trials: list[str]


def _config(searcher: dict[str, Any], hyperparameters: dict[str, Any]) -> str:
    return yaml.safe_dump({
        "name": f"ends-{searcher['name']}", "entrypoint": fixture_entrypoint("search_job.py"),
        "harness": True, "hyperparameters": hyperparameters, "searcher": searcher,
        "reproducibility": {"experiment_seed": 3},
        "failure_policy": {"stop_grace": 5.0, "trial_retries": 0}})


def _snapshot(store: Store, ids: dict[str, int]) -> dict[str, Ended]:
    with store.session_scope() as s:
        found = {}
        for case, experiment_id in ids.items():
            experiment = s.get_one(Experiment, experiment_id)
            found[case] = Ended(ExperimentState(experiment.state),
                                [t.state for t in experiment.trials])
        return found


def _run(rig: Rig, ids: dict[str, int]) -> dict[str, Ended]:
    """Tick until every experiment ended, or until none has a trial left to run for
    QUIET_PASSES passes (those still ACTIVE then wait in silence: the bug)."""
    quiet, deadline = 0, time.monotonic() + 240
    while time.monotonic() < deadline:
        rig.supervisor.tick()
        now = _snapshot(rig.store, ids)
        if all(e.state.is_terminal() for e in now.values()):
            return now
        idle = not any(TrialState(t).is_unfinished() for e in now.values() for t in e.trials)
        quiet = quiet + 1 if idle else 0
        if quiet >= QUIET_PASSES:
            return now
        time.sleep(0.02)
    return _snapshot(rig.store, ids)


@pytest.fixture(scope="module")
def searched(shared_store: Store, tmp_path_factory: pytest.TempPathFactory
             ) -> Iterator[tuple[Rig, dict[str, Ended]]]:
    """Every case submitted at once and run to its end under one supervisor."""
    home = Home(tmp_path_factory.mktemp("home") / "home").ensure()
    try:
        supervisor = Supervisor(shared_store, LocalLauncher(), home,
                                LocalPlacement(shared_store, slots=4), min_free_disk=0)
        rig = Rig(shared_store, home, supervisor, first_admin(shared_store, home))
        ids = {case: create_experiment(rig.store, home, rig.admin, _config(searcher, space),
                                       archive=None)
               for case, searcher, space, _ in CASES}
        yield rig, _run(rig, ids)
    finally:
        kill_home_processes(home.root)


@pytest.mark.parametrize(("case", "trials"), [(case, n) for case, _, _, n in CASES],
                         ids=[case for case, *_ in CASES])
def test_every_searcher_with_one_or_two_trials_ends_completed(
    searched: tuple[Rig, dict[str, Ended]], case: str, trials: int
) -> None:
    ended = searched[1][case]
    assert ended.state is ExperimentState.COMPLETED, ended
    assert len(ended.trials) == trials and set(ended.trials) == {"SUCCEEDED"}, ended


def test_a_single_experiment_without_its_trial_ends_error_saying_why(
    searched: tuple[Rig, dict[str, Ended]]
) -> None:
    rig = searched[0]
    experiment_id = create_experiment(rig.store, rig.home, rig.admin,
                                      _config({"name": "single"}, {"x": 0.2}), archive=None)
    with rig.store.session_scope() as s:  # lost, as by a hand edit of the store
        trial_ids = list(s.scalars(select(Trial.id).where(Trial.experiment_id == experiment_id)))
        s.execute(delete(Event).where(Event.trial_id.in_(trial_ids)))
        s.execute(delete(Trial).where(Trial.id.in_(trial_ids)))
    ended = rig.tick_until(lambda: rig.experiment_state(experiment_id).is_terminal(),
                           what="the experiment without a trial to end")
    assert ended is True
    with rig.store.session_scope() as s:
        experiment = s.get_one(Experiment, experiment_id)
        assert experiment.state == ExperimentState.ERROR.value
        assert "has no trial" in (experiment.message or ""), experiment.message
        reasons = list(s.scalars(select(Event.reason).where(
            Event.experiment_id == experiment_id, Event.entity == "experiment")))
        assert EventReason.SEARCH_STOPPED.value in reasons, reasons


def test_a_search_of_one_trial_draws_it_in_the_first_pass(
    searched: tuple[Rig, dict[str, Ended]]
) -> None:
    """Not only in the end: the draw happens at once, as for a search of more trials."""
    rig = searched[0]
    experiment_id = create_experiment(
        rig.store, rig.home, rig.admin,
        _config({"name": "random", "max_trials": 1, **LOSS}, {"x": X}), archive=None)
    rig.supervisor.tick()
    with rig.store.session_scope() as s:
        drawn = list(s.scalars(select(Trial.number).where(Trial.experiment_id == experiment_id)))
        events = list(s.scalars(select(Event.message).where(
            Event.experiment_id == experiment_id, Event.entity == "trial",
            Event.reason == EventReason.CREATED.value)))
    assert drawn == [0]
    assert events and events[0].startswith("trial 1 of 1 drawn by random: x="), events
    rig.tick_until(lambda: rig.experiment_state(experiment_id).is_terminal(),
                   what="the one-trial search to end")
    assert rig.experiment_state(experiment_id) is ExperimentState.COMPLETED
