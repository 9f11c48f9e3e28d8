"""A real server whose polling pass runs only every 10 minutes still follows its trials
at once: the check-in, the metrics, the start and the end come as events (inotify on the
attempt directory, the shim's signal), and a data scan's end by its pidfd. Every wait below
is far shorter than the safety net, so a missed event fails the test."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from muster.client import Client
from muster.server.orchestrator import TICK_SECONDS
from tests.server.experiments import FIXTURES, only_trial, wait_trial
from tests.servers import RunningServer, serving
from tests.waiting import wait_until

pytestmark = [pytest.mark.lifecycle, pytest.mark.timeout(240)]

SAFETY_NET = 600.0
WAIT = 60.0  # every wait: a tenth of the safety net


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """One server for the module, its polling pass every 10 minutes."""
    home = tmp_path_factory.mktemp("wakeups") / "home"
    with serving(home, env={"MUSTER_SAFETY_NET_SECONDS": str(SAFETY_NET)}) as running:
        yield running


def context(parent: Path, config: dict[str, Any], fixture: str) -> Path:
    made = parent / "context"
    made.mkdir()
    shutil.copy2(FIXTURES / fixture, made / fixture)
    (made / "experiment.yaml").write_text(json.dumps(config, indent=2) + "\n")
    return made


def submit(client: Client, made: Path) -> int:
    exp = client.create_experiment((made / "experiment.yaml").read_text(), made)
    return int(only_trial(exp)["id"])


def test_the_server_polls_only_as_a_safety_net(client: Client, server: RunningServer) -> None:
    supervisor = client.health()["supervisor"]
    said = [line for line in (server.home / "server.log").read_text().splitlines()
            if "inotify" in line or "wake-ups" in line]
    assert (supervisor["wakeups"], supervisor["interval"]) == (True, SAFETY_NET), said


def test_check_in_metrics_and_end_are_noticed_without_polling(client: Client,
                                                              tmp_path: Path) -> None:
    release = tmp_path / "release"
    trial_id = submit(client, context(tmp_path, {
        "name": "wakeups", "entrypoint": ["python", "check_in.py"], "harness": True,
        "environment": {"variables": {"RELEASE": str(release)}},
        "verify": {"require_checkpoint": False}, "failure_policy": {"stop_grace": "2s"},
    }, "check_in.py"))
    # RUNNING waits for the check-in (harness: true): only its heartbeat's event tells.
    wait_trial(client, trial_id, {"RUNNING"}, timeout=WAIT)
    # The one training report, written after the check-in, read because its file changed.
    reported = wait_until(lambda: client.get_metrics(trial_id, kind="training"),
                          timeout=WAIT, what="the training report to be stored")
    assert [r["metrics"] for r in reported] == [{"loss": 0.5}]
    release.touch()
    trial = wait_trial(client, trial_id, {"SUCCEEDED", "FAILED", "SUSPECT", "CANCELED"},
                       timeout=WAIT)
    assert trial["state"] == "SUCCEEDED", trial["message"]


def test_a_data_scan_that_ends_starts_its_trial_without_polling(client: Client,
                                                                tmp_path: Path) -> None:
    made = context(tmp_path, {
        "name": "scanned", "entrypoint": ["sh", "exit0.sh"],
        "data": {"path": "data", "manifest": {"extensions": [".png"], "labels": "none"}},
        "verify": {"require_checkpoint": False},
    }, "exit0.sh")
    (made / "data").mkdir()
    for i in range(20):
        (made / "data" / f"{i}.png").write_bytes(b"\x89PNG %d" % i)
    trial_id = submit(client, made)
    trial = wait_trial(client, trial_id, {"SUCCEEDED", "FAILED", "SUSPECT", "CANCELED"},
                       timeout=WAIT)
    # It ran once its scan ended; it reports no samples, so its exit 0 is not trusted.
    assert trial["manifest"]["file_count"] == 20
    assert trial["state"] == "SUSPECT", trial["message"]
    assert "no samples were reported" in trial["message"]


def test_muster_wakeups_0_polls_every_tick(tmp_path: Path) -> None:
    with serving(tmp_path / "home", env={"MUSTER_WAKEUPS": "0"}) as polling, \
            polling.client() as client:
        supervisor = client.health()["supervisor"]
    assert (supervisor["wakeups"], supervisor["interval"]) == (False, TICK_SECONDS)


@pytest.mark.parametrize("value", ["abc", "nan"])
def test_a_bad_safety_net_is_refused_at_start_with_the_fix(tmp_path: Path, value: str) -> None:
    started = subprocess.run(
        [sys.executable, "-m", "muster", "up", "--home", str(tmp_path / "home"), "--port",
         "1"], env={**os.environ, "MUSTER_SAFETY_NET_SECONDS": value},
        capture_output=True, text=True, timeout=60)
    assert started.returncode != 0
    assert (f"error: MUSTER_SAFETY_NET_SECONDS must be seconds between 0.05 and 3600, got "
            f"{value!r}; unset it for the default 1") in started.stderr
    assert "Traceback" not in started.stderr
