"""Usage of a scripted history equals the hand-computed table (issue 36, deliverable 6).

Real processes on a real supervisor and store (each database backend): a training script
(tests/fixtures/harness_train.py) SIGKILLed from here after it saved a checkpoint, which
muster retries and which resumes from that checkpoint; and a plain script that works for a
second and then deadlocks on two (fake) GPUs, stopped as STALLED by
`failure_policy.silence_timeout`. The expected numbers are computed here, by hand, from the
recorded attempt, replica, checkpoint and event times, and compared with the report by
user, by experiment and by label, and with the total.
"""

from __future__ import annotations

import math
import os
import signal
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from sqlalchemy import select

from muster.config import FakeGpuConfig
from muster.home import Home
from muster.launch.local import LocalLauncher
from muster.schedule.inventory import FakeInventory
from muster.schedule.local_placement import LocalPlacement
from muster.services.access import Principal
from muster.services.experiments import create_experiment
from muster.services.usage import usage_report
from muster.states import UsageBy
from muster.store import Attempt, Checkpoint, Event, Experiment, Replica, Store, Trial
from muster.supervise.supervisor import Supervisor
from tests.accounts import add_user, first_admin
from tests.supervise.conftest import Rig, Submitted, fixture_entrypoint

pytestmark = [pytest.mark.lifecycle, pytest.mark.timeout(240)]

H = 3600.0
HOURS = 1e-9  # 3.6 µs: float rounding of sums of Unix-time differences, in hours
RATIO = 1e-6  # the same, for goodput (a ratio of such sums)
GiB = 1 << 30
SILENCE = 3.0
TERMINAL = {"SUCCEEDED", "FAILED", "CANCELED"}


@pytest.fixture
def usage_rig(store: Store, home: Home) -> Rig:
    """4 slots and 2 fake GPUs."""
    gpus = [FakeGpuConfig(index=i, name="Fake-A100", memory=40 * GiB) for i in range(2)]
    placement = LocalPlacement(store, 4, FakeInventory(gpus, home.fake_gpus_dir))
    supervisor = Supervisor(store, LocalLauncher(), home, placement, min_free_disk=0)
    return Rig(store, home, supervisor, first_admin(store, home))


def submit(rig: Rig, who: Principal, name: str, labels: list[str], entrypoint: list[str],
           **sections: Any) -> Submitted:
    config = {"name": name, "labels": labels, "entrypoint": entrypoint, **sections}
    experiment_id = create_experiment(rig.store, rig.home, who, yaml.safe_dump(config),
                                      archive=None)
    with rig.store.session_scope() as s:
        trial_id = s.scalars(select(Trial.id).where(Trial.experiment_id == experiment_id)).one()
    return Submitted(experiment_id, trial_id)


@dataclass(frozen=True)
class Run:
    number: int
    state: str
    started_at: float
    ended_at: float
    resumed_from: str | None


@dataclass(frozen=True)
class History:
    """One trial's records, as the store holds them."""

    created_at: float
    moves: list[tuple[float, str]]  # (at, to_state) of its state changes
    attempts: list[Run]
    checkpoints: dict[str, tuple[int | None, float | None]]  # name -> (attempt, created_at)
    stalls: list[tuple[int, float | None, float | None]]  # (attempt, stalled_since, ended_at)

    def time_in(self, *states: str) -> float:
        """Seconds spent in `states`: QUEUED from its creation, then move by move (the
        trial has ended, so its last state counts nothing)."""
        total, state, since = 0.0, "QUEUED", self.created_at
        for at, to_state in self.moves:
            if state in states:
                total += at - since
            state, since = to_state, at
        assert state in TERMINAL
        return total


def history(store: Store, trial_id: int) -> History:
    with store.session_scope() as s:
        trial = s.get_one(Trial, trial_id)
        moves = [(e.at, str(e.to_state)) for e in s.scalars(
            select(Event).where(Event.trial_id == trial_id, Event.entity == "trial",
                                Event.to_state.is_not(None)).order_by(Event.id))]
        attempts = [Run(a.number, a.state, a.started_at or 0.0, a.ended_at or 0.0,
                        a.resumed_from) for a in trial.attempts]
        checkpoints = {c.name: (c.attempt, c.created_at) for c in s.scalars(
            select(Checkpoint).where(Checkpoint.trial_id == trial_id))}
        stalls = [(a.number, r.stalled_since, r.ended_at) for a in trial.attempts
                  for r in a.replicas if r.reason == "STALLED"]
        return History(trial.created_at, moves, attempts, checkpoints, stalls)


