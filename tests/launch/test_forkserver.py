"""Shims forked by the fork server are shims like the ones started as new interpreters: own
session, the same records, cancellable from the first moment; and they outlive the fork
server, which comes back on its own after it died."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from muster.launch import forkserver
from muster.launch.base import ReplicaSpec
from muster.launch.identity import is_alive, read_stat
from muster.launch.local import LocalLauncher
from muster.states import ReplicaPhase
from tests.launch.conftest import Replica, fixture_argv, kill_leftovers
from tests.waiting import wait_until

pytestmark = [pytest.mark.lifecycle, pytest.mark.timeout(120)]


@pytest.fixture(params=["forked", "new interpreter"])
def mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "new interpreter":
        monkeypatch.setenv(forkserver.ENV_SWITCH, "0")
    return str(request.param)


@pytest.fixture
def start(make_spec: Callable[..., ReplicaSpec], tmp_path: Path
          ) -> Iterator[Callable[..., Replica]]:
    launcher = LocalLauncher()

    def started(name: str, *args: str) -> Replica:
        spec = make_spec(fixture_argv(name, *args), stop_grace=2.0)
        launcher.submit(spec)
        return Replica(launcher, spec)

    yield started
    kill_leftovers(tmp_path)


def test_a_shim_records_its_exit_and_is_reaped_either_way(mode: str, start: Callable[..., Replica]
                                                  ) -> None:
    replica = start("exit0.sh")
    record = replica.wait_exit()
    assert (record.exit_code, replica.log()) == (0, b"hello from exit0\n")
    status = replica.describe()
    assert status.phase is ReplicaPhase.EXITED and status.shim is not None
    shim = status.shim

    def reaped() -> bool:  # no zombie shim is left behind by either parent
        replica.describe()  # (the launcher reaps the shims it started itself)
        stat = read_stat(shim.pid)
        return stat is None or stat.start_ticks != shim.start_ticks

    wait_until(reaped, timeout=10, what="the ended shim to be reaped")


def test_a_cancel_at_once_after_the_launch_is_not_lost(
        mode: str, start: Callable[..., Replica]) -> None:
    replica = start("wait_for_file.py", "/nonexistent/never")
    replica.cancel()  # the shim may still be starting: SIGTERM waits, blocked, for it
    record = replica.wait_exit()
    assert record.stop_requested


def test_forked_shims_live_on_when_the_fork_server_is_killed(
        start: Callable[..., Replica], tmp_path: Path) -> None:
    server = forkserver.shared()
    assert server is not None
    release = tmp_path / "release"
    first = start("wait_for_file.py", str(release))
    first.child()  # the shim has set up its session and started its child
    shim = first.describe().shim
    assert shim is not None
    stat = read_stat(shim.pid)
    assert stat is not None and stat.session == shim.pid  # its own session
    fork_server_pid = _parent_pid(shim.pid)
    assert fork_server_pid != os.getpid()
    os.kill(fork_server_pid, signal.SIGKILL)
    wait_until(lambda: read_stat(fork_server_pid) is None
               or read_stat(fork_server_pid).is_dead, timeout=10, what="the fork server to die")
    assert is_alive(shim)
    second = start("exit0.sh")  # a new fork server starts
    assert second.wait_exit().exit_code == 0
    second_shim = wait_until(lambda: second.describe().shim, timeout=5, what="second shim")
    assert second_shim.pid != shim.pid
    release.touch()
    assert first.wait_exit().exit_code == 0


def _parent_pid(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[1])


def test_a_fork_server_that_dies_before_it_answers_is_not_retried_elsewhere(
        tmp_path: Path) -> None:
    """After the request went out a shim may exist: the caller must not start a second one."""
    mute = forkserver.ForkServer([sys.executable, "-c", "import sys; sys.stdin.readline()"])
    with pytest.raises(forkserver.ForkServerError, match="it exited") as info:
        mute.start_shim(tmp_path / "spec.json", tmp_path, tmp_path / "shim.log")
    assert info.value.asked
    missing = forkserver.ForkServer([str(tmp_path / "no-such-python")])
    with pytest.raises(forkserver.ForkServerError, match="could not start") as info:
        missing.start_shim(tmp_path / "spec.json", tmp_path, tmp_path / "shim.log")
    assert not info.value.asked  # nothing was asked: starting the shim otherwise is safe
