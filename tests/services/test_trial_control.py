"""One trial's controls with real processes (issue 36, deliverable 4): `kill_trial`,
`pause_trial`, `activate_trial`, `restart_trial` on a random search of
tests/fixtures/harness_train.py trials (each runs until its file exists, saving a
checkpoint each 10 steps), while the rest of the search goes on."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from sqlalchemy import select

from muster.errors import Conflict, Forbidden
from muster.services import trial_control
from muster.services.experiments import create_experiment, pause_experiment
from muster.states import ExperimentState, TrialState
from muster.store import Trial
from muster.supervise.searching import _past
from tests.accounts import add_user
from tests.supervise.conftest import Rig, Submitted, TrialView, fixture_entrypoint

pytestmark = [pytest.mark.lifecycle, pytest.mark.timeout(180)]


def search(rig: Rig, until: Path, max_trials: int = 3, concurrent: int = 2) -> int:
    """A random search of `max_trials` trials, `concurrent` at once, each running until
    `until` exists."""
    config = {
        "name": "trial-control",
        "entrypoint": fixture_entrypoint("harness_train.py", "--until", str(until),
                                         "--pause", "0.02"),
        "hyperparameters": {"x": {"type": "double", "minval": 0.0, "maxval": 1.0}},
        "searcher": {"name": "random", "metric": "val_loss", "max_trials": max_trials,
                     "max_concurrent_trials": concurrent},
        "failure_policy": {"stop_grace": 5.0},
    }
    return create_experiment(rig.store, rig.home, rig.admin, yaml.safe_dump(config))


def trials_of(rig: Rig, experiment_id: int) -> list[TrialView]:
    with rig.store.session_scope() as s:
        ids = s.scalars(select(Trial.id).where(Trial.experiment_id == experiment_id)
                        .order_by(Trial.number)).all()
    return [rig.trial(i) for i in ids]


def running(rig: Rig, experiment_id: int, count: int) -> list[TrialView]:
    """Tick until `count` trials of the experiment run and have saved a checkpoint (with
    their first validation); those trials."""
    def saved(trial: TrialView) -> bool:
        metrics = trial.attempts[-1].run_dir / "rank-0.metrics.jsonl"
        return metrics.exists() and "val_loss" in metrics.read_text()

    def reporting() -> list[TrialView] | None:
        found = [t for t in trials_of(rig, experiment_id)
                 if t.state == "RUNNING" and t.attempts and saved(t)]
        return found if len(found) >= count else None

    found = rig.tick_until(reporting, what=f"{count} trials running")
    assert isinstance(found, list)
    return found


def log_of(trial: TrialView, attempt: int) -> str:
    path = trial.attempts[attempt - 1].run_dir / "rank-0.log"
    return path.read_text() if path.exists() else ""


def requests(trial: TrialView) -> list[tuple[str, str]]:
    """(reason, actor) of the trial's recorded requests (events without a move)."""
    return [(e.reason, e.actor) for e in trial.decisions()]


def test_a_killed_trial_is_canceled_and_its_search_goes_on(rig: Rig, tmp_path: Path) -> None:
    until = tmp_path / "until"
    experiment_id = search(rig, until)
    first, _ = running(rig, experiment_id, 2)

    view = trial_control.kill_trial(rig.store, rig.admin, first.id)
    assert view["state"] == "RUNNING"  # the supervisor stops it
    trial_control.kill_trial(rig.store, rig.admin, first.id)  # asking twice is harmless
    killed = rig.until_trial(Submitted(experiment_id, first.id), TrialState.CANCELED)
    assert killed.reason == "killed"
    assert requests(killed) == [("kill requested", rig.admin.name)]
    assert killed.counters == (0, 0, 0, 0)
    # Its place is taken: the search draws trial 3 while the other goes on.
    rig.tick_until(lambda: len(trials_of(rig, experiment_id)) == 3, what="the third draw")
    assert rig.experiment_state(experiment_id) is ExperimentState.ACTIVE
    with rig.store.session_scope() as s:
        assert _past(s.get_one(Trial, first.id), {}).outcome == "canceled"  # not a result

    with pytest.raises(Conflict, match=f"trial {first.id} is already CANCELED; an ended trial "
                                       "cannot be paused"):
        trial_control.pause_trial(rig.store, rig.admin, first.id)
    running(rig, experiment_id, 2)  # (a trial that finds the file at once trains nothing)
    until.touch()
    rig.tick_until(lambda: rig.experiment_state(experiment_id).is_terminal(),
                   what="the search to end")
    assert rig.experiment_state(experiment_id) is ExperimentState.COMPLETED
    assert [t.state for t in trials_of(rig, experiment_id)] == [
        "CANCELED", "SUCCEEDED", "SUCCEEDED"]


