""""Verified" means it trained to the end (issue 30): the runs that once ended SUCCEEDED and
verified without finishing, each run for real and judged again.

Real store, real shims, real processes: the harness loop (`tests/fixtures/harness_train.py`)
with its faults, and plain scripts written as public examples are (a caught crash, their
own Ctrl-C handler, outputs left by a killed attempt).
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pytest
import yaml
from sqlalchemy import select

from muster.atomic import read_json
from muster.client import pack_context
from muster.launch.base import ProcessIdentity
from muster.launch.identity import send_signal
from muster.services.experiments import create_experiment, describe_trial
from muster.states import TrialState
from muster.store import Trial
from tests.supervise.conftest import Rig, fixture_entrypoint

pytestmark = [pytest.mark.lifecycle, pytest.mark.timeout(120)]


def run(rig: Rig, config: dict[str, Any], files: dict[str, str] | None = None,
        tmp_path: Path | None = None, while_running: Any = None) -> dict[str, Any]:
    """Submit `config` (with a context of `files`), tick to the trial's settled end; the
    trial as the API describes it. `while_running(trial_id)` is called on each pass until
    it returns true."""
    archive = None
    if files is not None:
        assert tmp_path is not None
        context = tmp_path / "context"
        context.mkdir()
        for name, text in files.items():
            (context / name).write_text(text)
        archive = tmp_path / "context.tar.gz"
        archive.write_bytes(pack_context(context))
    full = {"name": "planned-end", "failure_policy": {"stop_grace": "1s"}, **config}
    experiment_id = create_experiment(rig.store, rig.home, rig.admin, yaml.safe_dump(full),
                                      archive)
    with rig.store.session_scope() as s:
        trial_id = s.scalars(select(Trial.id).where(Trial.experiment_id == experiment_id)).one()
    if while_running is not None:
        rig.tick_until(lambda: while_running(trial_id), what="the run to reach its fault")
    rig.tick_until(lambda: TrialState(rig.trial(trial_id).state).is_at_rest(),
                   what="the trial to settle", timeout=90)
    return describe_trial(rig.store, trial_id)


def statuses(trial: dict[str, Any]) -> dict[str, str]:
    return {c["name"]: c["status"] for c in trial["verification"]["checks"]}


def detail(trial: dict[str, Any], name: str) -> str:
    [found] = [c["detail"] for c in trial["verification"]["checks"] if c["name"] == name]
    return str(found)


def train(*args: str) -> list[str]:
    return fixture_entrypoint("harness_train.py", *args)


# -- the harness loop ----------------------------------------------------------------------


def test_a_run_that_reaches_its_plan_is_verified(sqlite_rig: Rig) -> None:
    trial = run(sqlite_rig, {"entrypoint": train("--epochs", "3", "--plan")})
    assert (trial["state"], trial["verification"]["verified"]) == ("SUCCEEDED", True)
    assert detail(trial, "completed") == "reached epoch 3 of 3 (ctx.plan())"
    assert statuses(trial)["checkpoint_fresh"] == "passed"
    assert statuses(trial)["log_errors"] == "passed"


def test_a_caught_crash_with_the_harness_is_suspect(sqlite_rig: Rig) -> None:
    # 15 steps of 30, then `except Exception: print(...); sys.exit(0)`; a checkpoint of
    # epoch 1 exists, as it did when this ended SUCCEEDED and verified.
    trial = run(sqlite_rig, {"entrypoint": train("--epochs", "3", "--plan",
                                                 "--catch-crash-after", "15")})
    assert trial["state"] == "SUSPECT"
    assert trial["verification"]["verified"] is False
    assert detail(trial, "completed") == "stopped at epoch 1 of 3 (33%; ctx.plan())"
    assert statuses(trial)["log_errors"] == "failed"
    assert "RuntimeError: shapes do not match at step 15" in detail(trial, "log_errors")
    assert "rank 0, log offset" in detail(trial, "log_errors")


def test_a_caught_crash_without_a_plan_is_suspect_from_its_log(sqlite_rig: Rig) -> None:
    trial = run(sqlite_rig, {"entrypoint": train("--epochs", "3", "--catch-crash-after", "15")})
    assert trial["state"] == "SUSPECT"
    assert statuses(trial)["completed"] == "not_run"
    assert "RuntimeError: shapes do not match" in detail(trial, "log_errors")


def test_log_errors_warn_only_warns_and_off_does_not_look(sqlite_rig: Rig) -> None:
    crash = ["--epochs", "3", "--plan", "--catch-crash-after", "25"]
    warned = run(sqlite_rig, {"entrypoint": train(*crash), "verify": {
        "log_errors": "warn", "expected_length": {"epochs": 3}}})
    # It stopped in epoch 3 of 3: completed still fails; the traceback is only a warning.
    assert statuses(warned)["log_errors"] == "warning"
    assert warned["state"] == "SUSPECT" and statuses(warned)["completed"] == "failed"
    off = run(sqlite_rig, {"entrypoint": train(*crash), "verify": {"log_errors": "off"}})
    assert "log_errors" not in statuses(off)


def test_a_swallowed_failed_last_save_is_suspect(sqlite_rig: Rig) -> None:
    # Saves at steps 9, 19, 29; the last writes to /dev/full (ENOSPC) and the loop goes on
    # to exit 0 with the checkpoint of step 19 intact.
    trial = run(sqlite_rig, {"entrypoint": train("--epochs", "3", "--plan",
                                                 "--full-disk-at", "29")})
    assert trial["state"] == "SUSPECT"
    assert statuses(trial)["checkpoint"] == "passed"  # step 19's is intact
    assert statuses(trial)["checkpoint_fresh"] == "failed"
    fresh = detail(trial, "checkpoint_fresh")
    assert fresh.startswith("the save of step 29 (rank 0) failed: ")
    assert "No space left on device" in fresh and "no later save succeeded" in fresh


def test_an_epoch_skipped_by_a_resume_is_suspect(sqlite_rig: Rig) -> None:
    # Attempt 1 trains epochs 1-3 and dies (SIGKILL, not muster's): the restart resumes
    # from epoch 3's checkpoint but starts at epoch 5, the resume bug that exits 0 having
    # done none of epoch 4.
    trial = run(sqlite_rig, {"entrypoint": train("--epochs", "6", "--plan", "--sigkill-after",
                                                 "30", "--on-attempt", "1",
                                                 "--skip-on-resume", "1")})
    assert trial["state"] == "SUSPECT"
    assert len(trial["attempts"]) == 2
    assert detail(trial, "resume_accounting") == (
        "epoch 4 was never trained (attempt 1 reported up to epoch 3, attempt 2 went on "
        "from epoch 5)")
    assert detail(trial, "completed") == "stopped at epoch 5 of 6 (83%; ctx.plan())"


def test_a_resume_that_redoes_an_epoch_counts_it_once(sqlite_rig: Rig) -> None:
    trial = run(sqlite_rig, {"entrypoint": train("--epochs", "4", "--plan", "--sigkill-after",
                                                 "25", "--on-attempt", "1")})
    assert (trial["state"], trial["verification"]["verified"]) == ("SUCCEEDED", True)
    assert detail(trial, "resume_accounting") == (
        "2 attempts: every epoch from 1 to 4 was trained")


# -- plain scripts -------------------------------------------------------------------------


CAUGHT = """\
import sys, time, traceback
open("model.pt", "w").write("weights of epoch 0")
try:
    for step in range(200):
        if step == 150:
            raise ValueError("CUDA-free failure: bad batch at 150")
    open("model.pt", "w").write("final weights")
