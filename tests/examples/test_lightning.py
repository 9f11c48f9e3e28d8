"""examples/lightning, run for real under muster: a plain Lightning script (no muster import)
verified through `integrations: auto`, through a pause and a SIGKILL to a resume from
muster's checkpoints; a crash the script swallows is SUSPECT; 2 DDP ranks with the
callback added by hand, resumed after one of them is SIGKILLed; and a warm-started
fine-tune that restored the source's step and trained nothing is SUSPECT.

Each test starts real training processes (Lightning on CPU); the timeouts only bound how
long a broken run hangs.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
from pathlib import Path
from typing import Any

import pytest

from muster.services.experiments import describe_trial
from tests.examples.framework_runs import (
    copy_context,
    crash_is_suspect,
    example_config,
    first_checkpoint,
    log_of,
    pause_kill_and_finish,
    with_faults,
)
from tests.examples.test_ddp import checks, records, run_to_end, saved, submit
from tests.supervise.conftest import FIXTURES, Rig, Submitted

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


def test_two_ddp_ranks_with_the_callback_added_by_hand_resume_after_one_is_sigkilled(
    sqlite_rig: Rig, context: Path
) -> None:
    """2 ranks on gloo (paced in attempt 1): rank 1 SIGKILLed once epoch 0's checkpoint is
    stored ends the attempt INFRA; both ranks of attempt 2 resume from that checkpoint (not
    from step 0), and the trial is verified with every epoch's samples counted once."""
    rig = sqlite_rig
    config = with_faults(example_config("lightning", "lightning-ddp.yaml",
                                        TEST_PACE="0.05", TEST_PACE_ATTEMPTS="1"))
    job = submit(rig, config, context)
    first, checkpoints = first_checkpoint(rig, job)
    killed = saved(checkpoints)[-1]
    os.kill(json.loads((first / "rank-1.shim.json").read_text())["child_pid"], signal.SIGKILL)
    view = run_to_end(rig, job)

    assert (view.state, view.reason) == ("SUCCEEDED", "OK"), view.message
    assert [a.reason for a in view.attempts] == ["INFRA", "OK"]
    found = checks(rig, job.trial_id)
    assert all(c["passed"] for c in found.values()), found
    second = view.attempts[1].run_dir
    for rank in (0, 1):
        assert f"resuming Lightning from {killed.path}" in log_of(second, rank)
        steps = [r["step"] for r in records(second / f"rank-{rank}.metrics.jsonl", "training")]
        assert steps and min(steps) > killed.step
    assert describe_trial(rig.store, job.trial_id)["integration"] == "lightning"
    assert saved(checkpoints)[-1].step == 3 * 23  # 720 digits a rank, by 32


def _fine_tunes(rig: Rig, context: Path, *configs: dict[str, Any]) -> list[Submitted]:
    """`python lightning_finetune.py STEPS` (tests/fixtures), one experiment per config (its
    `steps` and searcher keys), run to their ends."""
    jobs = [submit(rig, {"name": "fine-tune",
                         "entrypoint": f"python lightning_finetune.py {extra.pop('steps')}",
                         "environment": {"variables": {"OMP_NUM_THREADS": 1}},
                         "failure_policy": {"stop_grace": "20s"}, **extra}, context)
            for extra in configs]
    for job in jobs:
        run_to_end(rig, job)
    return jobs


def test_a_warm_started_fine_tune_that_trained_no_step_is_suspect(sqlite_rig: Rig,
                                                                  tmp_path: Path) -> None:
    """Lightning restores the warm start's step counter with its weights: a fine-tune with
    `max_steps` no higher than the source's skips `fit`, and muster's session ends with
    `fit`, so the `validate()` and `save_checkpoint` after it report nothing: SUSPECT (no
    progress), not verified. The same script with `max_steps` past the source's goes on
    from the source's step and is verified."""
    rig = sqlite_rig
    context = tmp_path / "context"
    context.mkdir()
    shutil.copy2(FIXTURES / "lightning_finetune.py", context)
    single = {"name": "single", "metric": "val_loss"}
    [source] = _fine_tunes(rig, context, {"steps": 20, "searcher": single})
    assert checks(rig, source.trial_id)["completed"]["detail"] == (
        "reached step 20 of 20 (the lightning integration)")
    idle, more = _fine_tunes(rig, context, *({
        "steps": steps, "searcher": {**single, "source_trial_id": source.trial_id},
        "verify": {"expected_length": {"steps": steps}}} for steps in (20, 30)))

    trial = describe_trial(rig.store, idle.trial_id)
    log = log_of(rig.trial(idle.trial_id).attempts[0].run_dir)
    assert "muster: resuming Lightning from" in log and "the experiment's warm start" in log
    assert "`max_steps=20` reached" in log  # Lightning's own words: fit trained nothing
    assert (trial["state"], trial["verified"]) == ("SUSPECT", False)
    assert checks(rig, idle.trial_id)["completed"]["detail"] == (
        "no progress in steps was reported; 20 steps planned (verify.expected_length)")

    trial = describe_trial(rig.store, more.trial_id)
    assert (trial["state"], trial["verified"]) == ("SUCCEEDED", True), trial["verification"]
    steps = [r["step"] for r in records(
        rig.trial(more.trial_id).attempts[0].run_dir / "rank-0.metrics.jsonl", "training")]
    assert steps and min(steps) > 20 and max(steps) == 30  # it went on from the source's step
