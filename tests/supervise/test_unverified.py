"""An exit 0 that nothing inspected is not presented as verified, and scripts without the
harness can still be verified: sample counts from their logs, and the files they must write."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from sqlalchemy import select

from muster.client import pack_context
from muster.services.experiments import create_experiment, describe_trial
from muster.states import TrialState
from muster.store import Trial
from muster.supervise.verification import NOT_VERIFIED
from tests.supervise.conftest import Rig

pytestmark = pytest.mark.timeout(120)

EPOCHS = """\
import sys
counts = [int(n) for n in sys.argv[1:]]
for epoch, seen in enumerate(counts):
    print(f"epoch {epoch}: trained on {seen} samples", flush=True)
"""


def run_experiment(rig: Rig, tmp_path: Path, name: str, files: dict[str, str],
                   **config: Any) -> dict[str, Any]:
    """Submit a context holding `files` (and data/ with 5 files), run it to its end; the
    trial as `describe_trial` shows it."""
    context = tmp_path / name
    (context / "data").mkdir(parents=True)
    for index in range(5):
        (context / "data" / f"{index}.txt").write_text(str(index))
    for relative, text in files.items():
        (context / relative).write_text(text)
    archive = tmp_path / f"{name}.tar.gz"
    archive.write_bytes(pack_context(context))
    full = {"name": name, "failure_policy": {"stop_grace": "1s"}, **config}
    experiment_id = create_experiment(rig.store, rig.home, rig.admin, yaml.safe_dump(full), archive)
    with rig.store.session_scope() as s:
        trial_id = s.scalars(select(Trial.id).where(Trial.experiment_id == experiment_id)).one()
    rig.tick_until(lambda: TrialState(rig.trial(trial_id).state).is_at_rest(),
                   what=f"the trial of {name} to end")
    return describe_trial(rig.store, trial_id)


def test_an_exit_0_that_nothing_checked_is_not_verified(sqlite_rig: Rig, tmp_path: Path) -> None:
    trial = run_experiment(sqlite_rig, tmp_path, "bare", {"train.py": "import sys; sys.exit(0)"},
                           entrypoint=["python", "train.py"])
    assert trial["state"] == "SUCCEEDED"
    assert trial["verification"]["passed"] is True
    assert trial["verification"]["verified"] is False
    assert f"; {NOT_VERIFIED}: completed: no planned length" in trial["message"]
    json.dumps(trial)


def test_samples_counted_from_the_log_verify_a_script_without_the_harness(
    sqlite_rig: Rig, tmp_path: Path
) -> None:
    config: dict[str, Any] = {
        "data": {"path": "data"},
        "verify": {"samples_from_log": r"trained on (?P<samples>\d+) samples",
                   "expected_length": {"epochs": 3}}}
    whole = run_experiment(sqlite_rig, tmp_path, "whole", {"train.py": EPOCHS},
                           entrypoint=["python", "train.py", "5", "5", "5"], **config)
    assert whole["state"] == "SUCCEEDED"
    checks = {c["name"]: c for c in whole["verification"]["checks"]}
    assert checks["samples_from_log"]["detail"] == "3 epochs in the logs, each within 1.0% of 5"
    assert whole["verification"]["verified"] is True and "samples" not in checks
    assert checks["completed"]["detail"] == "reached epoch 3 of 3 (verify.expected_length)"

    dropped = run_experiment(sqlite_rig, tmp_path, "dropped", {"train.py": EPOCHS},
                             entrypoint=["python", "train.py", "5", "4", "5"], **config)
    assert dropped["state"] == "SUSPECT"
    detail = {c["name"]: c for c in dropped["verification"]["checks"]}["samples_from_log"]
    assert detail == {"name": "samples_from_log", "passed": False, "status": "failed",
                      "detail": "epoch 1: 4 samples seen, 5 expected (\u221220.0%)"}


def test_outputs_must_be_written_during_the_run(sqlite_rig: Rig, tmp_path: Path) -> None:
    writes = "open('model.pt', 'w').write('weights')\n"
    written = run_experiment(sqlite_rig, tmp_path, "written", {"train.py": writes},
                             entrypoint=["python", "train.py"], verify={"outputs": ["model.pt"]})
    # Written by the attempt that ended; but nothing says how far it was meant to train.
    assert (written["state"], written["verification"]["verified"]) == ("SUCCEEDED", False)
    statuses = {c["name"]: c["status"] for c in written["verification"]["checks"]}
    assert (statuses["outputs"], statuses["outputs_fresh"], statuses["completed"]) == (
        "passed", "passed", "not_run")
    shipped = run_experiment(sqlite_rig, tmp_path, "shipped",
                             {"train.py": "pass\n", "model.pt": "stale weights"},
                             entrypoint=["python", "train.py"],
                             verify={"outputs": ["model.pt", "eval.json"]})
    assert shipped["state"] == "SUSPECT"
    outputs = {c["name"]: c for c in shipped["verification"]["checks"]}["outputs"]
    assert outputs["detail"] == ("model.pt was not written during the run (it is older than "
                                 "the trial's first attempt); eval.json is missing")