except Exception:
    traceback.print_exc()
    print("training failed, exiting cleanly", flush=True)
    sys.exit(0)
"""


def test_a_caught_crash_with_verify_outputs_is_suspect(sqlite_rig: Rig, tmp_path: Path) -> None:
    trial = run(sqlite_rig, {"entrypoint": ["python", "train.py"],
                             "verify": {"outputs": ["model.pt"]}},
                {"train.py": CAUGHT}, tmp_path)
    assert trial["state"] == "SUSPECT"
    assert statuses(trial)["outputs"] == "passed"  # the file exists: that proved nothing
    assert detail(trial, "log_errors").startswith(
        "the log ends in an error after the last progress: rank 0, log offset 0: "
        "ValueError: CUDA-free failure: bad batch at 150")


# word_language_model's own Ctrl-C path: it prints and exits 0 after its epoch loop.
EARLY_EXIT = """\
import pathlib, time
try:
    for epoch in range(1, 7):
        print(f"| end of epoch {epoch:3d} | trained 10 samples", flush=True)
        if epoch == 1:
            pathlib.Path("epoch-1-done").write_text("")
        time.sleep(0.5 if epoch > 1 else 60)
except KeyboardInterrupt:
    print("-" * 89)
    print("Exiting from training early", flush=True)
