"""The headline fault test: SIGKILL the real server mid-run and start it again.

A trial's shim outlives the server, so a restarted server must reattach to it (or finalise
it from its exit record, or find it lost and retry it) without losing a log line and without
launching the same attempt twice.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from muster.client import Client
from muster.launch.base import ProcessIdentity
from muster.launch.identity import is_alive, send_signal
from tests.processes import kill_home_processes, live_group
from tests.servers import RunningServer
from tests.waiting import wait_until

pytestmark = [pytest.mark.lifecycle, pytest.mark.timeout(180)]

COUNTER = Path(__file__).resolve().parents[1] / "fixtures" / "count_until_file.py"
ENDED = frozenset({"COMPLETED", "CANCELED", "ERROR"})
LINES_WHILE_DOWN = 25  # half a second of output written while no server runs


@pytest.fixture
def restartable(server_home: Path, db_url: str) -> Iterator[RunningServer]:
    """A real server on each database backend, to be killed and started again."""
    running = RunningServer(home=server_home, db_url=db_url)
    running.start()
    try:
        yield running
    finally:
        running.stop()
        kill_home_processes(server_home)


def _create_counter(client: Client, release: Path) -> tuple[int, int]:
    """An experiment printing a numbered line every 20 ms until `release` exists."""
    config = {
        "name": "restart",
        "entrypoint": [sys.executable, str(COUNTER), str(release)],
        "failure_policy": {"stop_grace": "1s"},
    }
    exp = client.create_experiment(yaml.safe_dump(config), None)
    return exp["id"], exp["trials"][0]["id"]


def _run_dir(client: Client, trial_id: int, number: int = 1) -> Path:
    def found() -> str | None:
        attempts = client.get_trial(trial_id)["attempts"]
        return attempts[number - 1]["run_dir"] if len(attempts) >= number else None

    run_dir = wait_until(found, timeout=30, what=f"attempt {number} of trial {trial_id}")
    assert run_dir is not None
    return Path(run_dir)


def _lines(log: Path) -> int:
    return log.read_bytes().count(b"\n") if log.exists() else 0


def _wait_lines(log: Path, at_least: int) -> int:
    count: int = wait_until(lambda: (n := _lines(log)) >= at_least and n, timeout=30,
                            what=f"{at_least} lines in {log}")
    return count


def _wait_ended(client: Client, experiment_id: int) -> dict[str, Any]:
    def ended() -> dict[str, Any] | None:
        exp = client.get_experiment(experiment_id)
        return exp if exp["state"] in ENDED else None

    exp = wait_until(ended, timeout=60, what=f"experiment {experiment_id} to end")
    assert exp is not None
    return exp


def _whole_log(client: Client, trial_id: int, attempt: int) -> bytes:
    """The attempt's log through the API, by byte cursor."""
    parts, offset = [], 0
    while piece := client.read_logs(trial_id, attempt=attempt, offset=offset).data:
        parts.append(piece)
        offset += len(piece)
    return b"".join(parts)


def _numbered(log: bytes, done: bool = True) -> int:
    """Check the log holds "line 0", "line 1", ... exactly once each and in order."""
    lines = log.decode().splitlines()
    if done:
        *lines, last = lines
        assert last == f"done after {len(lines)} lines"
    assert lines == [f"line {n}" for n in range(len(lines))]
    return len(lines)


def _reconciled(client: Client, trial_id: int) -> list[str]:
    return [e["message"] for e in client.get_trial(trial_id)["events"]
            if e["reason"] == "reconcile"]


