"""examples/accelerate, run for real under muster: a plain Accelerate loop with muster's
tracker, verified through a pause and a SIGKILL to a resume from muster's checkpoints
(`save_state`/`load_state`); a crash the script swallows is SUSPECT.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from muster.services.experiments import describe_trial
from tests.examples.framework_runs import (
    copy_context,
    crash_is_suspect,
    example_config,
    log_of,
    pause_kill_and_finish,
)
from tests.examples.test_ddp import checks
from tests.supervise.conftest import Rig

pytest.importorskip("accelerate", reason="the Accelerate example needs the 'examples' extra")

pytestmark = [pytest.mark.lifecycle, pytest.mark.timeout(300)]

STEPS = 180  # 4 epochs of 1,440 digits in batches of 32


@pytest.fixture
def context(tmp_path: Path) -> Path:
    return copy_context(tmp_path, "accelerate")


def test_an_accelerate_loop_is_verified_through_a_pause_and_a_sigkilled_attempt(
    sqlite_rig: Rig, context: Path
) -> None:
    view, stopped = pause_kill_and_finish(
        sqlite_rig, example_config("accelerate", "accelerate.yaml"), context)

    assert (stopped.path / "checkpoint" / "model.safetensors").is_file()
    assert f"resuming Accelerate from {stopped.path / 'checkpoint'}" in log_of(
        view.attempts[1].run_dir)
    assert "muster: resuming Accelerate from" in log_of(view.attempts[2].run_dir)
    assert checks(sqlite_rig, view.id)["completed"]["detail"] == (
        f"reached step {STEPS} of {STEPS} (the accelerate integration)")
    assert describe_trial(sqlite_rig.store, view.id)["integration"] == "accelerate"


def test_a_crash_the_script_swallows_is_suspect(sqlite_rig: Rig, context: Path) -> None:
    detail = crash_is_suspect(sqlite_rig, example_config("accelerate", "accelerate.yaml"),
                              context, step=60)

    assert detail.startswith("stopped at step ") and f" of {STEPS} (" in detail
