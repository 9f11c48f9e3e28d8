"""`harness: true`: a trial is RUNNING only once every rank has checked in through
muster.harness.init(); a rank that never does is STALLED, or, when the run exits 0 anyway,
the trial is SUSPECT. Real processes; the test opens the check-in gates itself."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from sqlalchemy import select

from muster.services.experiments import create_experiment
from muster.states import TrialState
from muster.store import Attempt, Trial
from tests.supervise.conftest import Rig, Submitted, fixture_entrypoint

pytestmark = [pytest.mark.lifecycle, pytest.mark.timeout(90)]


def submit(rig: Rig, tmp_path: Path, harness: bool, variables: dict[str, str],
           **policy: object) -> Submitted:
    config = {
        "name": "check-in-test",
        "entrypoint": fixture_entrypoint("check_in.py"),
        "harness": harness,
        "environment": {"variables": {"RELEASE": str(tmp_path / "release"), **variables}},
        "resources": {"replicas": 2},
        "failure_policy": {"stop_grace": 5.0, **policy},
        "verify": {"require_checkpoint": False},
    }
    experiment_id = create_experiment(rig.store, rig.home, rig.admin,
                                      yaml.safe_dump(config), archive=None)
    with rig.store.session_scope() as s:
        trial_id = s.scalars(select(Trial.id).where(Trial.experiment_id == experiment_id)).one()
    return Submitted(experiment_id, trial_id)


def stored(rig: Rig, trial_id: int) -> dict[str, Any]:
    with rig.store.session_scope() as s:
        trial = s.get_one(Trial, trial_id)
        attempt = s.scalars(select(Attempt).where(Attempt.trial_id == trial_id)
                            .order_by(Attempt.number)).first()
        return {"state": trial.state, "waiting": trial.queue_reason,
                "attempt": attempt.state if attempt else None,
                "run_dir": Path(attempt.run_dir) if attempt else None,
                "verification": trial.verification}


def log_says(rig: Rig, trial_id: int, rank: int, text: str) -> bool:
    run_dir = stored(rig, trial_id)["run_dir"]
    log = run_dir / f"rank-{rank}.log" if run_dir else None
    return log is not None and log.exists() and text in log.read_text()


def test_running_waits_until_every_rank_has_checked_in(rig: Rig, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    job = submit(rig, tmp_path, True, {"CHECK_IN_GATE_1": str(gate)})
    rig.tick_until(lambda: log_says(rig, job.trial_id, 0, "rank 0 checked in")
                   and log_says(rig, job.trial_id, 1, "rank 1 is up"),
                   what="rank 0 to check in and rank 1 to wait at its gate")
    rig.supervisor.tick()
    # Both processes run; rank 1 has not called init() yet: not RUNNING.
    assert stored(rig, job.trial_id) | {"run_dir": None, "verification": None} == {
        "state": "STARTING", "attempt": "STARTING", "run_dir": None, "verification": None,
        "waiting": "waiting for rank 1 to check in through muster.harness.init() "
                   "(2 of 2 replicas started)"}
    gate.touch()
    trial = rig.until_trial(job, TrialState.RUNNING)
    assert stored(rig, job.trial_id)["waiting"] is None
    assert [e.message for e in trial.events if e.entity == "attempt"
            and e.to_state == "RUNNING"] == ["all 2 replicas started and checked in"]
    (tmp_path / "release").touch()
    trial = rig.run_to_end(job)
    assert (trial.state, trial.reason) == ("SUCCEEDED", "OK")
    checks = stored(rig, job.trial_id)["verification"]["checks"]
    assert {"name": "check_in", "passed": True, "status": "passed",
            "detail": "all 2 ranks checked in through muster.harness.init()"} in checks


def test_without_the_declaration_running_means_started(rig: Rig, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    job = submit(rig, tmp_path, False, {"CHECK_IN_GATE_1": str(gate)})
    trial = rig.until_trial(job, TrialState.RUNNING)
    assert not log_says(rig, job.trial_id, 1, "rank 1 checked in")  # still at its gate
    assert [e.message for e in trial.events if e.entity == "attempt"
            and e.to_state == "RUNNING"] == ["all 2 replicas started"]
    gate.touch()
    (tmp_path / "release").touch()
    assert rig.run_to_end(job).state == "SUCCEEDED"
    checks = stored(rig, job.trial_id)["verification"]["checks"]
    assert "check_in" not in [c["name"] for c in checks]


def test_a_rank_that_never_checks_in_is_stalled(rig: Rig, tmp_path: Path) -> None:
    job = submit(rig, tmp_path, True, {"SKIP_INIT_1": "sleep"}, heartbeat_timeout="1500ms",
                 replica_restarts=0, trial_retries=0)
    trial = rig.run_to_end(job)
    assert (trial.state, trial.reason) == ("FAILED", "STALLED")
    assert [e.message for e in trial.events if e.entity == "attempt"
            and e.to_state == "RUNNING"] == ["ended before every replica had checked in"]
    assert trial.message is not None
    assert "The replica worker-1 (rank 1)" in trial.message
    # The seconds are how late the pass that noticed it came (2 s on a quiet machine, 5 s
    # seen under CI's load): the rest of the words are what matters.
    assert re.search(r"no check-in \d+s after it started \(heartbeat_timeout 1\.5s\): the "
                     r"config sets `harness: true`, but this rank has not called "
                     r"muster\.harness\.init\(\)", trial.message), trial.message


def test_exit_0_without_a_check_in_is_suspect(rig: Rig, tmp_path: Path) -> None:
    job = submit(rig, tmp_path, True, {"SKIP_INIT_1": "exit"})
    ended = "rank 1 ended without checking in (2 of 2 replicas started)"
    rig.tick_until(lambda: stored(rig, job.trial_id)["waiting"] == ended,
                   what="the trial to say that rank 1 ended without checking in")
    assert stored(rig, job.trial_id)["state"] == "STARTING"
    (tmp_path / "release").touch()
    trial = rig.until_trial(job, TrialState.SUSPECT)  # settled; it waits for a review
    assert [e.message for e in trial.events if e.entity == "attempt"
            and e.to_state == "RUNNING"] == ["ended before every replica had checked in"]
    assert trial.message is not None and trial.message.endswith(
        "but verification failed: check_in: rank 1 of attempt 1 never checked in through "
        "muster.harness.init(), although the config sets `harness: true`"), trial.message