def test_a_killed_server_reattaches_and_loses_no_line(
    restartable: RunningServer, tmp_path: Path
) -> None:
    release = tmp_path / "release"
    with restartable.client() as client:
        experiment_id, trial_id = _create_counter(client, release)
        run_dir = _run_dir(client, trial_id)
        log = run_dir / "rank-0.log"
        before = _wait_lines(log, 5)

    restartable.kill()
    _wait_lines(log, before + LINES_WHILE_DOWN)  # the trial goes on writing, unblocked
    restartable.start()

    with restartable.client() as client:
        wait_until(lambda: _reconciled(client, trial_id), timeout=30, what="the reconcile event")
        assert _reconciled(client, trial_id) == ["attempt 1 reattached to its running process"]
        _wait_lines(log, _lines(log) + LINES_WHILE_DOWN)  # and still writing after it
        release.touch()
        exp = _wait_ended(client, experiment_id)
        trial = exp["trials"][0]
        assert (exp["state"], trial["state"], trial["reason"]) == ("COMPLETED", "SUCCEEDED", "OK")
        assert [a["number"] for a in trial["attempts"]] == [1]  # no second launch
        assert sorted(p.name for p in run_dir.parent.glob("attempt-*") if p.is_dir()) == [
            "attempt-1"]  # (and attempt-1.outside.json beside it)
        assert (run_dir / "rank-0.shim.log").read_text().count("started pid") == 1
        whole = _whole_log(client, trial_id, 1)
    assert whole == log.read_bytes()
    assert _numbered(whole) >= before + LINES_WHILE_DOWN


def test_a_trial_that_ends_while_the_server_is_down_is_finalised(
    server: RunningServer, tmp_path: Path
) -> None:
    release = tmp_path / "release"
    with server.client() as client:
        experiment_id, trial_id = _create_counter(client, release)
        run_dir = _run_dir(client, trial_id)
        _wait_lines(run_dir / "rank-0.log", 5)

    server.kill()
    release.touch()
    wait_until((run_dir / "rank-0.exit.json").exists, timeout=30, what="the exit record")
    server.start()

    with server.client() as client:
        exp = _wait_ended(client, experiment_id)
        trial = exp["trials"][0]
        assert (exp["state"], trial["state"]) == ("COMPLETED", "SUCCEEDED")
        [attempt] = trial["attempts"]
        assert (attempt["state"], attempt["replicas"][0]["exit_code"]) == ("SUCCEEDED", 0)
        assert _reconciled(client, trial_id) == ["attempt 1 finalised from its exit record"]
        _numbered(_whole_log(client, trial_id, 1))


def _kill_shim_and_child(run_dir: Path) -> None:
    """SIGKILL the shim first (so it records nothing), then its training process group."""
    record = json.loads((run_dir / "rank-0.shim.json").read_text())
    shim = ProcessIdentity(record["shim_pid"], record["shim_start_ticks"])
    assert send_signal(shim, signal.SIGKILL)
    wait_until(lambda: not is_alive(shim), timeout=30, what="the shim to die")
    with contextlib.suppress(ProcessLookupError):  # it may have died of the broken pipe
        os.killpg(record["pgid"], signal.SIGKILL)
    wait_until(lambda: live_group(record["pgid"]) == [], timeout=30, what="the group to die")


def test_a_shim_killed_while_the_server_is_down_is_lost_and_retried(
    server: RunningServer, tmp_path: Path
) -> None:
    release = tmp_path / "release"
    with server.client() as client:
        experiment_id, trial_id = _create_counter(client, release)
        run_dir = _run_dir(client, trial_id)
        _wait_lines(run_dir / "rank-0.log", 5)

    server.kill()
    _kill_shim_and_child(run_dir)
    release.touch()  # so that the next attempt ends at once
    server.start()

    with server.client() as client:
        exp = _wait_ended(client, experiment_id)
        trial = exp["trials"][0]
        assert (exp["state"], trial["state"]) == ("COMPLETED", "SUCCEEDED")
        first, second = trial["attempts"]
        assert (first["state"], first["replicas"][0]["reason"]) == ("FAILED", "LOST")
        assert (second["state"], second["replicas"][0]["reason"]) == ("SUCCEEDED", "OK")
        assert not (run_dir / "rank-0.exit.json").exists()
        assert _reconciled(client, trial_id) == [
            "attempt 1 lost: no exit record and no live process with its identity"
        ]
        _numbered(_whole_log(client, trial_id, 1), done=False)  # what was written is kept
        assert _whole_log(client, trial_id, 2) == b"done after 0 lines\n"
