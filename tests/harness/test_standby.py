"""A warm standby's wait in init(): it blocks until the go file exists, then takes the
final environment from it; a process that is not a standby never waits."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from muster.atomic import atomic_write_json
from muster.harness.standby import wait_for_promotion
from muster.jobenv import STANDBY_GO


def test_not_a_standby_returns_at_once() -> None:
    environ = {"MUSTER_ATTEMPT": "2"}
    assert wait_for_promotion(environ) is False
    assert environ == {"MUSTER_ATTEMPT": "2"}


def test_a_standby_waits_for_its_go_file_and_takes_its_environment(tmp_path: Path) -> None:
    go = tmp_path / "rank-0.standby-go.json"
    environ = {STANDBY_GO: str(go), "MUSTER_LATEST_CHECKPOINT": "/stale", "KEEP": "1"}
    promoted = threading.Event()

    def wait() -> None:
        wait_for_promotion(environ)
        promoted.set()

    waiter = threading.Thread(target=wait, daemon=True)
    waiter.start()
    time.sleep(0.2)  # it is waiting: nothing has been written yet
    assert not promoted.is_set()
    # As muster writes it: whole, under its name at once (a plain write could be read
    # empty by the waiting thread, which is not a go file).
    atomic_write_json(go, {"env": {"MUSTER_LATEST_CHECKPOINT": "/ckpt/step-5", "NEW": 3}})
    assert promoted.wait(10)
    assert environ == {"MUSTER_LATEST_CHECKPOINT": "/ckpt/step-5", "NEW": "3", "KEEP": "1"}


def test_null_removes_a_variable(tmp_path: Path) -> None:
    go = tmp_path / "go.json"
    go.write_text(json.dumps({"env": {"MUSTER_LATEST_CHECKPOINT": None}}))
    environ = {STANDBY_GO: str(go), "MUSTER_LATEST_CHECKPOINT": "/stale"}
    assert wait_for_promotion(environ) is True
    assert environ == {}


def test_a_go_file_that_is_not_muster_s_is_refused(tmp_path: Path) -> None:
    go = tmp_path / "go.json"
    go.write_text("[1, 2]")
    with pytest.raises(ValueError, match="has no 'env' object"):
        wait_for_promotion({STANDBY_GO: str(go)})