@dataclass
class Hours:
    """A row of the expected table, in seconds of one slot and the trial's weights."""

    productive: float = 0.0
    lost: float = 0.0
    stalled: float = 0.0
    idle: float = 0.0
    queued: float = 0.0
    slots: int = 1
    gpus: int = 0
    attempts: int = 0

    def row(self) -> dict[str, float | None]:
        held = self.productive + self.lost + self.stalled + self.idle
        return {"slot_hours": held * self.slots / H, "gpu_hours": held * self.gpus / H,
                "productive_hours": self.productive * self.slots / H,
                "lost_hours": self.lost * self.slots / H,
                "stalled_hours": self.stalled * self.slots / H,
                "idle_hours": self.idle * self.slots / H, "running_hours": 0.0,
                "queued_hours": self.queued / H, "goodput": self.productive / held}


def added(*rows: dict[str, float | None]) -> dict[str, float | None]:
    """Rows of several trials together (goodput: of the sums)."""
    total = {key: sum(row[key] or 0.0 for row in rows) for key in rows[0] if key != "goodput"}
    decided = (total["productive_hours"] + total["lost_hours"] + total["stalled_hours"]
               + total["idle_hours"])
    return {**total, "goodput": total["productive_hours"] / decided}


def assert_row(actual: Mapping[str, Any], expected: Mapping[str, float | None]) -> None:
    """Equal within float rounding: a Unix time is a double good to ~2.4e-7 s, and the
    report sums the same differences in another order (and partly in the database)."""
    for key, value in expected.items():
        tolerance = RATIO if key == "goodput" else HOURS
        assert actual[key] == pytest.approx(value, rel=1e-9, abs=tolerance), key


def checkpoint_after_start(rig: Rig, trial_id: int) -> bool:
    """Attempt 1 runs, its process is known, and it has registered a checkpoint saved after
    the attempt started."""
    with rig.store.session_scope() as s:
        attempt = s.scalars(select(Attempt).where(Attempt.trial_id == trial_id,
                                                  Attempt.number == 1)).one_or_none()
        if attempt is None or attempt.started_at is None or attempt.replicas[0].pid is None:
            return False
        return s.scalar(select(Checkpoint.id).where(
            Checkpoint.trial_id == trial_id, Checkpoint.attempt == 1,
            Checkpoint.created_at > attempt.started_at).limit(1)) is not None


def pid_of(rig: Rig, trial_id: int) -> int:
    with rig.store.session_scope() as s:
        pid = s.scalar(select(Replica.pid).join(Replica.attempt).where(
            Attempt.trial_id == trial_id, Attempt.number == 1))
    assert pid is not None
    return pid


def run_history(rig: Rig, tmp_path: Path) -> tuple[Submitted, Submitted, Principal]:
    """The scripted history: one SIGKILL after a checkpoint, one STALLED on two GPUs."""
    alice = add_user(rig.store, "alice")
    until = tmp_path / "until"
    resumed = submit(rig, rig.admin, "resumed", ["team", "resumed"],
                     fixture_entrypoint("harness_train.py", "--until", str(until),
                                        "--pause", "0.05"),
                     failure_policy={"stop_grace": 1.0})
    stalled = submit(rig, alice, "stalled", ["team"],
                     fixture_entrypoint("work_then_hang.py", "1.5"),
                     resources={"gpus_per_replica": 2},
                     failure_policy={"stop_grace": 1.0, "silence_timeout": f"{SILENCE}s",
                                     "replica_restarts": 0, "trial_retries": 0})
    rig.tick_until(lambda: checkpoint_after_start(rig, resumed.trial_id),
                   what="attempt 1's first checkpoint")
    os.kill(pid_of(rig, resumed.trial_id), signal.SIGKILL)
    rig.tick_until(lambda: (t := rig.trial(resumed.trial_id)).state == "RUNNING"
                   and len(t.attempts) == 2, what="attempt 2 to run")
    until.touch()
    first, second = rig.run_to_end(resumed), rig.run_to_end(stalled)
    assert (first.state, [a.replica_reason for a in first.attempts]) == (
        "SUCCEEDED", ["INFRA", "OK"]), first.message
    assert first.attempts[0].signal == "SIGKILL"
    assert (second.state, second.reason) == ("FAILED", "STALLED"), second.message
    return resumed, stalled, alice


def expected_resumed(store: Store, trial_id: int) -> Hours:
    """Attempt 1 was SIGKILLed: productive up to the checkpoint attempt 2 resumed from
    (its log names it), lost after it; attempt 2 SUCCEEDED: all productive."""
    record = history(store, trial_id)
    first, second = record.attempts
    assert second.resumed_from is not None
    attempt, saved_at = record.checkpoints[second.resumed_from]
    assert attempt == 1 and saved_at is not None
    assert first.started_at < saved_at < first.ended_at
    return Hours(productive=(saved_at - first.started_at) + (second.ended_at - second.started_at),
                 lost=first.ended_at - saved_at,
                 idle=record.time_in("STARTING", "RESTARTING"),
                 queued=record.time_in("QUEUED"), attempts=2)