def test_a_paused_trial_waits_while_its_experiment_runs_and_resumes_when_activated(
        rig: Rig, tmp_path: Path) -> None:
    until = tmp_path / "until"
    experiment_id = search(rig, until, max_trials=2)
    paused, other = running(rig, experiment_id, 2)

    trial_control.pause_trial(rig.store, rig.admin, paused.id)
    job = Submitted(experiment_id, paused.id)
    view = rig.until_trial(job, TrialState.PAUSED)
    for _ in range(10):  # it waits for a person, while its experiment is ACTIVE
        rig.supervisor.tick()
    assert rig.trial(paused.id).state == "PAUSED"
    assert rig.experiment_state(experiment_id) is ExperimentState.ACTIVE
    assert rig.trial(other.id).state == "RUNNING"
    assert rig.supervisor.slots_in_use() == 1  # its slot is free
    assert requests(view)[-1] == ("pause requested", rig.admin.name)
    assert ("RUNNING", "PAUSED", "paused") in view.trial_moves()
    assert "stop requested" in log_of(view, 1)  # it left after a checkpoint of its own

    trial_control.activate_trial(rig.store, rig.admin, paused.id)
    rig.until_trial(job, TrialState.RUNNING)
    rig.tick_until(lambda: "restored step" in log_of(rig.trial(paused.id), 2),
                   what="attempt 2 to resume from the checkpoint saved at the pause")
    until.touch()
    rig.tick_until(lambda: rig.experiment_state(experiment_id).is_terminal(),
                   what="the search to end")
    resumed = rig.trial(paused.id)
    assert (resumed.state, resumed.counters) == ("SUCCEEDED", (0, 0, 0, 0))
    assert ("PAUSED", "QUEUED", "activated") in resumed.trial_moves()


def test_a_restart_stops_a_running_trial_and_queues_it_from_its_checkpoint(
        rig: Rig, tmp_path: Path) -> None:
    until = tmp_path / "until"
    experiment_id = search(rig, until, max_trials=1, concurrent=1)
    [trial] = running(rig, experiment_id, 1)
    job = Submitted(experiment_id, trial.id)

    trial_control.restart_trial(rig.store, rig.admin, trial.id)
    trial_control.restart_trial(rig.store, rig.admin, trial.id)  # under way: harmless
    rig.tick_until(lambda: len(rig.trial(trial.id).attempts) == 2
                   and rig.trial(trial.id).state == "RUNNING", what="attempt 2 to run")
    rig.tick_until(lambda: "restored step" in log_of(rig.trial(trial.id), 2),
                   what="attempt 2 to resume from its checkpoint")
    view = rig.trial(trial.id)
    assert requests(view)[-1] == ("restart requested", rig.admin.name)
    moves = view.trial_moves()
    assert moves.index(("RUNNING", "PAUSED", "restarted")) + 1 == moves.index(
        ("PAUSED", "QUEUED", "requeued"))
    assert view.counters == (0, 0, 0, 0)  # no failure, no budget
    assert view.attempts[0].reason == "STOPPED"

    pause_experiment(rig.store, rig.admin, experiment_id)
    rig.until_trial(job, TrialState.PAUSED)
    with pytest.raises(Conflict, match=f"trial {trial.id}'s experiment {experiment_id} is "
                                       "PAUSED; a trial can be restarted only while its "
                                       "experiment is ACTIVE"):
        trial_control.restart_trial(rig.store, rig.admin, trial.id)


def test_refusals_name_what_can_be_done(rig: Rig, tmp_path: Path) -> None:
    until = tmp_path / "until"
    rig.set_slots(1)  # the second trial waits in the queue
    experiment_id = search(rig, until, max_trials=2)
    [trial] = running(rig, experiment_id, 1)
    queued = rig.tick_until(lambda: [t for t in trials_of(rig, experiment_id)
                                     if t.state == "QUEUED"], what="a queued second trial")
    [waiting] = queued
    with pytest.raises(Conflict, match=f"trial {waiting.id} is QUEUED; only a running trial "
                                       "can be restarted: it is queued"):
        trial_control.restart_trial(rig.store, rig.admin, waiting.id)
    # A queued trial pauses at once, and a kill of a paused one cancels it at once.
    assert trial_control.pause_trial(rig.store, rig.admin, waiting.id)["state"] == "PAUSED"
    assert trial_control.kill_trial(rig.store, rig.admin, waiting.id)["state"] == "CANCELED"
    # Someone else's trial: refused for a user, whatever the state.
    bob = add_user(rig.store, "bob")
    for control in (trial_control.kill_trial, trial_control.pause_trial,
                    trial_control.activate_trial, trial_control.restart_trial):
        with pytest.raises(Forbidden):
            control(rig.store, bob, trial.id)
    # A paused experiment's trials are activated with it.
    pause_experiment(rig.store, rig.admin, experiment_id)
    rig.until_trial(Submitted(experiment_id, trial.id), TrialState.PAUSED)
    with pytest.raises(Conflict, match=f"experiment {experiment_id} is PAUSED; a trial can "
                                       "be activated only while its experiment is ACTIVE; "
                                       f"`muster experiment activate {experiment_id}`"):
        trial_control.activate_trial(rig.store, rig.admin, trial.id)
    assert trial_control.kill_trial(rig.store, rig.admin, trial.id)["state"] == "CANCELED"
    rig.tick_until(lambda: rig.experiment_state(experiment_id).is_terminal(),
                   what="the experiment to end")
    # Every trial killed: the experiment is CANCELED, not an ERROR of its trials.
    assert rig.experiment_state(experiment_id) is ExperimentState.CANCELED


def test_a_suspect_trial_is_for_its_review(rig: Rig) -> None:
    """A crash the script catches exits 0 with a traceback in its log: SUSPECT, which only a
    review resolves."""
    job = rig.submit(fixture_entrypoint("harness_train.py", "--catch-crash-after", "3"))
    trial = rig.until_trial(job, TrialState.SUSPECT)
    for control in (trial_control.kill_trial, trial_control.restart_trial):
        with pytest.raises(Conflict, match=f"trial {trial.id} is SUSPECT: it exited 0 but "
                                           "failed a verification, and a review decides it "
                                           rf"\(`muster trial review {trial.id} "):
            control(rig.store, rig.admin, trial.id)
