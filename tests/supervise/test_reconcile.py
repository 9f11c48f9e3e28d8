"""Reconciliation on start: what a restarted server finds, and what it makes of it.

"The server is down" here means nobody ticks; "the server starts again" means a NEW
Supervisor with a NEW LocalLauncher on the same store and home calls `reconcile_attempts`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from muster.atomic import atomic_write_json
from muster.launch.base import ProcessIdentity
from muster.launch.identity import is_alive, read_identity, send_signal
from muster.rundir import RankFiles
from muster.services.experiments import kill_experiment
from muster.states import AttemptState, ExperimentState, ReplicaPhase, TrialState
from muster.store import Attempt, Replica, Trial, transition
from muster.supervise.reconcile import reconcile_attempts
from tests.processes import live_group
from tests.supervise.conftest import EventView, Rig, Submitted, TrialView, fixture_entrypoint
from tests.waiting import wait_until

pytestmark = [pytest.mark.lifecycle, pytest.mark.timeout(60)]


def _reconcile_events(trial: TrialView) -> list[EventView]:
    return [e for e in trial.events if e.reason == "reconcile"]


def _running(rig: Rig, job: Submitted) -> tuple[TrialView, RankFiles]:
    """Tick until the trial runs and its script has written its first line."""
    trial = rig.until_trial(job, TrialState.RUNNING)
    files = RankFiles(trial.attempts[0].run_dir, 0)
    wait_until(lambda: files.log.exists() and files.log.read_bytes(), what="the first line")
    return trial, files


def _numbered_lines(log: bytes) -> int:
    """Check the log is "line 0", "line 1", ... once each and in order, then the last line."""
    *lines, last = log.decode().splitlines()
    assert lines == [f"line {n}" for n in range(len(lines))]
    assert last == f"done after {len(lines)} lines"
    return len(lines)


def test_an_exit_while_down_is_finalised_from_its_exit_record(rig: Rig, tmp_path: Path) -> None:
    release = tmp_path / "release"
    job = rig.submit(fixture_entrypoint("wait_for_file.py", str(release)))
    _, files = _running(rig, job)

    release.touch()  # the trial ends while nobody ticks
    wait_until(files.exit.exists, what="the shim's exit record")
    restarted = rig.restarted()
    found = reconcile_attempts(restarted.supervisor)

    assert found == Counter({ReplicaPhase.EXITED: 1})
    trial = restarted.trial(job.trial_id)  # finalised by reconciliation itself, before a tick
    assert (trial.state, trial.reason) == ("SUCCEEDED", "OK")
    [attempt] = trial.attempts
    assert (attempt.state, attempt.replica_reason, attempt.exit_code) == ("SUCCEEDED", "OK", 0)
    assert [(e.entity, e.actor, e.message) for e in _reconcile_events(trial)] == [
        ("attempt", "system:server-start", "attempt 1 finalised from its exit record")
    ]
    assert files.log.read_bytes() == b"waiting\nreleased\n"
    restarted.supervisor.tick()
    assert restarted.experiment_state(job.experiment_id) is ExperimentState.COMPLETED


def test_a_running_shim_is_reattached(rig: Rig, tmp_path: Path) -> None:
    release = tmp_path / "release"
    job = rig.submit(fixture_entrypoint("count_until_file.py", str(release)))
    before, files = _running(rig, job)

    restarted = rig.restarted()
    found = reconcile_attempts(restarted.supervisor)

    assert found == Counter({ReplicaPhase.RUNNING: 1})
    reattached = restarted.trial(job.trial_id)
    assert (reattached.state, [a.number for a in reattached.attempts]) == ("RUNNING", [1])
    assert [e.message for e in _reconcile_events(reattached)] == [
        "attempt 1 reattached to its running process"
    ]
    restarted.supervisor.tick()  # following it launches nothing new
    release.touch()
    trial = restarted.run_to_end(job)

    assert (trial.state, trial.reason) == ("SUCCEEDED", "OK")
    [attempt] = trial.attempts
    assert attempt.shim_pid == before.attempts[0].shim_pid
    assert sorted(p.name for p in attempt.run_dir.parent.glob("attempt-*") if p.is_dir()) == [
        "attempt-1"]  # (beside it, attempt-1.outside.json: what muster saw of it)
    assert _numbered_lines(files.log.read_bytes()) > 0


def _kill_shim_and_child(rig: Rig, files: RankFiles) -> None:
    """SIGKILL the shim first (so it records nothing), then its training process group."""
    status = rig.supervisor.launcher.describe(files.attempt_dir, files.rank)
    shim, child = status.shim, status.child
    assert shim is not None and child is not None
    assert send_signal(shim, signal.SIGKILL)
    wait_until(lambda: not is_alive(shim), what="the shim to die")
    with contextlib.suppress(ProcessLookupError):
        os.killpg(child.pid, signal.SIGKILL)
    wait_until(lambda: live_group(child.pid) == [], what="the child's group to die")


def test_a_shim_killed_while_down_is_lost_and_retried(rig: Rig, tmp_path: Path) -> None:
    release = tmp_path / "release"
    job = rig.submit(fixture_entrypoint("wait_for_file.py", str(release)))
    _, files = _running(rig, job)

    _kill_shim_and_child(rig, files)
    release.touch()  # so that the next attempt ends at once
    restarted = rig.restarted()
    found = reconcile_attempts(restarted.supervisor)

    assert found == Counter({ReplicaPhase.LOST: 1})
    assert not files.exit.exists()
    lost = restarted.trial(job.trial_id)
    assert lost.state == "RESTARTING"
    assert (lost.attempts[0].state, lost.attempts[0].replica_reason) == ("FAILED", "LOST")
    assert [e.message for e in _reconcile_events(lost)] == [
        "attempt 1 lost: no exit record and no live process with its identity"
    ]
    trial = restarted.run_to_end(job)
    assert (trial.state, [a.state for a in trial.attempts]) == (
        "SUCCEEDED", ["FAILED", "SUCCEEDED"]
    )
    assert trial.counters == (1, 0, 0, 0)
    assert [(e.reason, e.message) for e in trial.decisions()] == [
        ("LOST", "LOST failure; restarting the trial's replicas (restart 1 of 5)")
    ]


@pytest.fixture
def impostors() -> Iterator[tuple[subprocess.Popen[bytes], subprocess.Popen[bytes]]]:
    """Two unrelated processes, each leading its own session (as daemons and shims do)."""
    procs = [subprocess.Popen(["sleep", "60"], start_new_session=True) for _ in range(2)]
    yield procs[0], procs[1]
    for proc in procs:
        proc.kill()
        proc.wait()


def _earlier(proc: subprocess.Popen[bytes]) -> ProcessIdentity:
    """The identity of a process that held `proc`'s pid before it: same pid, earlier start."""
    identity = read_identity(proc.pid)
    assert identity is not None
    return ProcessIdentity(identity.pid, identity.start_ticks - 1)


