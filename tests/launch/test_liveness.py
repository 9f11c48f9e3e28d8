"""When a replica ended, as muster may trust it (issue 30, item 8), with real shims: a lost
replica is dated by its shim's liveness stamp, not by when muster noticed the loss; and an
exit record is not trusted before its log shows every byte the record counts."""

from __future__ import annotations

import json
import logging
import os
import signal
from pathlib import Path

import pytest

from muster.launch.identity import is_alive, send_signal
from muster.launch.shim_launcher import LOG_WAIT_S
from muster.states import ReplicaPhase
from tests.launch.conftest import SubmitFn
from tests.waiting import wait_until

pytestmark = pytest.mark.lifecycle  # starts real processes


def test_a_lost_replica_is_dated_by_its_shims_liveness_stamp(
    submit: SubmitFn, tmp_path: Path
) -> None:
    replica = submit("wait_for_file.py", str(tmp_path / "never"))
    child = replica.child()
    stamp = replica.files.alive
    wait_until(stamp.exists, timeout=30, what="the liveness stamp")
    first = stamp.stat().st_mtime
    # Kept fresh while the shim runs.
    wait_until(lambda: stamp.stat().st_mtime > first, timeout=30, what="a fresher stamp")
    shim = replica.describe().shim
    assert shim is not None
    assert send_signal(shim, signal.SIGKILL)
    os.killpg(child.pid, signal.SIGKILL)
    wait_until(lambda: not is_alive(shim) and not is_alive(child), timeout=30,
               what="the shim and its child to die")
    last = stamp.stat().st_mtime
    status = replica.describe()
    assert status.phase is ReplicaPhase.LOST
    # Its last sign of life, however long after it muster looks.
    assert status.lost_at == last
    assert status.started_at is not None and status.started_at <= last


def test_a_replica_lost_before_its_first_stamp_is_dated_by_its_start(
    submit: SubmitFn, tmp_path: Path
) -> None:
    replica = submit("wait_for_file.py", str(tmp_path / "never"))
    child = replica.child()
    shim = replica.describe().shim
    assert shim is not None
    assert send_signal(shim, signal.SIGKILL)
    os.killpg(child.pid, signal.SIGKILL)
    wait_until(lambda: not is_alive(shim) and not is_alive(child), timeout=30,
               what="the shim and its child to die")
    replica.files.alive.unlink(missing_ok=True)  # as if it died before stamping
    status = replica.describe()
    assert status.phase is ReplicaPhase.LOST
    assert status.lost_at == status.started_at


def test_an_exit_record_waits_for_its_logs_last_bytes(
    submit: SubmitFn, caplog: pytest.LogCaptureFixture
) -> None:
    replica = submit("exit0.sh")
    record = replica.wait_exit()
    log = replica.files.log
    whole = log.read_bytes()
    assert record.log_bytes == len(whole) > 4
    # What a shared file system that shows the record before the log's last bytes gives.
    log.write_bytes(whole[:-4])
    status = replica.describe()
    assert (status.phase, status.exit) == (ReplicaPhase.RUNNING, None)
    log.write_bytes(whole)  # the bytes arrive
    assert replica.describe().phase is ReplicaPhase.EXITED

    # Bytes that never arrive: the record is trusted once LOG_WAIT_S have passed since the
    # replica's end, and the shortfall is logged.
    log.write_bytes(whole[:-4])
    data = json.loads(replica.files.exit.read_text())
    replica.files.exit.write_text(json.dumps({**data,
                                              "ended_at": data["ended_at"] - LOG_WAIT_S}))
    with caplog.at_level(logging.WARNING, logger="muster.launch.local"):
        status = replica.describe()
    assert status.phase is ReplicaPhase.EXITED and status.exit is not None
    assert f"holds {len(whole) - 4} of the {len(whole)} bytes" in caplog.text


def test_an_exit_record_whose_log_was_swapped_for_a_link_is_trusted_at_once(
    submit: SubmitFn, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A job that replaced its log with a link (which muster never follows) gets no wait:
    the bytes can never show up; a log not there at all is still waited for."""
    replica = submit("exit0.sh")
    replica.wait_exit()
    log = replica.files.log
    log.unlink()
    status = replica.describe()
    assert (status.phase, status.exit) == (ReplicaPhase.RUNNING, None)  # not there yet
    secret = tmp_path / "secret"
    secret.write_bytes(b"x" * 4096)
    log.symlink_to(secret)
    with caplog.at_level(logging.WARNING, logger="muster.launch.local"):
        status = replica.describe()
    assert status.phase is ReplicaPhase.EXITED and status.exit is not None
    assert "is not a regular file (a link, or a directory" in caplog.text
