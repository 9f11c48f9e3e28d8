"""examples/lightning, run for real under muster: a plain Lightning script (no muster import)
verified through `integrations: auto`, through a pause and a SIGKILL to a resume from
muster's checkpoints; a crash the script swallows is SUSPECT; and 2 DDP ranks with the
callback added by hand.

Each test starts real training processes (Lightning on CPU); the timeouts only bound how
long a broken run hangs.
"""

from __future__ import annotations

import json
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
from tests.examples.test_ddp import checks, run_to_end, saved, submit
from tests.supervise.conftest import Rig

pytest.importorskip("lightning", reason="the Lightning example needs the 'examples' extra")

pytestmark = [pytest.mark.lifecycle, pytest.mark.timeout(300)]

STEPS_PER_EPOCH = 45  # 1,440 training digits in batches of 32


@pytest.fixture
def context(tmp_path: Path) -> Path:
    return copy_context(tmp_path, "lightning")


def test_a_plain_script_is_verified_through_a_pause_and_a_sigkilled_attempt(
    sqlite_rig: Rig, context: Path
) -> None:
    view, stopped = pause_kill_and_finish(
        sqlite_rig, example_config("lightning", "lightning.yaml"), context)

    # The pause saved a checkpoint of its own, which attempt 2 resumed from.
    assert stopped.path.joinpath(f"muster-stop-step={stopped.step}.ckpt").is_file()
    assert f"resuming Lightning from {stopped.path}" in log_of(view.attempts[1].run_dir)
    assert "muster: resuming Lightning from" in log_of(view.attempts[2].run_dir)
    found = checks(sqlite_rig, view.id)
    assert found["completed"]["detail"] == (
        f"reached step {4 * STEPS_PER_EPOCH} of {4 * STEPS_PER_EPOCH} "
        "(the lightning integration)")
    assert describe_trial(sqlite_rig.store, view.id)["integration"] == "lightning"
    plan = json.loads((view.attempts[2].run_dir / "rank-0.plan.json").read_text())
    assert plan == {"unit": "steps", "length": 4 * STEPS_PER_EPOCH, "integration": "lightning"}


def test_a_crash_the_script_swallows_is_suspect(sqlite_rig: Rig, context: Path) -> None:
    detail = crash_is_suspect(sqlite_rig, example_config("lightning", "lightning.yaml"),
                              context, step=60)

    assert detail.startswith("stopped at step ")
    assert f" of {4 * STEPS_PER_EPOCH} (" in detail
    assert detail.endswith("; the lightning integration)")


def test_two_ddp_ranks_with_the_callback_added_by_hand_are_verified(
    sqlite_rig: Rig, context: Path
) -> None:
    job = submit(sqlite_rig, example_config("lightning", "lightning-ddp.yaml"), context)

    view = run_to_end(sqlite_rig, job)

    assert (view.state, view.reason) == ("SUCCEEDED", "OK"), view.message
    found = checks(sqlite_rig, job.trial_id)
    assert all(c["passed"] for c in found.values()), found
    attempt = view.attempts[0].run_dir
    for rank in (0, 1):
        epochs = json.loads((attempt / f"rank-{rank}.samples.json").read_text())["epochs"]
        assert epochs == {"0": 720, "1": 720, "2": 720}
    assert describe_trial(sqlite_rig.store, job.trial_id)["integration"] == "lightning"
    assert saved(attempt.parent / "checkpoints")[-1].step == 3 * 23  # 720 digits a rank, by 32
