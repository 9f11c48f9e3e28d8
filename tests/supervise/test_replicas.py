"""Trials of several replicas, with real processes: the torchrun environment, one log per
rank, all-or-none admission, the primary's last word, the first failure in time as the
cause, and whole-trial restarts."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from sqlalchemy import select

from muster.launch.base import ProcessIdentity, ReplicaSpec
from muster.launch.local import LocalLauncher
from muster.services.experiments import create_experiment
from muster.states import TrialState
from muster.store import Attempt, Replica, Trial
from tests.supervise.conftest import Rig, Submitted, TrialView, fixture_entrypoint
from tests.waiting import wait_until

pytestmark = [pytest.mark.lifecycle, pytest.mark.timeout(90)]


@dataclass(frozen=True)
class ReplicaView:
    attempt: int
    rank: int
    incarnation: int
    reason: str | None
    exit_code: int | None
    signal: str | None
    message: str | None
    log: bytes


def submit(rig: Rig, replicas: int, *behaviours: str, **policy: object) -> Submitted:
    config = {
        "name": "replicas-test",
        "entrypoint": fixture_entrypoint("ranks.py", *behaviours),
        "resources": {"replicas": replicas},
        "failure_policy": {"stop_grace": 1.0, **policy},
    }
    experiment_id = create_experiment(rig.store, rig.home, rig.admin,
                                      yaml.safe_dump(config), archive=None)
    with rig.store.session_scope() as s:
        trial_id = s.scalars(select(Trial.id).where(Trial.experiment_id == experiment_id)).one()
    return Submitted(experiment_id, trial_id)


def replicas(rig: Rig, trial_id: int) -> list[ReplicaView]:
    with rig.store.session_scope() as s:
        rows = s.scalars(select(Replica).join(Attempt).where(Attempt.trial_id == trial_id)
                         .order_by(Attempt.number, Replica.rank, Replica.incarnation))
        return [ReplicaView(r.attempt.number, r.rank, r.incarnation, r.reason, r.exit_code,
                            r.signal, r.message, Path(r.log_path).read_bytes()) for r in rows]


def environment(log: bytes) -> dict[str, str]:
    first = log.decode().splitlines()[0]
    return dict(pair.split("=", 1) for pair in first.split())


def test_every_rank_gets_the_torchrun_environment_and_its_own_log(rig: Rig) -> None:
    job = submit(rig, 3, "late-exit0", "exit0", "exit0")
    trial = rig.run_to_end(job)
    assert (trial.state, trial.reason) == ("SUCCEEDED", "OK")
    found = replicas(rig, job.trial_id)
    assert [(r.rank, r.reason) for r in found] == [(0, "OK"), (1, "OK"), (2, "OK")]
    envs = [environment(r.log) for r in found]
    port = envs[0]["MASTER_PORT"]
    assert re.fullmatch(r"\d+", port) and 0 < int(port) < 65536
    assert envs == [{"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "3",
                     "LOCAL_WORLD_SIZE": "3", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port,
                     "MUSTER_REPLICA_RESTART": "0"}
                    for rank in range(3)]
    [attempt] = trial.attempts
    assert [p.name for p in sorted(attempt.run_dir.glob("rank-[0-9].log"))] == [
        "rank-0.log", "rank-1.log", "rank-2.log"]
    assert ("STARTING", "RUNNING", "started") in [
        (e.from_state, e.to_state, e.reason) for e in trial.events_of(attempt)]
    assert any(e.message == "all 3 replicas started" for e in trial.events_of(attempt))


def test_when_the_primary_succeeds_the_others_are_stopped(rig: Rig) -> None:
    job = submit(rig, 2, "late-exit0", "sleep")
    trial = rig.run_to_end(job)
    assert (trial.state, trial.reason) == ("SUCCEEDED", "OK")
    primary, worker = replicas(rig, job.trial_id)
    assert (primary.reason, primary.exit_code) == ("OK", 0)
    assert (worker.reason, worker.signal) == ("STOPPED", "SIGTERM")
    assert worker.message is not None
    assert worker.message.startswith("The replica worker-1 (rank 1) was stopped by muster")
    assert [a.state for a in trial.attempts] == ["SUCCEEDED"]


def test_a_failing_rank_fails_the_trial_at_once_and_stops_the_primary(rig: Rig) -> None:
    job = submit(rig, 2, "sleep", "fail")
    trial = rig.run_to_end(job)
    assert (trial.state, trial.reason) == ("FAILED", "USER_ERROR")
    assert trial.message is not None
    assert trial.message.startswith(
        "The replica worker-1 (rank 1) exited with a non-zero status of 1. Termination "
        "reason: ValueError: rank 1 found a bad shape")
    primary, worker = replicas(rig, job.trial_id)
    assert (primary.reason, primary.signal) == ("STOPPED", "SIGTERM")
    assert (worker.reason, worker.exit_code) == ("USER_ERROR", 1)
    assert len(trial.attempts) == 1 and trial.counters == (0, 0, 0, 0)


def test_a_killed_rank_restarts_every_replica(rig: Rig) -> None:
    job = submit(rig, 2, "sleep@1,late-exit0", "sigkill@1,exit0")
    trial = rig.run_to_end(job)
    assert (trial.state, trial.reason) == ("SUCCEEDED", "OK")
    assert [(a.number, a.state, a.reason) for a in trial.attempts] == [
        (1, "FAILED", "INFRA"), (2, "SUCCEEDED", "OK")]
    assert [(r.attempt, r.rank, r.reason, r.signal) for r in replicas(rig, job.trial_id)] == [
        (1, 0, "STOPPED", "SIGTERM"), (1, 1, "INFRA", "SIGKILL"),
        (2, 0, "OK", None), (2, 1, "OK", None)]
    assert trial.counters == (1, 0, 0, 0)
    assert [e.message for e in trial.decisions()] == [
        "INFRA failure; restarting the trial's replicas (restart 1 of 5)"]


def test_sigsegv_in_one_rank_is_retried_3_times_then_fails(rig: Rig) -> None:
    job = submit(rig, 2, "sleep", "sigsegv")
    trial = rig.run_to_end(job)
    assert (trial.state, trial.reason) == ("FAILED", "TRANSIENT")
    assert [(a.number, a.state, a.reason) for a in trial.attempts] == [
        (n, "FAILED", "TRANSIENT") for n in (1, 2, 3, 4)]
    assert trial.message is not None and "worker-1 (rank 1)" in trial.message
    assert trial.counters == (0, 3, 0, 0)


def _settle_without_ticks(rig: Rig, job: Submitted, ranks: int) -> TrialView:
    """Launch, let every replica end before the supervisor looks again, then settle: the
    cause must come from the exit records' times, not from the order muster saw them in."""
    rig.supervisor.tick()
    run_dir = rig.trial(job.trial_id).attempts[0].run_dir
    wait_until(lambda: all((run_dir / f"rank-{r}.exit.json").exists() for r in range(ranks)),
               timeout=30, what="every replica to exit")
    return rig.run_to_end(job)


