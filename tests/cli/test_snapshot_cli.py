"""Snapshots on the command line, as real subprocesses against a real server: `muster trial
describe` (`snapshot` in --json, a short section without), `muster experiment describe
--json`, and `muster experiment diff A B [--json]`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from muster.client import Client
from tests.cli.test_cli import assert_clean_failure, on
from tests.server.test_experiment_diff import submit
from tests.servers import RunningServer

pytestmark = pytest.mark.lifecycle  # starts real processes


def as_json(server: RunningServer, *args: str) -> Any:
    done = on(server, *args, "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_describe_json_has_the_snapshot_and_the_table_a_section(
        server: RunningServer, client: Client, tmp_path: Path) -> None:
    exp = submit(client, tmp_path / "ctx", hyperparameters={"lr": 0.01, "model": {"d": 64}},
                 reproducibility={"experiment_seed": 7})
    trial_id = exp["trials"][0]["id"]
    part = as_json(server, "trial", "describe", str(trial_id))["snapshot"]
    assert part == client.trial_snapshot(trial_id)["trial"]
    assert part["hparams"] == {"lr": 0.01, "model": {"d": 64}}
    tree = part["code"]["tree_sha256"]
    assert len(tree) == 64
    described = as_json(server, "experiment", "describe", str(exp["id"]))
    assert [t["snapshot"] for t in described["trials"]] == [part]

    done = on(server, "trial", "describe", str(trial_id))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    start = lines.index(f"snapshot (`muster trial diff {trial_id} OTHER` compares two):")
    assert lines[start + 1:start + 5] == [
        f"  code: tree {tree[:12]} (1 file), no git state",
        f"  seed: {part['seed']}",
        f"  environment: the base interpreter, "
        f"{len(part['environment']['packages']):,} packages",
        "  data: no data manifest"]


def test_experiment_diff_names_the_trials_and_the_field(
        server: RunningServer, client: Client, tmp_path: Path) -> None:
    a = submit(client, tmp_path / "ctx", hyperparameters={"lr": 0.01})
    b = submit(client, tmp_path / "ctx", hyperparameters={"lr": 0.02})
    ta, tb = a["trials"][0]["id"], b["trials"][0]["id"]
    found = as_json(server, "experiment", "diff", str(a["id"]), str(b["id"]))
    assert found == {
        "a_trial": ta, "a_basis": "latest", "b_trial": tb, "b_basis": "latest",
        "differences": [{"group": "config", "field": "hparams.lr", "a": 0.01, "b": 0.02,
                         "rank": None}],
        "lines": ["lr: 0.01 vs 0.02"]}
    done = on(server, "experiment", "diff", str(a["id"]), str(b["id"]))
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        f"experiment {a['id']}: trial {ta}, its latest trial",
        f"experiment {b['id']}: trial {tb}, its latest trial",
        "config:",
        "  lr: 0.01 vs 0.02"]
    same = on(server, "experiment", "diff", str(a["id"]), str(a["id"]))
    assert same.stdout.splitlines()[-1] == (
        f"experiments {a['id']} and {a['id']}: no difference in what they were made of")


def test_experiment_diff_of_an_unknown_experiment_is_one_error_line(
        server: RunningServer, client: Client, tmp_path: Path) -> None:
    exp = submit(client, tmp_path / "ctx")["id"]
    stderr = assert_clean_failure(on(server, "experiment", "diff", str(exp), "99999"))
    assert "experiment 99999 does not exist" in stderr
