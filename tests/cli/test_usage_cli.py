"""`muster usage` against a real server (issue 36, deliverable 6): `--json` is the contract
outside tools read (`[{key, slot_hours, gpu_hours, productive_hours, lost_hours,
stalled_hours, queued_hours, goodput}]`), its numbers are those computed here from the
trial's records as the API serves them; the table ends with the total; bad input is a
clean error that says what to write."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import httpx
import pytest

from muster.client import Client
from tests.cli.test_cli import assert_clean_failure, on
from tests.server.experiments import only_trial, wait_trial, write_context
from tests.servers import RunningServer

pytestmark = [pytest.mark.lifecycle, pytest.mark.timeout(180)]

CONTRACT = {"key", "slot_hours", "gpu_hours", "productive_hours", "lost_hours",
            "stalled_hours", "queued_hours", "goodput"}
WORK = "import time\nprint('working', flush=True)\ntime.sleep(0.5)\nprint('done')\n"


def hand_computed(trial: Mapping[str, Any]) -> dict[str, float]:
    """One SUCCEEDED attempt: productive from its start to its end; queued from the trial's
    creation to its first move (STARTING), idle while STARTING (until RUNNING)."""
    [attempt] = trial["attempts"]
    moves = [(e["at"], e["to_state"]) for e in trial["events"]
             if e["entity"] == "trial" and e["to_state"]]
    assert [state for _, state in moves] == ["STARTING", "RUNNING", "SUCCEEDED"]
    productive = attempt["ended_at"] - attempt["started_at"]
    idle = moves[1][0] - moves[0][0]
    return {"productive_hours": productive / 3600, "lost_hours": 0.0, "stalled_hours": 0.0,
            "queued_hours": (moves[0][0] - trial["created_at"]) / 3600,
            "slot_hours": (productive + idle) / 3600, "gpu_hours": 0.0,
            "goodput": productive / (productive + idle)}


def test_usage_json_is_the_contract_with_the_hand_computed_numbers(
        server: RunningServer, client: Client, tmp_path: Path) -> None:
    context = write_context(tmp_path, ["python", "work.py"], files={"work.py": WORK},
                            name="usage-cli")
    exp = client.create_experiment((context / "experiment.yaml").read_text(), context)
    trial = wait_trial(client, only_trial(dict(exp))["id"], {"SUCCEEDED"}, timeout=120)

    done = on(server, "usage", "--by", "experiment", "--since", "2h", "--json")
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)
    assert isinstance(rows, list) and all(set(row) >= CONTRACT for row in rows)
    [row] = [row for row in rows if row["key"] == str(exp["id"])]
    for key, value in hand_computed(client.get_trial(trial["id"])).items():
        # Within float rounding: Unix times are doubles good to ~2.4e-7 s.
        assert row[key] == pytest.approx(value, rel=1e-9,
                                         abs=1e-6 if key == "goodput" else 1e-9), key
    assert (row["name"], row["trials"], row["attempts"]) == ("usage-cli", 1, 1)

    table = on(server, "usage")  # by user; the admin's default: everyone's
    assert table.returncode == 0, table.stderr
    cells = [[cell.strip() for cell in line.split("│")[1:-1]]
             for line in table.stdout.splitlines() if line.startswith("│")]
    assert [row[0] for row in cells] == ["admin", "total"], table.stdout
    assert cells[0][1:] == cells[1][1:]  # one user: its row is the total
    assert "everyone's experiments" in table.stdout


def test_bad_input_is_a_clean_error_that_says_what_to_write(
        server: RunningServer, client: Client) -> None:
    too_far = assert_clean_failure(on(server, "usage", "--since", "500d"))
    assert "since must be more than 0 and at most 400d" in too_far
    not_a_duration = assert_clean_failure(on(server, "usage", "--since", "a while"))
    assert "since must look like '30s'" in not_a_duration
    nobody = assert_clean_failure(on(server, "usage", "--user", "nobody"))
    assert "user 'nobody' does not exist" in nobody
    both = assert_clean_failure(on(server, "usage", "--user", "admin", "--all"))
    assert "give either user" in both
    by = on(server, "usage", "--by", "team")
    assert by.returncode == 2 and "Invalid value for '--by'" in by.stderr
    assert "Traceback" not in by.stderr

    url = f"{server.url}/api/v1/usage"
    headers = {"Authorization": f"Bearer {server.token}"}
    assert httpx.get(url, params={"since": "401d"}, headers=headers,
                     timeout=30).status_code == 400
    assert httpx.get(url, params={"by": "team"}, headers=headers, timeout=30).status_code == 422
    assert httpx.get(url, params={"since": "x" * 17}, headers=headers,
                     timeout=30).status_code == 422
    assert httpx.get(url, timeout=30).status_code == 401
