"""No false success (invariant 1), end to end through the supervisor.

Real store, real shims, and a real training loop on `muster.harness`
(`tests/fixtures/harness_train.py`) that drops samples, skips checkpoints, reports NaN,
hangs or crashes on request. Each test follows the run from the script's exit to the
trial's verdict, its verification record and the events that explain it.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from sqlalchemy import select

from muster.client import pack_context
from muster.services.experiments import (
    create_experiment,
    describe_trial,
    kill_experiment,
    review_trial,
)
from muster.sizes import format_size
from muster.states import ExperimentState, TrialState
from muster.store import Trial
from tests.supervise.conftest import Rig, Submitted, TrialView, fixture_entrypoint

pytestmark = [pytest.mark.lifecycle, pytest.mark.timeout(90)]

MINUS = "\u2212"
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "digits"
CLASSES = ("cat", "dog", "fox", "owl")
PER_CLASS = 25  # 100 files in 4 class folders
DATA = {"manifest": {"extensions": [".png"], "labels": "from_dirs"}}


def make_images(root: Path) -> Path:
    """100 "images" in 4 class folders, plus files the manifest must not count."""
    for label in CLASSES:
        folder = root / label
        folder.mkdir(parents=True)
        for i in range(PER_CLASS):
            (folder / f"{i:03d}.png").write_bytes(b"\x89PNG fake %d" % i)
    (root / "README.txt").write_text("not an image\n")
    (root / "cat" / "notes.json").write_text("{}\n")
    return root


def config(entrypoint: list[str], *, data: str | None = None,
           verify: dict[str, Any] | None = None, **policy: Any) -> dict[str, Any]:
    text: dict[str, Any] = {
        "name": "no-false-success",
        "entrypoint": entrypoint,
        "failure_policy": {"stop_grace": "1s", **policy},
    }
    if data is not None:
        text["data"] = {"path": data, **DATA}
    if verify is not None:
        text["verify"] = verify
    return text


def submit(rig: Rig, experiment: dict[str, Any], context: Path | None = None) -> Submitted:
    """Create the experiment through the real service, uploading `context` when given."""
    archive = None
    if context is not None:
        archive = context.with_name(context.name + ".tar.gz")
        archive.write_bytes(pack_context(context))
    experiment_id = create_experiment(rig.store, rig.home, rig.admin,
                                      yaml.safe_dump(experiment), archive)
    with rig.store.session_scope() as s:
        trial_id = s.scalars(select(Trial.id).where(Trial.experiment_id == experiment_id))
        return Submitted(experiment_id, trial_id.one())


def train(*args: str) -> list[str]:
    return fixture_entrypoint("harness_train.py", *args)


def settle(rig: Rig, job: Submitted, timeout: float = 60.0) -> TrialView:
    """Tick until the trial is settled (terminal, or SUSPECT waiting for a review)."""
    view = rig.tick_until(
        lambda: TrialState((t := rig.trial(job.trial_id)).state).is_at_rest() and t,
        what=f"trial {job.trial_id} to settle", timeout=timeout,
    )
    assert isinstance(view, TrialView)
    return view


def stored(rig: Rig, trial_id: int) -> dict[str, Any]:
    """The trial as the API shows it: manifest, verification, queue_reason, events."""
    return describe_trial(rig.store, trial_id)


def check(trial: dict[str, Any], name: str) -> dict[str, Any]:
    [found] = [c for c in trial["verification"]["checks"] if c["name"] == name]
    return dict(found)


def failed_checks(trial: dict[str, Any]) -> list[str]:
    return [c["name"] for c in trial["verification"]["checks"] if not c["passed"]]


# -- 1. the silent drop ----------------------------------------------------------------


@pytest.mark.parametrize("decision", ["reject", "approve"])
def test_a_silent_drop_is_suspect_until_a_person_reviews_it(
    rig: Rig, tmp_path: Path, decision: str
) -> None:
    sqlite_rig = rig  # on each backend: the review locks the trial's row
    data = make_images(tmp_path / "data")
    job = submit(sqlite_rig, config(train("--epochs", "1", "--drop", "0.12"), data=str(data)))

    view = settle(sqlite_rig, job)

    shortfall = f"epoch 1: 88 samples seen, 100 expected ({MINUS}12.0%)"
    assert (view.state, view.reason) == ("SUSPECT", "verification failed")
    assert view.message is not None and shortfall in view.message
    assert view.attempts[0].exit_code == 0
    trial = stored(sqlite_rig, job.trial_id)
    assert trial["verification"]["passed"] is False
    assert check(trial, "samples") == {"name": "samples", "passed": False, "detail": shortfall,
                                     "status": "failed"}
    assert failed_checks(trial) == ["samples"]
    manifest = trial["manifest"]
    assert manifest["path"] == str(data.resolve())
    assert manifest["file_count"] == 100
    assert manifest["classes"] == {label: PER_CLASS for label in CLASSES}
    assert manifest["by_extension"] == {".png": 100}

    sqlite_rig.supervisor.tick()  # SUSPECT waits for a person: the experiment stays open
    assert sqlite_rig.experiment_state(job.experiment_id) is ExperimentState.ACTIVE

    note = "the loader skips damaged files" if decision == "reject" else "12% is expected"
    reviewed = review_trial(sqlite_rig.store, sqlite_rig.admin, job.trial_id, decision, note)
    end = {"reject": ("FAILED", ExperimentState.ERROR),
           "approve": ("SUCCEEDED", ExperimentState.COMPLETED)}[decision]
    assert reviewed["state"] == end[0]
    last = reviewed["events"][-1]
    assert (last["from_state"], last["to_state"], last["actor"], last["message"]) == (
        "SUSPECT", end[0], "admin", note)
    sqlite_rig.tick_until(lambda: sqlite_rig.experiment_state(job.experiment_id) is end[1],
                          what=f"the experiment to be {end[1].value}")


# -- 2. no checkpoint ------------------------------------------------------------------


def test_exit_0_with_the_harness_but_no_checkpoint_is_suspect(sqlite_rig: Rig) -> None:
    job = submit(sqlite_rig, config(train("--epochs", "1", "--no-checkpoint")))

    view = settle(sqlite_rig, job)

    assert view.state == "SUSPECT"
    assert view.message is not None
    assert "checkpoint: no checkpoint was saved" in view.message
    trial = stored(sqlite_rig, job.trial_id)
    assert failed_checks(trial) == ["checkpoint"]


def test_no_checkpoint_succeeds_when_the_config_does_not_require_one(sqlite_rig: Rig) -> None:
    job = submit(sqlite_rig, config(train("--epochs", "1", "--no-checkpoint"),
                                    verify={"require_checkpoint": False}))

    view = settle(sqlite_rig, job)

    assert view.state == "SUCCEEDED"
    trial = stored(sqlite_rig, job.trial_id)
    assert trial["verification"]["passed"] is True
    assert "checkpoint" not in [c["name"] for c in trial["verification"]["checks"]]
    sqlite_rig.tick_until(
        lambda: sqlite_rig.experiment_state(job.experiment_id) is ExperimentState.COMPLETED,
        what="the experiment to complete")


# -- 3. NaN ----------------------------------------------------------------------------


def test_a_nan_loss_is_suspect_and_named_with_its_step(sqlite_rig: Rig) -> None:
    job = submit(sqlite_rig, config(train("--epochs", "1", "--nan-at", "7")))

    view = settle(sqlite_rig, job)

    detail = "loss was NaN at step 7 (training)"
    assert view.state == "SUSPECT"
    assert view.message is not None and f"finite_metrics: {detail}" in view.message
    trial = stored(sqlite_rig, job.trial_id)
    assert check(trial, "finite_metrics") == {
        "name": "finite_metrics", "passed": False, "detail": detail, "status": "failed"}
    assert failed_checks(trial) == ["finite_metrics"]


# -- 5. stalls -------------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_a_hang_after_check_in_is_stalled_and_the_restart_succeeds(sqlite_rig: Rig) -> None:
    job = submit(sqlite_rig, config(
        train("--epochs", "1", "--hang-after", "3", "--on-attempt", "1"),
        heartbeat_timeout="2s", replica_restarts=1, trial_retries=0,
    ))

    view = settle(sqlite_rig, job)

    assert view.state == "SUCCEEDED", view.message
    first, second = view.attempts
    assert (first.state, first.reason, first.replica_reason) == ("FAILED", "STALLED", "STALLED")
    assert first.message is not None and "made no progress" in first.message
    assert "no progress for" in first.message and "last progress at step 2" in first.message
    assert (first.run_dir / "rank-0.stalled.json").exists()
    assert b"hanging after step 2" in (first.run_dir / "rank-0.log").read_bytes()
    # Its stacks were saved before it was killed (invariant 9), and its end names them.
    assert "; stacks: rank 0 " in first.message and "(evidence: evidence/" in first.message
    [bundle] = (first.run_dir / "evidence").iterdir()
    assert (bundle / "rank-0" / "summary.json").exists()
    assert "hanging after step 2" in (bundle / "rank-0" / "log-tail.txt").read_text()
    [stop] = [e for e in view.events_of(first) if e.reason == "STALLED" and e.to_state is None]
    assert stop.message is not None and stop.message.startswith("stopping rank 0: no progress")
    assert (second.number, second.state, second.replica_reason) == (2, "SUCCEEDED", "OK")
    assert view.counters == (1, 0, 0, 0)
    assert ("RUNNING", "RESTARTING", "STALLED") in view.trial_moves()


@pytest.mark.timeout(60)
def test_heartbeat_timeout_never_judges_a_script_without_the_harness(sqlite_rig: Rig,
                                                                   tmp_path: Path) -> None:
    """(Silence is judged by silence_timeout, 30 minutes here: tests/supervise/test_silence.py.)"""
    release = tmp_path / "release"
    timeout = 1.0
    job = submit(sqlite_rig, config(fixture_entrypoint("wait_for_file.py", str(release)),
                                    heartbeat_timeout=f"{timeout}s"))
    sqlite_rig.until_trial(job, TrialState.RUNNING)

    # Silent well past heartbeat_timeout, with the supervisor looking all the while.
    since = time.monotonic()
    sqlite_rig.tick_until(lambda: time.monotonic() - since > 3 * timeout,
                          what="three heartbeat timeouts to pass")
    assert sqlite_rig.trial(job.trial_id).state == "RUNNING"
    release.touch()
    view = settle(sqlite_rig, job)

    assert view.state == "SUCCEEDED"
    [attempt] = view.attempts
    assert attempt.replica_reason == "OK"
    assert not (attempt.run_dir / "rank-0.stalled.json").exists()
    assert not [e for e in view.events if e.reason == "STALLED"]


# -- a stop is not a success --------------------------------------------------------------


def test_a_run_that_obeys_a_kill_and_exits_0_is_canceled_not_succeeded(
    sqlite_rig: Rig, tmp_path: Path
) -> None:
    job = submit(sqlite_rig, config(train("--until", str(tmp_path / "never"), "--pause", "0.01")))
    view = sqlite_rig.until_trial(job, TrialState.RUNNING)
    heartbeat = view.attempts[0].run_dir / "rank-0.heartbeat.json"
    # Checked in: the harness has taken over SIGTERM, so the stop reaches should_stop().
    sqlite_rig.tick_until(heartbeat.exists, what="the check-in")

    kill_experiment(sqlite_rig.store, sqlite_rig.admin, job.experiment_id)
    view = settle(sqlite_rig, job)

    assert view.state == "CANCELED"
    [attempt] = view.attempts
    assert (attempt.replica_reason, attempt.exit_code) == ("STOPPED", 0)
    ack = json.loads((attempt.run_dir / "rank-0.stop-ack.json").read_text())
    assert f"stop requested; leaving after step {ack['step']}" in (
        attempt.run_dir / "rank-0.log").read_text()
    saved = sorted((attempt.run_dir.parent / "checkpoints").glob("step-*"))
    assert saved and saved[-1].name.startswith(f"step-{ack['step']:012d}-")
    assert stored(sqlite_rig, job.trial_id)["verification"] is None


# -- 6. resume -------------------------------------------------------------------------


def test_a_crashed_attempt_resumes_from_its_latest_checkpoint(
    sqlite_rig: Rig, tmp_path: Path
) -> None:
    data = make_images(tmp_path / "data")
    # Epoch 1 is steps 0-9 (checkpoint at step 9); attempt 1 dies 5 steps into epoch 2.
    job = submit(sqlite_rig, config(
        train("--epochs", "2", "--sigkill-after", "15", "--on-attempt", "1"), data=str(data),
    ))

    view = settle(sqlite_rig, job)

    assert view.state == "SUCCEEDED", view.message
    first, second = view.attempts
    assert (first.replica_reason, first.signal) == ("INFRA", "SIGKILL")
    assert second.replica_reason == "OK"
    assert view.counters == (1, 0, 0, 0)
    checkpoints = first.run_dir.parent / "checkpoints"
    [saved] = [p for p in checkpoints.iterdir() if p.name.startswith("step-000000000009-")]
    log = (second.run_dir / "rank-0.log").read_text()
    assert f"restored step 9 from {saved.name} (MUSTER_LATEST_CHECKPOINT={saved})" in log
    with (second.run_dir / "rank-0.metrics.jsonl").open() as lines:
        assert json.loads(lines.readline())["step"] == 10
    # Epoch 2 was begun by attempt 1 and redone whole by attempt 2: it counts once.
    first_counts = json.loads((first.run_dir / "rank-0.samples.json").read_text())["epochs"]
    assert first_counts == {"1": 100, "2": 50}
    trial = stored(sqlite_rig, job.trial_id)
    assert trial["verification"]["passed"] is True
    assert check(trial, "samples")["detail"] == "2 epochs, each within 1.0% of 100"


# -- 8. missing data -------------------------------------------------------------------


def test_a_missing_data_directory_fails_the_trial_before_any_launch(
    sqlite_rig: Rig, tmp_path: Path
) -> None:
    """The data directory was there at submission (which checks it) and is gone by launch."""
    missing = tmp_path / "no-such-data"
    missing.mkdir()
    (missing / "a.png").write_bytes(b"png")  # (an empty one is refused at submission)
    job = submit(sqlite_rig, config(train("--epochs", "1"), data=str(missing)))
    shutil.rmtree(missing)

    view = settle(sqlite_rig, job)

    assert (view.state, view.reason) == ("FAILED", "PERMANENT_ERROR")
    assert view.message is not None and str(missing) in view.message
    assert "data.path" in view.message
    assert view.attempts == []
    assert not (sqlite_rig.home.runs_dir).exists() or not any(sqlite_rig.home.runs_dir.iterdir())
    sqlite_rig.tick_until(
        lambda: sqlite_rig.experiment_state(job.experiment_id) is ExperimentState.ERROR,
        what="the experiment to end in ERROR")


# -- 9. the disk guard -----------------------------------------------------------------


def disk_events(rig: Rig, trial_id: int) -> list[str | None]:
    return [e.message for e in rig.trial(trial_id).events if e.reason == "disk low"]


def queue_reason(rig: Rig, trial_id: int) -> str | None:
    reason: str | None = stored(rig, trial_id)["queue_reason"]
    return reason


@pytest.mark.timeout(60)
def test_the_disk_guard_holds_queued_trials_and_warns_running_ones(
    sqlite_rig: Rig, tmp_path: Path
) -> None:
    rig, release = sqlite_rig, tmp_path / "release"
    waiting = config(fixture_entrypoint("wait_for_file.py", str(release)))
    rig.supervisor.min_free_disk = 10**18
    first = submit(rig, waiting)
    for _ in range(3):
        rig.supervisor.tick()
    second = submit(rig, waiting)  # queued while the guard is already tripped
    rig.supervisor.tick()

    for job in (first, second):
        view = rig.trial(job.trial_id)
        assert (view.state, view.attempts) == ("QUEUED", [])
        reason = queue_reason(rig, job.trial_id)
        assert reason is not None and reason.startswith("waiting for disk:"), reason

    rig.supervisor.min_free_disk = 0
    for job in (first, second):
        rig.until_trial(job, TrialState.RUNNING)
        assert queue_reason(rig, job.trial_id) is None

    third = submit(rig, waiting)
    rig.supervisor.min_free_disk = 10**18
    for _ in range(3):
        rig.supervisor.tick()
    # The figures in the reason move while the disk stays low (here the limit; in life the
    # free space): the reason follows them, and the guard has still tripped only once.
    rig.supervisor.min_free_disk = 2 * 10**18
    for _ in range(3):
        rig.supervisor.tick()
    reason = queue_reason(rig, third.trial_id)
    assert reason is not None and f"< {format_size(2 * 10**18)} on" in reason, reason
    for job in (first, second):
        [warning] = disk_events(rig, job.trial_id)
        assert warning is not None and warning.startswith("waiting for disk:")
        assert rig.trial(job.trial_id).state == "RUNNING"
    assert rig.trial(third.trial_id).state == "QUEUED"
    assert disk_events(rig, third.trial_id) == []

    rig.supervisor.min_free_disk = 0
    release.touch()
    for job in (first, second, third):
        assert settle(rig, job).state == "SUCCEEDED"
        assert len(disk_events(rig, job.trial_id)) <= 1


# -- 10. the bundled example -----------------------------------------------------------


@pytest.mark.timeout(300)
def test_the_digits_example_with_corrupt_data_is_suspect(sqlite_rig: Rig, tmp_path: Path) -> None:
    made = subprocess.run(
        [sys.executable, str(EXAMPLE / "prepare_data.py"), "--out", str(tmp_path / "data"),
         "--corrupt", "0.12"], capture_output=True, text=True, timeout=120, check=True,
    )
    assert "1797" in made.stdout.replace(",", ""), made.stdout
    context = tmp_path / "context"
    context.mkdir()
    shutil.copy2(EXAMPLE / "train.py", context / "train.py")
    shutil.copytree(tmp_path / "data-corrupt", context / "data-corrupt")
    experiment = yaml.safe_load((EXAMPLE / "experiment-corrupt.yaml").read_text())
    assert "--epochs 3" in experiment["entrypoint"]
    experiment["entrypoint"] = experiment["entrypoint"].replace("--epochs 3", "--epochs 1")
    job = submit(sqlite_rig, experiment, context)

    view = settle(sqlite_rig, job, timeout=240)

    assert view.state == "SUSPECT", view.message
    assert view.attempts[0].exit_code == 0
    trial = stored(sqlite_rig, job.trial_id)
    assert trial["manifest"]["file_count"] == 1797
    assert len(trial["manifest"]["classes"]) == 10
    shortfall = f"epoch 1: 1,581 samples seen, 1,797 expected ({MINUS}12.0%)"
    assert check(trial, "samples") == {"name": "samples", "passed": False, "detail": shortfall,
                                     "status": "failed"}
    assert view.message is not None and shortfall in view.message
    assert failed_checks(trial) == ["samples"]
