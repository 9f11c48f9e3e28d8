"""Issue 30 item 4: a data path whose manifest counts no file never reaches a launch.

Refused at submission where the request can tell (tests/server/test_submission_checks.py);
here, a folder emptied between the submission and the launch: the scan before the launch
counts 0 files and the trial fails before any process starts, saying what to do. With
`data.allow_empty: true` the same empty folder is accepted and the trial launches.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml
from sqlalchemy import select

from muster.errors import ConfigError
from muster.services.experiments import create_experiment
from muster.states import ExperimentState
from muster.store import Trial
from tests.supervise.conftest import Rig

pytestmark = [pytest.mark.lifecycle, pytest.mark.timeout(120)]


def _submit(rig: Rig, data: dict[str, object]) -> tuple[int, int]:
    text = yaml.safe_dump({"name": "empty-data", "data": data,
                           "entrypoint": [sys.executable, "-c", "print('trained')"],
                           "failure_policy": {"stop_grace": "1s"}})
    experiment_id = create_experiment(rig.store, rig.home, rig.admin, text, archive=None)
    with rig.store.session_scope() as s:
        return experiment_id, s.scalars(select(Trial.id).where(
            Trial.experiment_id == experiment_id)).one()


def test_a_folder_emptied_before_the_launch_fails_the_trial_before_it_starts(
    sqlite_rig: Rig, tmp_path: Path
) -> None:
    data = tmp_path / "data"
    (data / "cat").mkdir(parents=True)
    (data / "cat" / "1.png").write_bytes(b"png")
    (data / "notes.txt").write_text("not counted")
    experiment_id, trial_id = _submit(
        sqlite_rig, {"path": str(data), "manifest": {"extensions": [".png"]}})
    (data / "cat" / "1.png").unlink()

    sqlite_rig.tick_until(lambda: sqlite_rig.trial(trial_id).state == "FAILED",
                          what="the trial over no data to fail")
    view = sqlite_rig.trial(trial_id)
    assert view.reason == "PERMANENT_ERROR" and view.attempts == []
    assert view.message == (
        f"data.path: {str(data)!r} holds no file matching *.png (data.manifest.extensions), "
        "so a run over it would train on nothing; add the data files there (or fix the path), "
        "or set data.allow_empty: true if the script brings its own data")
    with sqlite_rig.store.session_scope() as s:
        manifest = s.get_one(Trial, trial_id).manifest
        assert manifest is not None and manifest["file_count"] == 0  # the evidence, kept
    sqlite_rig.tick_until(
        lambda: sqlite_rig.experiment_state(experiment_id) is ExperimentState.ERROR,
        what="the experiment to end in ERROR")


def test_allow_empty_accepts_an_empty_folder_and_launches(sqlite_rig: Rig,
                                                          tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ConfigError, match="holds no file matching"):
        _submit(sqlite_rig, {"path": str(empty)})
    experiment_id, trial_id = _submit(sqlite_rig, {"path": str(empty), "allow_empty": True})
    sqlite_rig.tick_until(lambda: sqlite_rig.experiment_state(experiment_id).is_terminal()
                          or sqlite_rig.trial(trial_id).state == "SUSPECT",
                          what="the trial over an allowed empty folder to settle")
    view = sqlite_rig.trial(trial_id)
    assert len(view.attempts) == 1 and view.attempts[0].exit_code == 0, view