def _record_running_attempt(
    rig: Rig, job: Submitted, shim: ProcessIdentity, child: ProcessIdentity
) -> Path:
    """Write, as a crashed server would have left them, a RUNNING attempt and its files."""
    with rig.store.session_scope() as s:
        trial = s.get_one(Trial, job.trial_id)
        attempt_dir = rig.home.run_dir(trial.uuid).attempt(1).path
        attempt = Attempt(trial=trial, number=1, state=AttemptState.STARTING.value,
                          run_dir=str(attempt_dir))
        s.add_all([attempt, Replica(attempt=attempt, rank=0, host="localhost",
                                    log_path=str(attempt_dir / "rank-0.log"),
                                    shim_pid=shim.pid, shim_start_ticks=shim.start_ticks,
                                    pid=child.pid, start_ticks=child.start_ticks)])
        transition(s, trial, TrialState.STARTING, reason="launching", actor="test")
        transition(s, attempt, AttemptState.RUNNING, reason="started", actor="test")
        transition(s, trial, TrialState.RUNNING, reason="started", actor="test")
    files = RankFiles(attempt_dir, 0)
    attempt_dir.mkdir(parents=True)
    launched_at = time.time() - 3600
    atomic_write_json(files.launch, {"shim_pid": shim.pid, "shim_start_ticks": shim.start_ticks,
                                     "launched_at": launched_at})
    atomic_write_json(files.status, {
        "shim_pid": shim.pid, "shim_start_ticks": shim.start_ticks, "child_pid": child.pid,
        "child_start_ticks": child.start_ticks, "pgid": child.pid, "started_at": launched_at,
    })
    files.log.write_bytes(b"written before the crash\n")
    return attempt_dir


def test_a_recycled_pid_is_lost_and_never_signalled(
    rig: Rig, impostors: tuple[subprocess.Popen[bytes], subprocess.Popen[bytes]]
) -> None:
    job = rig.submit(fixture_entrypoint("exit0.sh"))
    _record_running_attempt(rig, job, _earlier(impostors[0]), _earlier(impostors[1]))

    found = reconcile_attempts(rig.restarted().supervisor)

    assert found == Counter({ReplicaPhase.LOST: 1})
    lost = rig.trial(job.trial_id)
    assert lost.state == "RESTARTING"
    assert (lost.attempts[0].state, lost.attempts[0].replica_reason) == ("FAILED", "LOST")
    assert len(_reconcile_events(lost)) == 1
    trial = rig.run_to_end(job)
    assert (trial.state, [a.number for a in trial.attempts]) == ("SUCCEEDED", [1, 2])
    assert [p.poll() for p in impostors] == [None, None]  # neither was signalled


def test_killing_a_trial_whose_pid_was_recycled_signals_nothing(
    rig: Rig, impostors: tuple[subprocess.Popen[bytes], subprocess.Popen[bytes]]
) -> None:
    job = rig.submit(fixture_entrypoint("exit0.sh"))
    attempt_dir = _record_running_attempt(
        rig, job, _earlier(impostors[0]), _earlier(impostors[1])
    )
    kill_experiment(rig.store, rig.admin, job.experiment_id)  # asked just before the crash

    found = reconcile_attempts(rig.restarted().supervisor)

    assert found == Counter({ReplicaPhase.LOST: 1})
    trial = rig.run_to_end(job)
    assert (trial.state, trial.reason, len(trial.attempts)) == ("CANCELED", "killed", 1)
    assert trial.attempts[0].replica_reason == "LOST"
    assert RankFiles(attempt_dir, 0).stop.exists()  # the cancel did happen
    assert [p.poll() for p in impostors] == [None, None]  # ...and reached no one
