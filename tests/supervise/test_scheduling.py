"""The scheduler with real processes: a fake GPU inventory (its used memory in real files),
priorities, GPU release, a restarted supervisor, pause/activate and preemption."""

from __future__ import annotations

import random
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from sqlalchemy import select

from muster.config import FakeGpuConfig, GpuReleaseConfig
from muster.home import Home
from muster.launch.local import LocalLauncher
from muster.schedule.inventory import FakeInventory
from muster.schedule.local_placement import LocalPlacement
from muster.services.experiments import (
    activate_experiment,
    create_experiment,
    kill_experiment,
    pause_experiment,
)
from muster.services.jobs import set_trial_priority
from muster.states import TrialState
from muster.store import Attempt, Event, GpuDevice, Store, Trial
from muster.supervise.supervisor import Supervisor
from tests.accounts import first_admin
from tests.supervise.conftest import Rig, Submitted, fixture_entrypoint

pytestmark = [pytest.mark.lifecycle, pytest.mark.timeout(120)]
GiB = 1 << 30


def gpu_rig(store: Store, home: Home, gpus: int = 4, slots: int = 2,
            release: GpuReleaseConfig | None = None, preemption: bool = False) -> Rig:
    specs = [FakeGpuConfig(index=i, name="Fake-A100", memory=40 * GiB) for i in range(gpus)]
    placement = LocalPlacement(store, slots, FakeInventory(specs, home.fake_gpus_dir),
                               release or GpuReleaseConfig())
    supervisor = Supervisor(store, LocalLauncher(), home, placement, min_free_disk=0,
                            preemption=preemption)
    return Rig(store, home, supervisor, first_admin(store, home))


def submit(rig: Rig, entrypoint: list[str], variables: dict[str, str] | None = None,
           **resources: Any) -> Submitted:
    config = {
        "name": "scheduling-test",
        "entrypoint": entrypoint,
        "environment": {"variables": {"FAKE_GPUS_DIR": str(rig.home.fake_gpus_dir),
                                      **(variables or {})}},
        "resources": resources,
        "failure_policy": {"stop_grace": 10.0},
    }
    experiment_id = create_experiment(rig.store, rig.home, rig.admin,
                                      yaml.safe_dump(config), archive=None)
    with rig.store.session_scope() as s:
        trial_id = s.scalars(select(Trial.id).where(Trial.experiment_id == experiment_id)).one()
    return Submitted(experiment_id, trial_id)


def gpu_job(rig: Rig, tmp_path: Path, name: str, leak: bool = False,
            **resources: Any) -> tuple[Submitted, Path]:
    release = tmp_path / f"release-{name}"
    variables = {"RELEASE": str(release), "USED_BYTES": str(10 * GiB),
                 **({"LEAK": "1"} if leak else {})}
    return submit(rig, fixture_entrypoint("fake_gpu_job.py"), variables, **resources), release


def allocations(rig: Rig) -> dict[int, tuple[str, int | None, int | None]]:
    with rig.store.session_scope() as s:
        return {g.index: (g.state, g.trial_id, g.rank) for g in s.scalars(select(GpuDevice))}


def state(rig: Rig, job: Submitted) -> tuple[str, str | None]:
    with rig.store.session_scope() as s:
        trial = s.get_one(Trial, job.trial_id)
        return trial.state, trial.queue_reason


def log_of(rig: Rig, job: Submitted, rank: int = 0, attempt: int = 1) -> str:
    with rig.store.session_scope() as s:
        row = s.scalars(select(Attempt).where(Attempt.trial_id == job.trial_id,
                                              Attempt.number == attempt)).one()
        path = Path(row.run_dir) / f"rank-{rank}.log"
    return path.read_text() if path.exists() else ""


