"""One bad experiment never stops the others (issue 12, item 12).

Before: a stored config the code could not read, or a `data.path` the operating system
refused (a NUL byte), made every supervisor pass fail at the same step, so no trial of any
experiment started; a manifest scan of a large tree ran inside the pass and held up all.
Here each such experiment ends alone, with why, while another runs to SUCCEEDED beside it.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from sqlalchemy import select
from sqlalchemy.orm.attributes import flag_modified

from muster.launch.identity import is_alive, read_identity
from muster.services.experiments import create_experiment
from muster.states import TrialState
from muster.store import Experiment, Replica, Trial
from muster.supervise.following import Following
from tests.supervise.conftest import Rig, Submitted, fixture_entrypoint
from tests.waiting import wait_until

pytestmark = [pytest.mark.lifecycle, pytest.mark.timeout(120)]

ENDED_ALONE = "and ended this trial so that the others go on"


def _submit(rig: Rig, config: dict[str, Any]) -> Submitted:
    base = {"name": "isolation", "entrypoint": [sys.executable, "-c", "print('ok')"],
            "failure_policy": {"stop_grace": 1.0}}
    experiment_id = create_experiment(rig.store, rig.home, rig.admin,
                                      yaml.safe_dump({**base, **config}),
                                      archive=None)
    with rig.store.session_scope() as s:
        trial_id = s.scalars(select(Trial.id).where(Trial.experiment_id == experiment_id))
        return Submitted(experiment_id, trial_id.one())


def _poison(rig: Rig, job: Submitted, change: Any) -> None:
    """Rewrite the stored config as an older or broken server might have left it."""
    with rig.store.session_scope() as s:
        experiment = s.get_one(Experiment, job.experiment_id)
        config = dict(experiment.config)
        change(config)
        experiment.config = config
        flag_modified(experiment, "config")


def test_a_config_the_server_cannot_read_ends_only_its_own_trial(rig: Rig) -> None:
    bad, good = _submit(rig, {}), _submit(rig, {})
    _poison(rig, bad, lambda c: c["resources"].update(replicas="two"))
    assert rig.run_to_end(good).state == "SUCCEEDED"
    ended = rig.tick_until(lambda: (t := rig.trial(bad.trial_id)).state == "FAILED" and t,
                           what="the broken trial to end")
    assert ended.reason == "INTERNAL" and ENDED_ALONE in (ended.message or "")
    assert "ValidationError" in (ended.message or "")
    rig.tick_until(lambda: rig.experiment_state(bad.experiment_id).is_terminal(),
                   what="the broken experiment to end")
    assert rig.experiment_state(bad.experiment_id).value == "ERROR"


def test_a_data_path_the_os_refuses_ends_only_its_own_trial(rig: Rig, tmp_path: Path) -> None:
    """The issue's case: `data.path` with a NUL byte (refused at submission now; stored by
    an older server): the scan cannot even start."""
    data = tmp_path / "data"
    data.mkdir()
    (data / "a.png").write_bytes(b"png")  # (an empty folder is refused at submission)
    bad, good = _submit(rig, {"data": {"path": str(data)}}), _submit(rig, {})
    _poison(rig, bad, lambda c: c["data"].update(path=f"{data}\0/../etc"))
    assert rig.run_to_end(good).state == "SUCCEEDED"
    ended = rig.tick_until(lambda: (t := rig.trial(bad.trial_id)).state == "FAILED" and t,
                           what="the broken trial to end")
    assert ended.reason == "INTERNAL" and "null byte" in (ended.message or "")


def test_a_search_that_cannot_draw_ends_alone(rig: Rig) -> None:
    search = {"hyperparameters": {"x": {"type": "categorical", "vals": [1, 2]}},
              "searcher": {"name": "grid", "metric": "loss"}}
    experiment_id = create_experiment(rig.store, rig.home, rig.admin, yaml.safe_dump(
        {"name": "search", "entrypoint": ["true"], **search}), archive=None)
    with rig.store.session_scope() as s:
        experiment = s.get_one(Experiment, experiment_id)
        experiment.config = {**experiment.config, "hyperparameters": {"x": {"type": "nope"}}}
    good = _submit(rig, {})
    assert rig.run_to_end(good).state == "SUCCEEDED"
    rig.tick_until(lambda: rig.experiment_state(experiment_id).is_terminal(),
                   what="the broken search to end")
    with rig.store.session_scope() as s:
        experiment = s.get_one(Experiment, experiment_id)
        assert (experiment.state, experiment.trials) == ("ERROR", [])
        assert "drawing its next trial" in (experiment.message or "")


def test_an_error_following_one_attempt_stops_that_trial_only(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fault injected where a pass follows one running attempt: that trial's process is
    stopped and the trial ends INTERNAL; the other trial, running beside it, succeeds."""
    sleeper = _submit(rig, {"entrypoint": fixture_entrypoint("wait_for_file.py",
                                                             str(rig.home.root / "never"))})
    rig.until_trial(sleeper, TrialState.RUNNING)
    with rig.store.session_scope() as s:
        pid = s.scalars(select(Replica.pid).join(Replica.attempt)
                        .where(Replica.attempt.has(trial_id=sleeper.trial_id))).one()
    identity = read_identity(pid) if pid is not None else None
    assert identity is not None and is_alive(identity)
    reconcile = Following.reconcile

    def faulty(self: Following, live: Any) -> None:
        if live.trial.id == sleeper.trial_id:
            raise RuntimeError("injected fault")
        reconcile(self, live)

    monkeypatch.setattr(Following, "reconcile", faulty)
    good = _submit(rig, {})
    assert rig.run_to_end(good).state == "SUCCEEDED"
    ended = rig.trial(sleeper.trial_id)
    assert (ended.state, ended.reason) == ("FAILED", "INTERNAL")
    assert "following attempt 1 (RuntimeError: injected fault)" in (ended.message or "")
    assert ended.attempts[0].state == "FAILED"
    wait_until(lambda: not is_alive(identity), timeout=30, what="the stopped process to end")


def test_a_slow_data_scan_holds_up_no_one(rig: Rig, tmp_path: Path) -> None:
    """The scan runs in a child process: frozen here (SIGSTOP), its trial waits and says
    so while another experiment runs to the end; let go, the trial runs too."""
    data = tmp_path / "data"
    data.mkdir()
    (data / "a.png").write_bytes(b"png")
    scanned = _submit(rig, {"data": {"path": str(data)},
                            "entrypoint": [sys.executable, "-c", "print('samples=1')"],
                            "verify": {"samples_from_log": "samples=(?P<samples>\\d+)"}})
    rig.supervisor.tick()  # admitted: its scan starts
    [child] = wait_until(lambda: _scan_children(str(data)), timeout=30, what="the scan child")
    os.kill(child, signal.SIGSTOP)
    try:
        good = _submit(rig, {})
        assert rig.run_to_end(good).state == "SUCCEEDED"
        with rig.store.session_scope() as s:
            waiting = s.get_one(Trial, scanned.trial_id)
            assert waiting.state == "QUEUED" and waiting.manifest is None
            assert (waiting.queue_reason or "").startswith(f"scanning its data in {data} (")
    finally:
        os.kill(child, signal.SIGCONT)
    assert rig.run_to_end(scanned).state == "SUCCEEDED"
    with rig.store.session_scope() as s:
        assert s.get_one(Trial, scanned.trial_id).manifest["file_count"] == 1


def _scan_children(path: str) -> list[int]:
    """PIDs of the running scan processes of `path`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue  # it ended while we looked
        if b"muster.supervise.manifest" in argv and path.encode() in argv:
            found.append(int(entry.name))
    return found