"""


def test_a_sigint_early_exit_is_suspect(sqlite_rig: Rig, tmp_path: Path) -> None:
    interrupted = False

    def interrupt(trial_id: int) -> bool:
        nonlocal interrupted
        view = sqlite_rig.trial(trial_id)
        if not view.attempts:
            return False
        attempt_dir = view.attempts[0].run_dir
        shim = read_json(attempt_dir / "rank-0.shim.json")
        if shim is None or not (attempt_dir.parent / "workdir" / "epoch-1-done").exists():
            return False
        child = ProcessIdentity(shim["child_pid"], shim["child_start_ticks"])
        interrupted = send_signal(child, signal.SIGINT)  # Ctrl-C, not muster's stop
        return interrupted

    trial = run(sqlite_rig, {
        "entrypoint": ["python", "train.py"],
        "verify": {"samples_from_log": r"end of epoch +(?P<epoch>\d+) \| trained "
                                       r"(?P<samples>\d+) samples",
                   "expected_length": {"epochs": 6}, "expected_samples": 10},
    }, {"train.py": EARLY_EXIT}, tmp_path, while_running=interrupt)
    assert interrupted
    assert trial["attempts"][0]["replicas"][0]["exit_code"] == 0
    assert trial["state"] == "SUSPECT"
    assert detail(trial, "completed") == (
        "stopped at epoch 1 of 6 (16%; verify.expected_length)")


# Attempt 1 writes its output and is killed (not by muster); attempt 2 crashes, catches it,
# and exits 0 before writing anything.
STALE = """\
import os, signal, sys, traceback
attempt = int(os.environ["MUSTER_ATTEMPT"])
if attempt == 1:
    open("model.pt", "w").write("weights of attempt 1")
    os.kill(os.getpid(), signal.SIGKILL)
try:
    raise OSError("the data loader lost its files")
except OSError:
    print("giving up quietly", flush=True)
"""


def test_an_output_left_by_a_killed_attempt_is_not_this_attempts(
    sqlite_rig: Rig, tmp_path: Path
) -> None:
    trial = run(sqlite_rig, {"entrypoint": ["python", "train.py"],
                             "verify": {"outputs": ["model.pt"]}},
                {"train.py": STALE}, tmp_path)
    assert len(trial["attempts"]) == 2
    assert trial["state"] == "SUSPECT"
    assert statuses(trial)["outputs"] == "passed"  # it exists and was written in the run
    assert detail(trial, "outputs_fresh") == (
        "model.pt: not written by attempt 2, the one that ended (it is the file an earlier "
        "attempt left)")


REWRITES = """\
import os, signal
attempt = int(os.environ["MUSTER_ATTEMPT"])
open("model.pt", "w").write(f"weights of attempt {attempt}")
if attempt == 1:
    os.kill(os.getpid(), signal.SIGKILL)
"""


def test_an_output_rewritten_by_the_final_attempt_is_fresh(
    sqlite_rig: Rig, tmp_path: Path
) -> None:
    trial = run(sqlite_rig, {"entrypoint": ["python", "train.py"],
                             "verify": {"outputs": ["model.pt"]}},
                {"train.py": REWRITES}, tmp_path)
    assert trial["state"] == "SUCCEEDED"
    assert detail(trial, "outputs_fresh") == "1 file written by attempt 2: model.pt"