def test_each_replica_uses_exactly_the_gpus_it_was_given(rig: Rig, tmp_path: Path) -> None:
    rig = gpu_rig(rig.store, rig.home)
    pair, release_pair = gpu_job(rig, tmp_path, "pair", replicas=2, gpus_per_replica=1)
    double, release_double = gpu_job(rig, tmp_path, "double", gpus_per_replica=2)
    cpu, release_cpu = gpu_job(rig, tmp_path, "cpu")
    for job in (pair, double, cpu):
        rig.until_trial(job, TrialState.RUNNING)
    held = allocations(rig)
    assert sorted(held.values()) == sorted([
        ("allocated", pair.trial_id, 0), ("allocated", pair.trial_id, 1),
        ("allocated", double.trial_id, 0), ("allocated", double.trial_id, 0)])
    # The pair's ranks (torchrun's variables) see both of its GPUs in rank order, as under
    # torchrun, and each uses the one at its LOCAL_RANK: its own.
    pair_gpus = ",".join(str(i) for _, i in sorted(
        (r, i) for i, (_, trial, r) in held.items() if trial == pair.trial_id))
    for job, rank in ((pair, 0), (pair, 1), (double, 0)):
        mine = ",".join(str(i) for i, (_, trial, r) in sorted(held.items())
                        if trial == job.trial_id and r == rank)
        seen = pair_gpus if job is pair else mine
        rig.tick_until(lambda j=job, r=rank: "uses" in log_of(rig, j, r), what="its line")
        assert (f"rank {rank} sees CUDA_VISIBLE_DEVICES={seen!r} "
                "CUDA_DEVICE_ORDER='PCI_BUS_ID'") in log_of(rig, job, rank)
        assert f"rank {rank} uses GPUs {mine!r}" in log_of(rig, job, rank)
    rig.tick_until(lambda: "sees" in log_of(rig, cpu), what="the CPU trial's line")
    assert "CUDA_VISIBLE_DEVICES=''" in log_of(rig, cpu)  # a CPU trial sees no GPU
    for path in (release_pair, release_double, release_cpu):
        path.touch()
    for job in (pair, double, cpu):
        assert rig.run_to_end(job).state == "SUCCEEDED"
    rig.tick_until(lambda: all(a[0] == "free" for a in allocations(rig).values()),
                   what="every GPU to be free again")


def test_leaked_memory_delays_the_next_allocation_until_it_is_released(
    rig: Rig, tmp_path: Path
) -> None:
    rig = gpu_rig(rig.store, rig.home, gpus=1,
                  release=GpuReleaseConfig(max_used_fraction=0.05, timeout=600))
    first, release_first = gpu_job(rig, tmp_path, "first", leak=True, gpus_per_replica=1)
    second, release_second = gpu_job(rig, tmp_path, "second", gpus_per_replica=1)
    rig.until_trial(first, TrialState.RUNNING)
    release_first.touch()
    assert rig.run_to_end(first).state == "SUCCEEDED"
    rig.tick_until(lambda: allocations(rig)[0][0] == "releasing", what="GPU 0 to be releasing")
    for _ in range(10):
        rig.supervisor.tick()
    assert state(rig, second) == (
        "QUEUED", "position 1: waiting for 1 GPU, 0 free (1 more releasing memory)")
    (rig.home.fake_gpus_dir / "0" / "used_bytes").write_text("0\n")  # as a driver would
    rig.until_trial(second, TrialState.RUNNING)
    release_second.touch()
    assert rig.run_to_end(second).state == "SUCCEEDED"


def test_a_gpu_still_in_use_after_the_timeout_is_handed_out_with_a_warning(
    rig: Rig, tmp_path: Path
) -> None:
    rig = gpu_rig(rig.store, rig.home, gpus=1,
                  release=GpuReleaseConfig(max_used_fraction=0.05, timeout=1.0))
    first, release_first = gpu_job(rig, tmp_path, "first", leak=True, gpus_per_replica=1)
    second, release_second = gpu_job(rig, tmp_path, "second", gpus_per_replica=1)
    release_first.touch()
    assert rig.run_to_end(first).state == "SUCCEEDED"
    rig.until_trial(second, TrialState.RUNNING)
    with rig.store.session_scope() as s:
        warnings = [e.message for e in s.scalars(select(Event).where(
            Event.reason == "gpu release timeout"))]
    assert len(warnings) == 1
    # The seconds waited depend on the machine's pace: at least the 1 s timeout.
    assert warnings[0] is not None and re.fullmatch(
        rf"GPU 0 \(Fake-A100\): 10 GiB of 40 GiB still in use [1-9][0-9]*s after it was "
        rf"released by trial {first.trial_id} \(gpu_release: at most 0\.05 of its memory "
        r"within 1s\); handing it out anyway", warnings[0]), warnings[0]
    release_second.touch()
    assert rig.run_to_end(second).state == "SUCCEEDED"


