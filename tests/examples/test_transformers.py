"""examples/transformers, run for real under muster: a Hugging Face Trainer script (no muster
import, a 2-layer GPT-2 built from a config, generated tokens) verified through
`integrations: auto`, through a pause and a SIGKILL to a resume from muster's checkpoints;
a crash the script swallows is SUSPECT.
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
from tests.examples.test_ddp import checks, saved
from tests.supervise.conftest import Rig

pytest.importorskip("transformers", reason="the Trainer example needs the 'examples' extra")

pytestmark = [pytest.mark.lifecycle, pytest.mark.timeout(300)]

STEPS = 64  # 2 epochs of 1,024 sequences in batches of 32


@pytest.fixture
def context(tmp_path: Path) -> Path:
    return copy_context(tmp_path, "transformers")


def test_a_trainer_script_is_verified_through_a_pause_and_a_sigkilled_attempt(
    sqlite_rig: Rig, context: Path
) -> None:
    view, stopped = pause_kill_and_finish(
        sqlite_rig, example_config("transformers", "transformers.yaml"), context)

    # The pause had the Trainer save checkpoint-<step>/, which attempt 2 resumed from.
    folder = stopped.path / f"checkpoint-{stopped.step}"
    assert (folder / "trainer_state.json").is_file()
    assert f"resuming the Trainer from {folder}" in log_of(view.attempts[1].run_dir)
    assert "muster: resuming the Trainer from" in log_of(view.attempts[2].run_dir)
    assert checks(sqlite_rig, view.id)["completed"]["detail"] == (
        f"reached step {STEPS} of {STEPS} (the transformers integration)")
    assert describe_trial(sqlite_rig.store, view.id)["integration"] == "transformers"
    last = saved(stopped.path.parent)[-1]
    assert last.step == STEPS
    assert last.user_metadata["transformers"]["folder"] == f"checkpoint-{STEPS}"


def test_a_crash_the_script_swallows_is_suspect(sqlite_rig: Rig, context: Path) -> None:
    detail = crash_is_suspect(sqlite_rig, example_config("transformers", "transformers.yaml"),
                              context, step=40)

    assert detail.startswith("stopped at step ") and f" of {STEPS} (" in detail
