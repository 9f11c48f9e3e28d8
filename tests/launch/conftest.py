"""Shared pieces of the launcher tests: real fixture scripts run under real shims."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from muster.atomic import read_json
from muster.launch.base import ExitRecord, ProcessIdentity, ReplicaSpec, ReplicaStatus
from muster.launch.identity import group_members, is_alive, send_signal
from muster.launch.local import LocalLauncher
from muster.rundir import RankFiles
from tests.waiting import wait_until

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


def fixture_argv(name: str, *args: str) -> list[str]:
    """The command for a fixture script: Python ones run on this interpreter, others directly."""
    path = str(FIXTURES / name)
    return [sys.executable, path, *args] if name.endswith(".py") else [path, *args]


@dataclass
class Replica:
    """One submitted replica, observed through a launcher (by default the one that started it)."""

    launcher: LocalLauncher
    spec: ReplicaSpec

    @property
    def files(self) -> RankFiles:
        return RankFiles(self.spec.attempt_dir, self.spec.rank)

    def describe(self, launcher: LocalLauncher | None = None) -> ReplicaStatus:
        return (launcher or self.launcher).describe(self.spec.attempt_dir, self.spec.rank)

    def cancel(self, launcher: LocalLauncher | None = None) -> None:
        (launcher or self.launcher).cancel(self.spec.attempt_dir, self.spec.rank)

    def log(self) -> bytes:
        return b"".join(self.launcher.log_iter(self.spec.attempt_dir, self.spec.rank))

    def wait_exit(self) -> ExitRecord:
        status = wait_until(lambda: self.describe().exit, timeout=60, what="the exit record")
        assert isinstance(status, ExitRecord)
        return status

    def wait_log(self, needle: bytes) -> None:
        wait_until(lambda: needle in self.log(), timeout=30, what=f"{needle!r} in the log")

    def child(self) -> ProcessIdentity:
        """The training process's identity, once the shim has published it."""
        child = wait_until(lambda: self.describe().child, timeout=30, what="the child identity")
        assert isinstance(child, ProcessIdentity)
        return child


SubmitFn = Callable[..., Replica]


@pytest.fixture
def launcher() -> LocalLauncher:
    return LocalLauncher()


@pytest.fixture
def make_spec(tmp_path: Path) -> Callable[..., ReplicaSpec]:
    counter = iter(range(1, 1000))

    def make(argv: list[str], stop_grace: float = 2.0, rank: int = 0) -> ReplicaSpec:
        attempt = next(counter)
        return ReplicaSpec(
            trial_uuid="trial-under-test",
            attempt=attempt,
            rank=rank,
            argv=argv,
            env=dict(os.environ),
            cwd=tmp_path,
            attempt_dir=tmp_path / f"attempt-{attempt}",
            stop_grace=stop_grace,
        )

    return make


@pytest.fixture
def submit(
    launcher: LocalLauncher, make_spec: Callable[..., ReplicaSpec], tmp_path: Path
) -> Iterator[SubmitFn]:
    """Start a fixture script under a shim; every process left at teardown is SIGKILLed."""

    def start(name: str, *args: str, stop_grace: float = 2.0) -> Replica:
        spec = make_spec(fixture_argv(name, *args), stop_grace=stop_grace)
        launcher.submit(spec)
        return Replica(launcher, spec)

    yield start
    kill_leftovers(tmp_path)


def kill_leftovers(root: Path) -> None:
    """SIGKILL every shim and training process group recorded under `root` that still lives."""
    for status_path in root.rglob("rank-*.shim.json"):
        status = read_json(status_path)
        if status is None:
            continue
        child = ProcessIdentity(status["child_pid"], status["child_start_ticks"])
        shim = ProcessIdentity(status["shim_pid"], status["shim_start_ticks"])
        send_signal(shim, signal.SIGKILL)
        if is_alive(child) or any(m.session == shim.pid for m in group_members(child.pid)):
            with contextlib.suppress(ProcessLookupError):  # it emptied after the check
                os.killpg(child.pid, signal.SIGKILL)
    for launch_path in root.rglob("rank-*.launch.json"):
        launch = read_json(launch_path)
        if launch is None:
            continue
        send_signal(ProcessIdentity(launch["shim_pid"], launch["shim_start_ticks"]), signal.SIGKILL)