def test_a_restart_waits_until_its_gpus_have_released_the_crashed_attempts_memory(
    rig: Rig, tmp_path: Path
) -> None:
    rig = gpu_rig(rig.store, rig.home, gpus=1,
                  release=GpuReleaseConfig(max_used_fraction=0.05, timeout=600))
    release = tmp_path / "release"
    release.touch()
    job = submit(rig, fixture_entrypoint("fake_gpu_job.py"),
                 {"RELEASE": str(release), "USED_BYTES": str(10 * GiB),
                  "CRASH_ON_ATTEMPT": "1"}, gpus_per_replica=1)
    rig.until_trial(job, TrialState.RESTARTING)  # SIGSEGV: TRANSIENT, retried
    for _ in range(10):
        rig.supervisor.tick()
    assert state(rig, job) == ("RESTARTING", "waiting for its GPUs to release the last "
                                             "attempt's memory (GPU 0: 10 GiB of 40 GiB in use)")
    assert allocations(rig) == {0: ("allocated", job.trial_id, 0)}  # kept for the restart
    (rig.home.fake_gpus_dir / "0" / "used_bytes").write_text("0\n")  # as a driver would
    trial = rig.run_to_end(job)
    assert (trial.state, [a.reason for a in trial.attempts]) == (
        "SUCCEEDED", ["TRANSIENT", "OK"])


def test_a_new_supervisor_neither_loses_nor_double_books_a_gpu(
    rig: Rig, tmp_path: Path
) -> None:
    rig = gpu_rig(rig.store, rig.home, gpus=2)
    first, release_first = gpu_job(rig, tmp_path, "first", gpus_per_replica=2)
    rig.until_trial(first, TrialState.RUNNING)
    before = allocations(rig)
    # The server dies; a new one (new supervisor, launcher and inventory) takes over.
    restarted = gpu_rig(rig.store, rig.home, gpus=2)
    second, release_second = gpu_job(restarted, tmp_path, "second", gpus_per_replica=1)
    for _ in range(10):
        restarted.supervisor.tick()
    assert allocations(restarted) == before
    assert state(restarted, second) == ("QUEUED", "position 1: waiting for 1 GPU, 0 free")
    release_first.touch()
    assert restarted.run_to_end(first).state == "SUCCEEDED"
    restarted.until_trial(second, TrialState.RUNNING)
    assert [a[1] for a in allocations(restarted).values()].count(second.trial_id) == 1
    release_second.touch()
    assert restarted.run_to_end(second).state == "SUCCEEDED"


def test_priority_first_then_first_come_first_served(rig: Rig, tmp_path: Path) -> None:
    rig.set_slots(1)
    blocker, release = gpu_job(rig, tmp_path, "blocker")
    rig.until_trial(blocker, TrialState.RUNNING)
    jobs = [submit(rig, fixture_entrypoint("exit0.sh"), priority=p) for p in (50, 10, 50, 10)]
    rig.supervisor.tick()
    assert [state(rig, job)[1] for job in jobs] == [
        "position 3: waiting behind trial 3 (1 slot; first come, first served within a "
        "priority)",
        "position 1: waiting for 1 slot, 0 free",
        "position 4: waiting behind trial 3 (1 slot; first come, first served within a "
        "priority)",
        "position 2: waiting behind trial 3 (1 slot; first come, first served within a "
        "priority)",
    ]
    release.touch()
    for job in jobs:
        assert rig.run_to_end(job).state == "SUCCEEDED"
    with rig.store.session_scope() as s:
        started = [s.scalars(select(Attempt.created_at).where(
            Attempt.trial_id == job.trial_id)).one() for job in jobs]
    order = [job.trial_id for _, job in sorted(zip(started, jobs, strict=True))]
    assert order == [jobs[1].trial_id, jobs[3].trial_id, jobs[0].trial_id, jobs[2].trial_id]