def test_the_first_failure_in_time_is_the_cause(rig: Rig) -> None:
    # Rank 1 is killed; rank 0 fails on its own once rank 1 has ended, as a peer that lost
    # its connection would. The kill is what gets restarted, not a user error that is not.
    job = submit(rig, 2, "fail-after-1@1,exit0", "sigkill@1,exit0")
    trial = _settle_without_ticks(rig, job, 2)
    assert [(a.number, a.reason) for a in trial.attempts] == [(1, "INFRA"), (2, "OK")]
    assert [(r.attempt, r.rank, r.reason) for r in replicas(rig, job.trial_id)][:2] == [
        (1, 0, "USER_ERROR"), (1, 1, "INFRA")]
    assert trial.state == "SUCCEEDED"


def test_a_peer_failing_after_the_primary_succeeded_does_not_fail_the_trial(rig: Rig) -> None:
    job = submit(rig, 2, "exit0", "fail-after-0")
    trial = _settle_without_ticks(rig, job, 2)
    assert (trial.state, trial.reason) == ("SUCCEEDED", "OK")
    assert [(r.rank, r.reason) for r in replicas(rig, job.trial_id)] == [
        (0, "OK"), (1, "USER_ERROR")]


def test_a_trial_waits_until_all_its_replicas_fit(rig: Rig, tmp_path: Path) -> None:
    rig.set_slots(3)
    running = submit(rig, 2, "sleep", "sleep")
    waiting = submit(rig, 2, "exit0", "exit0")
    rig.until_trial(running, TrialState.RUNNING)
    rig.supervisor.tick()
    assert rig.supervisor.slots_in_use() == 2  # one per replica, not one per trial
    with rig.store.session_scope() as s:
        trial = s.get_one(Trial, waiting.trial_id)
        assert (trial.state, trial.queue_reason) == (
            "QUEUED", "position 1: waiting for 2 slots, 1 free")
        s.get_one(Trial, running.trial_id).stop_requested = True
    rig.until_trial(running, TrialState.CANCELED)
    assert rig.run_to_end(waiting).state == "SUCCEEDED"


