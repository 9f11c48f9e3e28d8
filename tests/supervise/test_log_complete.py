"""Logs that say when they are incomplete, end to end (issue 31, item 6): a disk filled under
a running trial makes its exit 0 SUSPECT (check `log_complete` failed) with the lost bytes on
its replica; a trial over its `resources.log_limit` keeps its head and tail, and its check
warns (the cap is deliberate)."""

from __future__ import annotations

import contextlib
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from rich.console import Console
from sqlalchemy import select

from muster.cli import render
from muster.home import Home
from muster.launch.local import LocalLauncher
from muster.rundir import RankFiles
from muster.schedule.local_placement import LocalPlacement
from muster.server import api
from muster.services.experiments import create_experiment, describe_trial
from muster.states import TrialState
from muster.store import Store, Trial
from muster.supervise.supervisor import Supervisor
from tests.accounts import first_admin
from tests.processes import kill_home_processes
from tests.supervise.conftest import Rig, Submitted, fixture_entrypoint

pytestmark = [pytest.mark.lifecycle, pytest.mark.timeout(120)]

MiB = 1 << 20


def submit(rig: Rig, entrypoint: list[str], resources: dict[str, Any] | None = None) -> Submitted:
    config = {"name": "log-test", "entrypoint": entrypoint,
              "resources": resources or {}, "failure_policy": {"stop_grace": 1.0}}
    experiment_id = create_experiment(rig.store, rig.home, rig.admin, yaml.safe_dump(config),
                                      archive=None)
    with rig.store.session_scope() as s:
        trial_id = s.scalars(select(Trial.id).where(Trial.experiment_id == experiment_id)).one()
    return Submitted(experiment_id, trial_id)


def rank_files(rig: Rig, trial_id: int, attempt: int = 1) -> RankFiles:
    with rig.store.session_scope() as s:
        uuid = s.get_one(Trial, trial_id).uuid
    return rig.home.run_dir(uuid).attempt(attempt).rank(0)


def checks(rig: Rig, trial_id: int) -> dict[str, dict[str, Any]]:
    with rig.store.session_scope() as s:
        verification = s.get_one(Trial, trial_id).verification or {}
    return {c["name"]: c for c in verification.get("checks", [])}


@pytest.fixture
def rig_on_a_small_disk(store: Store, tmp_path: Path) -> Iterator[Rig]:
    """A supervisor whose run directories are on a fresh 8 MiB tmpfs (a real file system a
    test can fill under a running trial); skipped where one cannot be mounted."""
    home = Home(tmp_path / "home").ensure()
    runs = home.run_dir("x").path.parent
    runs.mkdir(parents=True, exist_ok=True)
    try:
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(runs)],
                              capture_output=True, text=True, check=False)
    except OSError as exc:
        pytest.skip(f"no mount command to make a small disk to fill: {exc}")
    if done.returncode != 0:
        pytest.skip("cannot mount a tmpfs to fill (needs root or CAP_SYS_ADMIN): "
                    f"{done.stderr.strip()}")
    try:
        supervisor = Supervisor(store, LocalLauncher(), home, LocalPlacement(store, slots=4),
                                min_free_disk=0)
        yield Rig(store, home, supervisor, first_admin(store, home))
    finally:
        kill_home_processes(home.root)
        subprocess.run(["umount", "-l", str(runs)], capture_output=True, check=False)


def fill(path: Path) -> None:
    """Write `path` until its file system is full (ENOSPC)."""
    with path.open("ab", buffering=0) as file, contextlib.suppress(OSError):
        while True:
            file.write(b"\0" * 4096)


def test_a_disk_filled_under_a_running_trial_makes_its_exit_0_suspect(
        rig_on_a_small_disk: Rig, tmp_path: Path) -> None:
    rig = rig_on_a_small_disk
    control = tmp_path / "control"
    control.mkdir()
    job = submit(rig, fixture_entrypoint("print_in_phases.py", str(control), str(200 * 1024)))
    files = rank_files(rig, job.trial_id)
    rig.tick_until(lambda: files.log.exists() and b"before\n" in files.log.read_bytes(),
                   what="the trial to print before its disk fills")
    filler = files.attempt_dir.parent.parent / "filler"
    fill(filler)
    (control / "go").touch()
    rig.tick_until(lambda: (control / "printed").exists(),
                   what="the trial to print on the full disk (it must never block)")
    filler.unlink()
    (control / "more").touch()
    trial = rig.until_trial(job, TrialState.SUSPECT)  # waiting for a review

    assert trial.state == "SUSPECT", trial.message
    check = checks(rig, job.trial_id)["log_complete"]
    assert check["status"] == "failed"
    assert check["detail"].startswith("rank 0 lost ")
    assert check["detail"].endswith(" of output (No space left on device): the log is incomplete")
    assert trial.message is not None and "log_complete: rank 0 lost" in trial.message
    description = api.TrialDescription.model_validate(describe_trial(rig.store, job.trial_id))
    [replica] = description.attempts[0].replicas
    assert replica.log_lost_bytes is not None and replica.log_lost_bytes > 0
    console = Console(width=250, record=True)
    console.print(render.attempts_table(description.model_dump()))
    assert "of output lost)" in console.export_text()
    assert "of output lost here: No space left on device" in files.log.read_text()


def test_a_trial_over_its_log_limit_keeps_head_and_tail_and_its_check_warns(
        sqlite_rig: Rig) -> None:
    job = submit(sqlite_rig, fixture_entrypoint("numbered_lines.py", str(3 * MiB)),
                 {"log_limit": "1MiB"})
    trial = sqlite_rig.run_to_end(job)

    assert trial.state == "SUCCEEDED", trial.message
    check = checks(sqlite_rig, job.trial_id)["log_complete"]
    assert check["status"] == "warning"
    assert check["detail"].startswith("warning: rank 0's log reached resources.log_limit "
                                      "(1 MiB): ")
    files = rank_files(sqlite_rig, job.trial_id)
    log = sqlite_rig.supervisor.launcher.log(files.attempt_dir, 0)
    shown = b"".join(sqlite_rig.supervisor.launcher.log_iter(files.attempt_dir, 0))
    assert shown.startswith(b"line 000000000000\n") and shown.endswith(b"done\n")
    assert b"\0" not in shown and log.drops().dropped > 0


def test_the_cluster_default_limits_a_trial_that_sets_none(store: Store, home: Home) -> None:
    """The cluster config's log_limit reaches every replica's spec when the experiment sets
    none; an experiment's `off` wins over it."""
    rig = Rig(store, home, Supervisor(store, LocalLauncher(), home,
                                      LocalPlacement(store, slots=4), min_free_disk=0,
                                      log_limit=2 * MiB), first_admin(store, home))
    limited = submit(rig, fixture_entrypoint("exit0.sh"))
    unlimited = submit(rig, fixture_entrypoint("exit0.sh"), {"log_limit": "off"})
    rig.run_to_end(limited)
    rig.run_to_end(unlimited)
    specs = [json.loads(rank_files(rig, job.trial_id).spec.read_text())
             for job in (limited, unlimited)]
    assert [spec["log_limit"] for spec in specs] == [2 * MiB, None]
    assert checks(rig, limited.trial_id)["log_complete"]["status"] == "passed"
