"""The warm standby, with real processes: the next attempt's replicas start while the
current one runs, wait in muster.harness.init(), become the retry when a replica fails,
and are stopped when the trial no longer needs them."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from sqlalchemy import select

from muster.atomic import read_json
from muster.launch.base import ProcessIdentity
from muster.launch.identity import is_alive
from muster.services.experiments import create_experiment
from muster.store import Attempt, Trial
from tests.supervise.conftest import Rig, Submitted, fixture_entrypoint
from tests.waiting import wait_until

pytestmark = [pytest.mark.lifecycle, pytest.mark.timeout(90)]


def submit(rig: Rig, variables: dict[str, str] | None = None, **policy: object) -> Submitted:
    config = {
        "name": "standby-test",
        "entrypoint": fixture_entrypoint("standby_ranks.py"),
        "harness": True,
        "environment": {"variables": variables or {}},
        "resources": {"replicas": 2},
        "failure_policy": {"stop_grace": 5.0, "warm_standby": True, **policy},
        "verify": {"require_checkpoint": False},
    }
    experiment_id = create_experiment(rig.store, rig.home, rig.admin,
                                      yaml.safe_dump(config), archive=None)
    with rig.store.session_scope() as s:
        trial_id = s.scalars(select(Trial.id).where(Trial.experiment_id == experiment_id)).one()
    return Submitted(experiment_id, trial_id)


def attempts(rig: Rig, trial_id: int) -> list[tuple[int, str, bool, Path]]:
    with rig.store.session_scope() as s:
        rows = s.scalars(select(Attempt).where(Attempt.trial_id == trial_id)
                         .order_by(Attempt.number))
        return [(a.number, a.state, a.standby, Path(a.run_dir)) for a in rows]


def children(attempt_dir: Path) -> list[ProcessIdentity]:
    found = []
    for path in sorted(attempt_dir.glob("rank-*.shim.json")):
        status = read_json(path) or {}
        if status.get("child_pid"):
            found.append(ProcessIdentity(status["child_pid"], status["child_start_ticks"]))
    return found


def test_a_failure_promotes_the_standby_that_was_started_ahead(rig: Rig) -> None:
    job = submit(rig)
    trial = rig.run_to_end(job)
    assert (trial.state, trial.reason) == ("SUCCEEDED", "OK")
    found = attempts(rig, job.trial_id)
    assert [(n, state, standby) for n, state, standby, _ in found] == [
        (1, "FAILED", False),     # rank 1 was killed
        (2, "SUCCEEDED", False),  # the standby, promoted
        (3, "CANCELED", True),    # attempt 2's own standby, not needed in the end
    ]
    first, second = found[0][3], found[1][3]
    killed_at = read_json(first / "rank-1.exit.json")["ended_at"]
    for rank in (0, 1):
        started = read_json(second / f"rank-{rank}.shim.json")["started_at"]
        assert started < killed_at, "attempt 2 was not started ahead of the failure"
        log = (second / f"rank-{rank}.log").read_text()
        assert f"rank {rank} of attempt 2 is up" in log
    assert [e.message for e in trial.decisions()] == [
        "INFRA failure; restarting the trial's replicas (restart 1 of 5)"]
    assert ("RESTARTING", "STARTING", "launching") in trial.trial_moves()
    # The unneeded standby's processes are gone.
    wait_until(lambda: not any(map(is_alive, children(found[2][3]))), timeout=30,
               what="the unneeded standby to stop")


def test_killing_the_trial_stops_its_standby(rig: Rig) -> None:
    job = submit(rig, {"STANDBY_NO_KILL": "1"})
    wait_until(lambda: (rig.supervisor.tick(), len(attempts(rig, job.trial_id)) == 2)[1],
               timeout=60, what="the standby to be started")
    standby_dir = attempts(rig, job.trial_id)[1][3]
    wait_until(lambda: len(children(standby_dir)) == 2, timeout=30,
               what="the standby's processes to start")
    with rig.store.session_scope() as s:
        s.get_one(Trial, job.trial_id).stop_requested = True
    trial = rig.run_to_end(job)
    assert trial.state == "CANCELED"
    assert [(n, state, standby) for n, state, standby, _ in attempts(rig, job.trial_id)][1] == (
        2, "CANCELED", True)
    wait_until(lambda: not any(map(is_alive, children(standby_dir))), timeout=30,
               what="the standby to stop")


def test_a_promoted_standby_gets_heartbeat_timeout_from_its_promotion(rig: Rig) -> None:
    """With `harness: true` a rank must check in within heartbeat_timeout of its start; a
    standby waits in init() by design, so its clock starts when it is promoted. Here the
    standby waits ~3 s, longer than the 1.5 s timeout, then takes 0.8 s to check in."""
    job = submit(rig, {"STANDBY_KILL_AFTER": "3", "STANDBY_CHECK_IN_DELAY": "0.8"},
                 heartbeat_timeout="1500ms")
    trial = rig.run_to_end(job)
    assert (trial.state, trial.reason) == ("SUCCEEDED", "OK")
    found = attempts(rig, job.trial_id)
    assert [(n, state) for n, state, _, _ in found][:2] == [(1, "FAILED"), (2, "SUCCEEDED")]
    second = found[1][3]
    for rank in (0, 1):
        started = read_json(second / f"rank-{rank}.shim.json")["started_at"]
        log = (second / f"rank-{rank}.log").read_text()
        promoted = float(log.split(f"rank {rank} was promoted at ")[1].split()[0])
        checked_in = float(log.split(f"rank {rank} checked in at ")[1].split()[0])
        assert promoted - started > 1.5 and checked_in - promoted >= 0.8
    assert not any(e.reason == "STALLED" for e in trial.events)
