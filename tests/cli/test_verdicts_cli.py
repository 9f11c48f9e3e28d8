"""Each trial's verdict, said everywhere the CLI shows a trial, in the server's words: after
`--wait`/`--follow` (and `--require-verified`'s exit 3), `experiment list`/`describe`,
`trial list`/`describe`, and in the JSON contract (`verified`, `verdict`, `verdicts`).

Three real runs against a real server: the harness example that declares its length and
saves checkpoints (verified), a plain script that exits 0 (nothing to check: not
verified), and the harness example that never saves (SUSPECT: no checkpoint)."""

from __future__ import annotations

import json
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.cli.test_cli import on
from tests.server.experiments import make_context, write_context
from tests.servers import RunningServer

pytestmark = [pytest.mark.lifecycle, pytest.mark.timeout(240)]

EPOCHS = 2  # harness_train.py's default


@dataclass(frozen=True)
class Run:
    done: subprocess.CompletedProcess[str]  # `experiment create ... --json`
    exp: dict[str, Any]

    @property
    def trial(self) -> dict[str, Any]:
        (only,) = self.exp["trials"]
        return dict(only)


def create(server: RunningServer, context: Path, *flags: str) -> Run:
    """`experiment create` as a person runs it (no --json); the experiment as it ended."""
    done = on(server, "experiment", "create", str(context / "experiment.yaml"), str(context),
              *flags)
    found = re.search(r"^created experiment (\d+) ", done.stderr, re.MULTILINE)
    assert found is not None, done.stderr
    described = on(server, "experiment", "describe", found[1], "--json")
    return Run(done, json.loads(described.stdout))


def with_verify(context: Path, verify: dict[str, Any]) -> Path:
    config = yaml.safe_load((context / "experiment.yaml").read_text())
    (context / "experiment.yaml").write_text(yaml.safe_dump({**config, "verify": verify}))
    return context


@pytest.fixture(scope="module")
def runs(server: RunningServer, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Run]:
    """The three runs, each waited for with --require-verified (the SUSPECT one followed)."""
    tmp = tmp_path_factory.mktemp("verdicts")
    verified = with_verify(make_context(tmp, "harness_train.py"),
                           {"expected_length": {"epochs": EPOCHS}})
    plain = write_context(tmp, ["python", "train.py"], files={"train.py": "print('done')\n"})
    suspect = make_context(tmp, "harness_train.py", "--no-checkpoint")
    return {"verified": create(server, verified, "--wait", "--require-verified"),
            "plain": create(server, plain, "--wait", "--require-verified"),
            "suspect": create(server, suspect, "--follow", "--require-verified")}


def test_the_json_contract_has_verified_and_a_verdict(runs: dict[str, Run]) -> None:
    verified, plain, suspect = (runs[name].trial for name in ("verified", "plain", "suspect"))
    assert (verified["state"], verified["verified"], verified["verdict"]) == (
        "SUCCEEDED", True, "verified"), verified["verification"]
    assert (plain["state"], plain["verified"]) == ("SUCCEEDED", False)
    assert plain["verdict"].startswith("exit 0 — not verified: ")
    assert (suspect["state"], suspect["verified"]) == ("SUSPECT", False)
    assert suspect["verdict"].startswith("SUSPECT: ") and "checkpoint: " in suspect["verdict"]
    assert runs["plain"].exp["verdicts"] == {"verified": 0, "not_verified": 1, "suspect": 0}
    assert runs["verified"].exp["verdicts"] == {"verified": 1, "not_verified": 0, "suspect": 0}
    assert runs["suspect"].exp["verdicts"] == {"verified": 0, "not_verified": 0, "suspect": 1}


