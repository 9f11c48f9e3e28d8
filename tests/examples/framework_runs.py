"""What the framework examples' tests (Lightning, the Hugging Face Trainer, Accelerate) do
alike: submit an example unchanged, with `faults.py` pacing its optimizer steps or crashing
one; pause it mid-run and activate it; SIGKILL its resumed attempt; and hold the trial to
the verdict it must get."""

from __future__ import annotations

import json
import os
import shutil
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from muster import checkpoint_files
from muster.services.experiments import activate_experiment, pause_experiment
from muster.states import TrialState
from tests.examples.test_ddp import checks, records, run_to_end, saved, submit
from tests.supervise.conftest import Rig, Submitted, TrialView

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
FAULTS = Path(__file__).resolve().parent / "faults.py"
RUN_TIMEOUT = 120.0


def copy_context(tmp_path: Path, example: str) -> Path:
    """What `muster experiment create` uploads from examples/<example>, and `faults.py`."""
    context = tmp_path / "context"
    context.mkdir()
    shutil.copy2(EXAMPLES / example / "train.py", context / "train.py")
    shutil.copy2(FAULTS, context / FAULTS.name)
    return context


def example_config(example: str, name: str, **variables: str) -> dict[str, Any]:
    """An example's config, with `variables` added to its environment."""
    config: dict[str, Any] = yaml.safe_load((EXAMPLES / example / name).read_text())
    config["environment"]["variables"].update(variables)
    return config


def with_faults(config: dict[str, Any]) -> dict[str, Any]:
    """The config running its script under `faults.py` (which reads TEST_* variables)."""
    config["entrypoint"] = f"python {FAULTS.name} {config['entrypoint'].removeprefix('python ')}"
    return config


def until(rig: Rig, job: Submitted, predicate: Callable[[], Any], what: str) -> Any:
    """Tick until `predicate()` holds; fail at once when the trial comes to rest first."""

    def holds() -> Any:
        found = predicate()
        if not found and TrialState(rig.trial(job.trial_id).state).is_at_rest():
            raise AssertionError(f"the trial came to rest before {what}: "
                                 f"{rig.trial(job.trial_id).message}")
        return found

    return rig.tick_until(holds, what=what, timeout=RUN_TIMEOUT)


def first_checkpoint(rig: Rig, job: Submitted) -> tuple[Path, Path]:
    """Tick until attempt 1 has stored a checkpoint; its run directory and the trial's
    checkpoints directory."""
    first: Path = until(rig, job, lambda: (t := rig.trial(job.trial_id)).attempts
                        and t.attempts[0].run_dir, "attempt 1")
    checkpoints = first.parent / "checkpoints"
    until(rig, job, lambda: saved(checkpoints), "attempt 1's first checkpoint")
    return first, checkpoints


def log_of(attempt_dir: Path, rank: int = 0) -> str:
    return (attempt_dir / f"rank-{rank}.log").read_text(errors="replace")


def pause_kill_and_finish(rig: Rig, config: dict[str, Any], context: Path
                          ) -> tuple[TrialView, checkpoint_files.Inspection]:
    """Run `config` (paced in attempts 1 and 2) through a pause once its first checkpoint
    is stored, an activation, and a SIGKILL of the resumed attempt's rank 0 a few steps on,
    to its end; the trial, and the checkpoint the pause left."""
    config = with_faults(config)
    config["environment"]["variables"].update(TEST_PACE="0.04", TEST_PACE_ATTEMPTS="1,2")
    job = submit(rig, config, context)
    first, checkpoints = first_checkpoint(rig, job)

    pause_experiment(rig.store, rig.admin, job.experiment_id)
    rig.until_trial(job, TrialState.PAUSED)
    stopped = saved(checkpoints)[-1]
    assert json.loads((first / "rank-0.stop-ack.json").read_text())["step"] is not None

    activate_experiment(rig.store, rig.admin, job.experiment_id)
    second = until(rig, job, lambda: len(a := rig.trial(job.trial_id).attempts) > 1
                   and a[1].run_dir, "attempt 2")
    until(rig, job, lambda: any(r["step"] > stopped.step + 3 for r in records(
        second / "rank-0.metrics.jsonl", "training")), "attempt 2 past its resume")
    os.kill(json.loads((second / "rank-0.shim.json").read_text())["child_pid"], signal.SIGKILL)
    view = run_to_end(rig, job)

    assert (view.state, view.reason) == ("SUCCEEDED", "OK"), view.message
    assert [a.reason for a in view.attempts][1:] == ["INFRA", "OK"]
    found = checks(rig, job.trial_id)
    assert all(c["passed"] for c in found.values()), found
    return view, stopped


def crash_is_suspect(rig: Rig, config: dict[str, Any], context: Path, step: int) -> str:
    """Run `config` with optimizer step `step` crashing and the crash swallowed (exit 0):
    the trial must be SUSPECT; the detail of its failed `completed` check."""
    config = with_faults(config)
    config["environment"]["variables"]["TEST_CRASH_AT"] = str(step)
    job = submit(rig, config, context)

    view = run_to_end(rig, job)

    assert view.state == "SUSPECT", view.message
    assert f"caught: injected crash at optimizer step {step}" in log_of(view.attempts[0].run_dir)
    completed = checks(rig, job.trial_id)["completed"]
    assert not completed["passed"], completed
    return str(completed["detail"])
