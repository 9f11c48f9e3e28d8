"""`failure_policy.silence_timeout`: a replica with no output AND no CPU for that long is
STALLED, harness or not, and its stacks are saved before it is killed (invariant 9).
Real processes: a deadlocked plain script, a silent one that computes, and two gloo ranks
of which one stops calling all_reduce."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
import yaml
from sqlalchemy import select

from muster.launch.activity import read_activity
from muster.launch.small_fs import BALLAST, fill, mount_small_fs, release_small_fs
from muster.services.experiments import create_experiment, kill_experiment
from muster.states import TrialState
from muster.store import Replica, Trial
from tests.supervise.conftest import FIXTURES, Rig, Submitted, fixture_entrypoint

pytestmark = [pytest.mark.lifecycle, pytest.mark.timeout(120)]

SILENCE = 3.0
NO_RETRIES = {"replica_restarts": 0, "trial_retries": 0}
HANG_LINE = next(number for number, line in enumerate(
    (FIXTURES / "hang_on_lock.py").read_text().splitlines(), start=1) if "HANGS HERE" in line)


def replicas(rig: Rig, trial_id: int) -> list[Replica]:
    with rig.store.session_scope() as s:
        rows = s.scalars(select(Replica).join(Replica.attempt)
                         .where(Replica.attempt.has(trial_id=trial_id))
                         .order_by(Replica.rank)).all()
        s.expunge_all()
        return list(rows)


def stall_marker(run_dir: Path, rank: int) -> dict[str, object]:
    data = json.loads((run_dir / f"rank-{rank}.stalled.json").read_text())
    assert isinstance(data, dict)
    return data


def test_a_deadlocked_plain_script_is_stalled_with_its_stack(rig: Rig) -> None:
    job = rig.submit(fixture_entrypoint("hang_on_lock.py"), silence_timeout=f"{SILENCE}s",
                     **NO_RETRIES)
    trial = rig.run_to_end(job)
    assert (trial.state, trial.reason) == ("FAILED", "STALLED")
    attempt = trial.attempts[0]
    marker = stall_marker(attempt.run_dir, 0)
    started = read_activity(attempt.run_dir / "rank-0.active")
    assert started is not None
    # Judged soon after the silence began: its last output was "loading batches".
    assert float(marker["time"]) - started.last <= SILENCE + 5  # type: ignore[arg-type]
    assert str(marker["reason"]).startswith("no output and no CPU time used for ")
    [replica] = replicas(rig, job.trial_id)
    assert replica.reason == "STALLED"
    assert replica.evidence == f"evidence/{marker['bundle']}"
    bundle = attempt.run_dir / replica.evidence / "rank-0"
    stacks = (bundle / "stacks.txt").read_text()
    assert f"hang_on_lock.py:{HANG_LINE}" in stacks  # the `with lock:` line
    assert replica.stack_summary is not None
    assert f"hang_on_lock.py:{HANG_LINE}" in replica.stack_summary
    assert replica.stack_summary.startswith("rank 0 ")
    assert "loading batches" in (bundle / "log-tail.txt").read_text()
    assert replica.message is not None and "stacks: rank 0 " in replica.message


def test_a_silent_script_that_computes_is_not_stalled(rig: Rig) -> None:
    job = rig.submit(fixture_entrypoint("silent_compute.py", str(SILENCE * 3)),
                     silence_timeout=f"{SILENCE}s", **NO_RETRIES)
    trial = rig.run_to_end(job)
    assert trial.reason == "OK", trial.message
    assert not (trial.attempts[0].run_dir / "rank-0.stalled.json").exists()


def test_silence_off_never_judges(rig: Rig, tmp_path: Path) -> None:
    job = rig.submit(fixture_entrypoint("hang_on_lock.py"), silence_timeout="off",
                     **NO_RETRIES)
    trial = rig.until_trial(job, TrialState.RUNNING)
    run_dir = trial.attempts[0].run_dir
    rig.tick_until(lambda: (a := read_activity(run_dir / "rank-0.active")) is not None
                   and a.last < a.cpu_at + 0.1 and _silent_for(a.last, SILENCE + 2),
                   what="the script to be silent past the timeout it would have had",
                   timeout=30)
    assert rig.trial(job.trial_id).state == "RUNNING"
    assert not (run_dir / "rank-0.stalled.json").exists()
    kill_experiment(rig.store, rig.admin, job.experiment_id)
    assert rig.run_to_end(job).reason == "killed"


def _silent_for(last: float, seconds: float) -> bool:
    return time.time() - last >= seconds


def submit_ranks(rig: Rig, entrypoint: list[str], replicas: int) -> Submitted:
    config = {"name": "silence-test", "entrypoint": entrypoint,
              "resources": {"replicas": replicas},
              "failure_policy": {"stop_grace": 1.0, "silence_timeout": f"{SILENCE}s",
                                 **NO_RETRIES}}
    experiment_id = create_experiment(rig.store, rig.home, rig.admin, yaml.safe_dump(config),
                                      archive=None)
    with rig.store.session_scope() as s:
        trial_id = s.scalars(select(Trial.id).where(Trial.experiment_id == experiment_id)).one()
    return Submitted(experiment_id, trial_id)


@pytest.mark.timeout(180)
def test_a_rank_that_stops_calling_all_reduce_stalls_with_both_stacks(rig: Rig) -> None:
    pytest.importorskip("torch")
    job = submit_ranks(rig, fixture_entrypoint("ddp_rank_stops.py", "3"), replicas=2)
    trial = rig.run_to_end(job)
    assert (trial.state, trial.reason) == ("FAILED", "STALLED"), trial.message
    rows = replicas(rig, job.trial_id)
    stalled = [row for row in rows if row.reason == "STALLED"]
    assert len(stalled) == 1
    summary = (stalled[0].stack_summary or "").splitlines()
    assert [line.split()[1] for line in summary] == ["0", "1"], summary
    by_rank = dict(zip((0, 1), summary, strict=True))
    assert "all_reduce" in by_rank[0] or "allreduce" in by_rank[0], by_rank
    assert "wait_for_data" in by_rank[1] or "sleep" in by_rank[1], by_rank
    bundle = trial.attempts[0].run_dir / (stalled[0].evidence or "")
    assert sorted(p.name for p in bundle.iterdir()) == ["rank-0", "rank-1"]
    assert str(FIXTURES / "ddp_rank_stops.py") in (bundle / "rank-1" / "stacks.txt").read_text()


def test_a_stall_found_while_the_disk_is_full_is_stopped_stalled_once_there_is_room(
        rig: Rig) -> None:
    """The run directory is a small tmpfs filled while the script hangs: the stall cannot
    be marked (nor evidence asked for) while it is full, which is said once as an event;
    once there is room the replica is stopped and ends STALLED, not the trial INTERNAL."""
    if os.geteuid() != 0:
        pytest.skip("mounting the small file system needs root")
    job = rig.submit(fixture_entrypoint("hang_on_lock.py"), silence_timeout=f"{SILENCE}s",
                     **NO_RETRIES)
    with rig.store.session_scope() as s:
        uuid = s.get_one(Trial, job.trial_id).uuid
    run_dir = rig.home.run_dir(uuid).path
    mount_small_fs(run_dir, 8 << 20)
    try:
        attempt_dir = rig.until_trial(job, TrialState.RUNNING).attempts[0].run_dir
        rig.tick_until(lambda: "loading batches" in (attempt_dir / "rank-0.log").read_text(),
                       what="the script to reach its hang", timeout=30)
        ballast = fill(run_dir)
        assert ballast > 0
        rig.tick_until(lambda: any("no room to record it" in (e.message or "")
                                   for e in rig.trial(job.trial_id).events),
                       what="the stall to be found on the full disk", timeout=60)
        assert rig.trial(job.trial_id).state == "RUNNING"  # not INTERNAL, and not stopped yet
        assert not (attempt_dir / "rank-0.stalled.json").exists()
        (run_dir / BALLAST).unlink()  # room again
        trial = rig.run_to_end(job)
    finally:
        release_small_fs(run_dir)
    assert (trial.state, trial.reason) == ("FAILED", "STALLED"), trial.message
    [replica] = replicas(rig, job.trial_id)
    assert replica.reason == "STALLED"
    unmarked = [e for e in trial.events if "no room to record it" in (e.message or "")]
    assert len(unmarked) == 1, unmarked  # said once, for all the passes that tried