def test_wait_and_follow_say_each_verdict_and_require_verified_exits_3(
    runs: dict[str, Run]
) -> None:
    verified, plain, suspect = (runs[name] for name in ("verified", "plain", "suspect"))
    assert verified.done.returncode == 0, verified.done.stderr
    assert f"trial {verified.trial['id']}: verified\n" in verified.done.stderr
    assert (f"experiment {verified.exp['id']} ended COMPLETED: 1 verified, 0 not verified, "
            "0 SUSPECT") in verified.done.stderr
    # It succeeded, and was not verified: 3, and it says why.
    assert plain.done.returncode == 3, plain.done.stderr
    assert f"trial {plain.trial['id']}: {plain.trial['verdict']}\n" in plain.done.stderr
    assert "not every SUCCEEDED trial was verified (--require-verified)" in plain.done.stderr
    # A SUSPECT trial is not a success: 1, as without --require-verified.
    assert suspect.done.returncode == 1, suspect.done.stderr
    assert f"trial {suspect.trial['id']}: SUSPECT: " in suspect.done.stderr
    assert "0 verified, 0 not verified, 1 SUSPECT" in suspect.done.stderr


def test_without_require_verified_the_exit_codes_are_as_before(
    server: RunningServer, tmp_path: Path
) -> None:
    plain = write_context(tmp_path, ["python", "train.py"], files={"train.py": "pass\n"})
    for flag in ("--wait", "--follow"):
        run = create(server, plain, flag)
        assert run.done.returncode == 0, (flag, run.done.stderr)
        assert run.trial["verified"] is False
        assert f"trial {run.trial['id']}: exit 0 — not verified: " in run.done.stderr
    strict = on(server, "experiment", "create", str(plain / "experiment.yaml"), str(plain),
                "--wait", "--json", "--require-verified")
    assert strict.returncode == 3, strict.stderr
    assert json.loads(strict.stdout)["trials"][0]["verified"] is False  # stdout: JSON alone


def test_describe_and_list_show_the_same_words(server: RunningServer,
                                               runs: dict[str, Run]) -> None:
    for run in runs.values():
        exp_id, trial = str(run.exp["id"]), run.trial
        described = json.loads(on(server, "experiment", "describe", exp_id, "--json").stdout)
        (shown,) = described["trials"]
        assert (shown["verified"], shown["verdict"]) == (trial["verified"], trial["verdict"])
        (listed,) = json.loads(on(server, "trial", "list", exp_id, "--json").stdout)
        assert (listed["verified"], listed["verdict"]) == (trial["verified"], trial["verdict"])
        human = on(server, "trial", "describe", str(trial["id"]))
        assert f"verdict: {trial['verdict']}" in human.stdout, human.stdout
        table = on(server, "trial", "list", exp_id)
        assert trial["verdict"][:40] in table.stdout, table.stdout
        header = on(server, "experiment", "describe", exp_id).stdout.splitlines()[0]
        counts = run.exp["verdicts"]
        assert header.endswith(f"trials: {counts['verified']} verified, "
                               f"{counts['not_verified']} not verified, "
                               f"{counts['suspect']} SUSPECT"), header


def test_trial_describe_shows_each_check_with_its_status(server: RunningServer,
                                                         runs: dict[str, Run]) -> None:
    suspect = runs["suspect"].trial
    text = on(server, "trial", "describe", str(suspect["id"])).stdout
    assert "Verification: SUSPECT: " in text
    assert "Verification: passed" not in text and "Verification: failed" not in text
    rows = {line.split("│")[1].strip(): line.split("│")[2].strip()
            for line in text.splitlines() if line.count("│") >= 4}
    statuses = {c["name"]: c.get("status") or ("passed" if c["passed"] else "failed")
                for c in suspect["verification"]["checks"]}
    assert rows["checkpoint"] == "failed"
    for name, status in statuses.items():
        assert rows[name] == status.replace("_", " "), (name, rows)


def test_experiment_list_counts_verdicts(server: RunningServer, runs: dict[str, Run]) -> None:
    listed = {e["id"]: e for e in json.loads(on(server, "experiment", "list", "--json").stdout)}
    for run in runs.values():
        assert listed[run.exp["id"]]["verdicts"] == run.exp["verdicts"]
    table = on(server, "experiment", "list").stdout
    rows = {line.split("│")[1].strip(): line for line in table.splitlines() if "│" in line}
    assert "1 verified" in rows[str(runs["verified"].exp["id"])]
    assert "1 not verified" in rows[str(runs["plain"].exp["id"])]
    assert "1 SUSPECT" in rows[str(runs["suspect"].exp["id"])]