def test_a_trial_larger_than_the_server_says_so(rig: Rig) -> None:
    rig.set_slots(2)
    job = submit(rig, 3, "exit0", "exit0", "exit0")
    rig.supervisor.tick()
    with rig.store.session_scope() as s:
        trial = s.get_one(Trial, job.trial_id)
        assert trial.state == "QUEUED"
        assert trial.queue_reason == (
            "needs 3 slots for its replicas, but this server has 2; raise `slots` in the "
            "cluster config (or `muster up --slots`), or lower resources.replicas")


def test_restart_scope_replica_restarts_only_the_failed_rank_then_the_trial(rig: Rig) -> None:
    job = submit(rig, 2, "sleep@1,late-exit0", "sigkill@1,exit0",
                 restart_scope="replica", replica_restarts=2)
    trial = rig.run_to_end(job)
    assert (trial.state, trial.reason) == ("SUCCEEDED", "OK")
    found = replicas(rig, job.trial_id)
    assert [(r.attempt, r.rank, r.incarnation, r.reason, r.signal) for r in found] == [
        (1, 0, 0, "STOPPED", "SIGTERM"),  # the primary ran on through rank 1's restarts
        (1, 1, 0, "INFRA", "SIGKILL"), (1, 1, 1, "INFRA", "SIGKILL"),
        (1, 1, 2, "INFRA", "SIGKILL"),  # out of restarts in place: the trial is retried
        (2, 0, 0, "OK", None), (2, 1, 0, "OK", None)]
    assert [e.message for e in trial.decisions()] == [
        "INFRA failure of the replica worker-1 (rank 1); restarting it in place (restart 1 "
        "of 2 in attempt 1)",
        "INFRA failure of the replica worker-1 (rank 1); restarting it in place (restart 2 "
        "of 2 in attempt 1)",
        "INFRA failure; retrying the trial (retry 1 of 3)"]
    assert trial.counters == (2, 1, 0, 0)
    # One log per rank and attempt: each incarnation appended to it, with its restart number
    # and the attempt's rendezvous port.
    first = [r for r in found if r.attempt == 1 and r.rank == 1]
    envs = [environment(line) for line in first[-1].log.splitlines() if line.startswith(b"RANK")]
    assert [e["MUSTER_REPLICA_RESTART"] for e in envs] == ["0", "1", "2"]
    primary_port = environment(found[0].log)["MASTER_PORT"]
    assert {e["MASTER_PORT"] for e in envs} == {primary_port}
    restarts = trial.attempts[0].run_dir / "restarts"
    assert sorted(p.name for p in restarts.glob("rank-1.exit.json.*")) == [
        "rank-1.exit.json.0", "rank-1.exit.json.1"]


def test_restart_scope_replica_does_not_restart_a_user_error(rig: Rig) -> None:
    job = submit(rig, 2, "sleep", "fail", restart_scope="replica")
    trial = rig.run_to_end(job)
    assert (trial.state, trial.reason) == ("FAILED", "USER_ERROR")
    assert [(r.rank, r.incarnation, r.reason) for r in replicas(rig, job.trial_id)] == [
        (0, 0, "STOPPED"), (1, 0, "USER_ERROR")]


class _RankOneLate(LocalLauncher):
    """Starts rank 1's shim only once rank 0 has already exited: the primary finishes while
    its peer is still starting (what a loaded machine does now and then)."""

    def submit(self, spec: ReplicaSpec) -> ProcessIdentity:
        if spec.rank == 1:
            wait_until(lambda: (spec.attempt_dir / "rank-0.exit.json").exists(), timeout=30,
                       what="rank 0 to exit")
        return super().submit(spec)


def test_a_primary_that_ends_before_its_peer_started_still_succeeds(rig: Rig) -> None:
    rig.supervisor.launcher = _RankOneLate()
    job = submit(rig, 2, "exit0", "exit0")
    trial = rig.run_to_end(job)
    assert (trial.state, trial.reason) == ("SUCCEEDED", "OK")
    [attempt] = trial.attempts
    assert attempt.state == "SUCCEEDED"
    primary, peer = replicas(rig, job.trial_id)
    assert primary.reason == "OK" and peer.reason in ("STOPPED", "OK")


@pytest.mark.timeout(45)
def test_survivors_of_a_failure_get_the_short_failure_grace(rig: Rig) -> None:
    # Rank 0 ignores SIGTERM, as a rank blocked in a collective with a dead peer does; with
    # the 60 s stop grace the restart would wait a minute, with failure_grace half a second.
    job = submit(rig, 2, "stubborn", "fail", stop_grace="60s", failure_grace="500ms")
    trial = rig.run_to_end(job)
    assert (trial.state, trial.reason) == ("FAILED", "USER_ERROR")
    primary, _ = replicas(rig, job.trial_id)
    assert (primary.reason, primary.signal) == ("STOPPED", "SIGKILL")