def test_after_a_pass_that_changed_nothing_every_change_to_the_queue_shows_in_the_next(
    rig: Rig, tmp_path: Path
) -> None:
    """A pass after a quiet one skips admission while the queue, the holdings and the
    capacity are as they were (`supervise/admission.py`): each change must still show in
    the very next pass."""
    rig.set_slots(1)
    blocker, release = gpu_job(rig, tmp_path, "blocker")
    rig.until_trial(blocker, TrialState.RUNNING)
    jobs = [submit(rig, fixture_entrypoint("exit0.sh"), priority=50) for _ in range(3)]

    def quiet_then_reasons() -> list[str | None]:
        rig.supervisor.tick()  # the reasons written
        rig.supervisor.tick()  # nothing to change: the next pass may skip
        rig.supervisor.tick()
        return [state(rig, job)[1] for job in jobs]

    def behind(position: int, job: Submitted) -> str:
        return (f"position {position}: waiting behind trial {job.trial_id} (1 slot; first "
                "come, first served within a priority)")

    head = "position 1: waiting for 1 slot, 0 free"
    assert quiet_then_reasons() == [head, behind(2, jobs[0]), behind(3, jobs[0])]
    set_trial_priority(rig.store, rig.admin, jobs[2].trial_id, 10)
    rig.supervisor.tick()
    assert state(rig, jobs[2])[1] == head
    assert quiet_then_reasons() == [behind(2, jobs[2]), behind(3, jobs[2]), head]
    kill_experiment(rig.store, rig.admin, jobs[2].experiment_id)
    rig.supervisor.tick()
    assert state(rig, jobs[0])[1] == head
    assert quiet_then_reasons()[:2] == [head, behind(2, jobs[0])]
    later = submit(rig, fixture_entrypoint("exit0.sh"), priority=50)
    rig.supervisor.tick()
    assert state(rig, later)[1] == behind(3, jobs[0])
    quiet_then_reasons()
    release.touch()
    for job in (*jobs[:2], later):
        assert rig.run_to_end(job).state == "SUCCEEDED"


def steps_reported(rig: Rig, job: Submitted, attempt: int = 1) -> int:
    with rig.store.session_scope() as s:
        row = s.scalars(select(Attempt).where(Attempt.trial_id == job.trial_id,
                                              Attempt.number == attempt)).one_or_none()
        path = Path(row.run_dir) / "rank-0.metrics.jsonl" if row else None
    return path.read_text().count("\n") if path and path.exists() else 0


def harness_job(rig: Rig, tmp_path: Path, name: str, **resources: Any) -> tuple[Submitted, Path]:
    until = tmp_path / f"until-{name}"
    entrypoint = fixture_entrypoint("harness_train.py", "--until", str(until), "--pause",
                                    "0.02")
    return submit(rig, entrypoint, **resources), until


def test_pause_frees_the_slot_and_activate_resumes_at_the_saved_step(
    rig: Rig, tmp_path: Path
) -> None:
    job, until = harness_job(rig, tmp_path, "paused")
    rig.tick_until(lambda: steps_reported(rig, job) > 3, what="a few steps")
    pause_experiment(rig.store, rig.admin, job.experiment_id)
    trial = rig.until_trial(job, TrialState.PAUSED)
    assert rig.supervisor.slots_in_use() == 0
    assert trial.counters == (0, 0, 0, 0)  # a pause is no failure and uses no budget
    for _ in range(5):
        rig.supervisor.tick()
    assert rig.trial(job.trial_id).state == "PAUSED"  # it waits for a person
    activate_experiment(rig.store, rig.admin, job.experiment_id)
    rig.until_trial(job, TrialState.RUNNING)
    rig.tick_until(lambda: "restored step" in log_of(rig, job, attempt=2),
                   what="attempt 2 to restore the checkpoint saved at the pause")
    until.touch()
    trial = rig.run_to_end(job)
    assert (trial.state, trial.counters) == ("SUCCEEDED", (0, 0, 0, 0))
    moves = trial.trial_moves()
    assert ("RUNNING", "PAUSED", "paused") in moves and ("PAUSED", "QUEUED", "activated") in moves