def expected_stalled(store: Store, trial_id: int) -> Hours:
    """Worked 1.5 s, then stalled: lost up to the stall's start (nothing was kept), stalled
    from there to the stalled replica's end, lost from then to the attempt's end."""
    record = history(store, trial_id)
    [run] = record.attempts
    [(number, since, stall_end)] = record.stalls
    assert number == 1 and since is not None and stall_end is not None
    assert run.started_at < since < stall_end <= run.ended_at  # it worked, then stalled
    return Hours(lost=(since - run.started_at) + (run.ended_at - stall_end),
                 stalled=stall_end - since, idle=record.time_in("STARTING", "RESTARTING"),
                 queued=record.time_in("QUEUED"), gpus=2, attempts=1)


def test_usage_of_a_scripted_history_equals_the_hand_computed_table(
        usage_rig: Rig, tmp_path: Path) -> None:
    rig = usage_rig
    resumed, stalled, alice = run_history(rig, tmp_path)
    a, b = expected_resumed(rig.store, resumed.trial_id), expected_stalled(rig.store,
                                                                          stalled.trial_id)
    row_a, row_b = a.row(), b.row()
    log = (rig.trial(resumed.trial_id).attempts[1].run_dir / "rank-0.log").read_text()
    with rig.store.session_scope() as s:
        resumed_from = s.scalar(select(Attempt.resumed_from).where(
            Attempt.trial_id == resumed.trial_id, Attempt.number == 2))
    assert f" from {resumed_from} (MUSTER_LATEST_CHECKPOINT=" in log  # what it resumed from

    by_user = usage_report(rig.store, rig.admin, by=UsageBy.USER, since="1d")
    assert by_user["owner"] is None  # an admin's default: everyone's
    rows = {row["key"]: row for row in by_user["rows"]}
    assert set(rows) == {rig.admin.name, "alice"}
    assert_row(rows[rig.admin.name], row_a)
    assert_row(rows["alice"], row_b)
    assert_row(by_user["total"], added(row_a, row_b))
    assert (rows[rig.admin.name]["trials"], rows[rig.admin.name]["attempts"]) == (1, 2)
    assert (rows["alice"]["trials"], rows["alice"]["attempts"]) == (1, 1)
    assert [row["key"] for row in by_user["rows"]] == sorted(
        rows, key=lambda key: -rows[key]["slot_hours"])

    by_experiment = usage_report(rig.store, rig.admin, by=UsageBy.EXPERIMENT, since="1d")
    rows = {row["key"]: row for row in by_experiment["rows"]}
    assert_row(rows[str(resumed.experiment_id)], row_a)
    assert_row(rows[str(stalled.experiment_id)], row_b)
    assert rows[str(stalled.experiment_id)]["name"] == "stalled"

    by_label = usage_report(rig.store, rig.admin, by=UsageBy.LABEL, since="1d")
    rows = {row["key"]: row for row in by_label["rows"]}
    assert set(rows) == {"team", "resumed"}  # "resumed" counts under both of its labels
    assert_row(rows["team"], added(row_a, row_b))
    assert_row(rows["resumed"], row_a)
    assert_row(by_label["total"], added(row_a, row_b))  # each trial once

    mine = usage_report(rig.store, alice, since="1d")  # a user's default: its own
    assert mine["owner"] == "alice" and [row["key"] for row in mine["rows"]] == ["alice"]
    assert_row(mine["total"], row_b)


def test_a_window_that_starts_after_the_history_counts_nothing_of_it(
        usage_rig: Rig, tmp_path: Path) -> None:
    rig = usage_rig
    with rig.store.session_scope() as s:
        assert s.scalar(select(Experiment.id)) is None
    job = rig.submit(fixture_entrypoint("exit0.sh"))
    ended = rig.run_to_end(job)
    assert ended.state == "SUCCEEDED"
    report = usage_report(rig.store, rig.admin, since="1d")
    assert report["total"]["trials"] == 1 and report["total"]["productive_hours"] > 0
    record = history(rig.store, job.trial_id)
    late = report["until"] - record.moves[-1][0]  # the window opens just after its end
    later = usage_report(rig.store, rig.admin, since=f"{max(1, math.floor(late * 1000))}ms")
    assert later["rows"] == [] and later["total"]["slot_hours"] == 0.0
