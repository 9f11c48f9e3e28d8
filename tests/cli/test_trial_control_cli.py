"""`muster trial kill | pause | activate | restart ID` against a real server, and their
routes' refusals (issue 36, deliverable 4): a real process paused, activated, restarted and
killed from the command line, each request recorded with its actor; a viewer's 403, an
ended trial's 409 that says what can be done, a missing trial's 404."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from muster.client import Client
from tests.cli.test_cli import assert_clean_failure, on
from tests.server.experiments import only_trial, wait_trial, write_context
from tests.servers import RunningServer
from tests.waiting import wait_until

pytestmark = [pytest.mark.lifecycle, pytest.mark.timeout(240)]

WAIT_FOR = ("import os, sys, time\nwhile not os.path.exists(sys.argv[1]):\n"
            "    time.sleep(0.1)\nprint('done')\n")


def _trial(client: Client, tmp_path: Path) -> dict[str, Any]:
    """A running trial of a plain script that waits for `go` (in tmp_path)."""
    context = write_context(tmp_path, ["python", "wait_for.py", str(tmp_path / "go")],
                            files={"wait_for.py": WAIT_FOR}, name="trial-control",
                            failure_policy={"stop_grace": 2.0})
    exp = client.create_experiment((context / "experiment.yaml").read_text(), context)
    return wait_trial(client, only_trial(exp)["id"], {"RUNNING"}, timeout=60)


def test_the_four_controls_from_the_command_line(server: RunningServer, client: Client,
                                                 tmp_path: Path) -> None:
    trial_id = str(_trial(client, tmp_path)["id"])

    paused = on(server, "trial", "pause", trial_id)
    assert paused.returncode == 0, paused.stderr
    assert paused.stdout.startswith(f"trial {trial_id}: RUNNING; pausing: it stops")
    wait_trial(client, int(trial_id), {"PAUSED"}, timeout=60)
    assert on(server, "trial", "pause", trial_id).stdout.strip() == f"trial {trial_id}: PAUSED"

    activated = on(server, "trial", "activate", trial_id, "--json")
    assert json.loads(activated.stdout)["state"] in ("QUEUED", "STARTING", "RUNNING")
    wait_trial(client, int(trial_id), {"RUNNING"}, timeout=60)

    restarted = on(server, "trial", "restart", trial_id)
    assert restarted.stdout.startswith(f"trial {trial_id}: RUNNING; restarting: it stops")
    wait_until(lambda: len((t := client.get_trial(int(trial_id)))["attempts"]) == 3
               and t["state"] == "RUNNING", timeout=60, what="attempt 3")

    killed = on(server, "trial", "kill", trial_id)
    assert killed.stdout.startswith(f"trial {trial_id}: RUNNING; kill requested")
    trial = wait_trial(client, int(trial_id), {"CANCELED"}, timeout=60)
    assert [a["reason"] for a in trial["attempts"]] == ["STOPPED", "STOPPED", "STOPPED"]
    asked = [(e["reason"], e["actor"]) for e in trial["events"] if e["reason"].endswith(
        "requested") or e["reason"] == "activated"]
    assert asked == [("pause requested", "admin"), ("activated", "admin"),
                     ("restart requested", "admin"), ("kill requested", "admin")]
    # Its experiment had one trial, and it was killed: CANCELED.
    wait_until(lambda: client.get_experiment(trial["experiment_id"])["state"] == "CANCELED",
               timeout=30, what="the experiment to end CANCELED")

    again = assert_clean_failure(on(server, "trial", "restart", trial_id))
    assert (f"trial {trial_id} is already CANCELED; an ended trial cannot be restarted (a new "
            f"experiment can start from its checkpoint: searcher.source_trial_id: {trial_id})"
            ) in again


def test_the_routes_refuse_with_the_right_status(server: RunningServer, client: Client,
                                                 tmp_path: Path) -> None:
    trial = _trial(client, tmp_path)
    vera = client.create_user("vera-trials", "viewer")["token"]
    for action in ("kill", "pause", "activate", "restart"):
        url = f"{server.url}/api/v1/trials/{trial['id']}/{action}"
        refused = httpx.post(url, headers={"Authorization": f"Bearer {vera}"}, timeout=30)
        assert refused.status_code == 403, refused.text
        missing = httpx.post(f"{server.url}/api/v1/trials/999999/{action}", timeout=30,
                             headers={"Authorization": f"Bearer {server.token}"})
        assert missing.status_code == 404, missing.text
        assert "trial 999999 does not exist" in missing.text
    assert client.get_trial(trial["id"])["state"] == "RUNNING"  # nothing was done
    (tmp_path / "go").touch()
    wait_trial(client, trial["id"], {"SUCCEEDED"}, timeout=60)
    ended = httpx.post(f"{server.url}/api/v1/trials/{trial['id']}/kill", timeout=30,
                       headers={"Authorization": f"Bearer {server.token}"})
    assert ended.status_code == 409
    assert (f"trial {trial['id']} is already SUCCEEDED; an ended trial cannot be killed"
            in ended.text)