def test_a_better_priority_trial_preempts_and_the_preempted_one_still_succeeds(
    rig: Rig, tmp_path: Path
) -> None:
    rig = gpu_rig(rig.store, rig.home, gpus=0, slots=1, preemption=True)
    low, until = harness_job(rig, tmp_path, "low", priority=90)
    rig.until_trial(low, TrialState.RUNNING)
    rig.tick_until(lambda: steps_reported(rig, low) > 3, what="a few steps")
    high = submit(rig, fixture_entrypoint("exit0.sh"), priority=10)
    assert rig.run_to_end(high).state == "SUCCEEDED"
    trial = rig.until_trial(low, TrialState.RUNNING)
    assert ("RUNNING", "PAUSED", "preempted") in trial.trial_moves()
    assert ("PAUSED", "QUEUED", "requeued") in trial.trial_moves()
    assert [e.message for e in trial.decisions() if e.reason == "preempted"] == [
        f"preempted by trial {high.trial_id} (priority 10, better than this trial's 90); it "
        "goes back to the queue and resumes from its latest checkpoint"]
    rig.tick_until(lambda: "restored step" in log_of(rig, low, attempt=2),
                   what="the preempted trial to resume from its checkpoint")
    until.touch()
    trial = rig.run_to_end(low)
    assert (trial.state, trial.counters) == ("SUCCEEDED", (0, 0, 0, 0))


@pytest.mark.timeout(600)
def test_200_random_submissions_never_double_book_and_all_run(
    sqlite_rig: Rig, tmp_path: Path
) -> None:
    """Random replica counts, GPUs per replica and priorities on 4 fake GPUs and 2 slots;
    each replica holds its GPUs' `holder` files exclusively while it runs, so a double
    booking would fail a trial. Every trial must succeed. (One backend: the scheduler does
    not depend on it, and 200 trials take a while.)"""
    rig = gpu_rig(sqlite_rig.store, sqlite_rig.home, gpus=4, slots=2)
    chooser = random.Random(1234)
    jobs = []
    for _ in range(200):
        replicas = chooser.choice([1, 1, 1, 2, 2, 4])
        # Everything must fit the server: at most 2 CPU replicas, at most 4 GPUs.
        per = chooser.choice([0, 1, 1, 2]) if replicas < 4 else 1
        jobs.append(submit(rig, fixture_entrypoint("fake_gpu_job.py"), {"HOLD_S": "0.05"},
                           replicas=replicas, gpus_per_replica=per,
                           priority=chooser.randint(1, 99)))
    most_held = 0

    def all_ended() -> bool:
        nonlocal most_held
        held = allocations(rig)
        most_held = max(most_held, sum(a[0] == "allocated" for a in held.values()))
        assert len(held) == 4
        with rig.store.session_scope() as s:
            states = list(s.scalars(select(Trial.state)))
        return all(TrialState(st).is_at_rest() for st in states)

    rig.tick_until(all_ended, what="all 200 trials to end", timeout=540)
    with rig.store.session_scope() as s:
        failed = {t.id: (t.state, t.message, [r.log_tail for a in t.attempts for r in a.replicas])
                  for t in s.scalars(select(Trial)) if t.state != "SUCCEEDED"}
    assert not failed, failed
    assert most_held == 4  # the GPUs were in use together, not one trial at a time
    assert not list(rig.home.fake_gpus_dir.glob("*/holder"))
