"""`muster drill` end to end: real servers, real experiments, real faults, read back.

The digits example (harness) is drilled with every fault this machine allows and must
catch each; a plain script (no harness, no integration) as a new user submits it is
drilled, its report names what it does not catch with advice, and the same script with
that advice applied (examples/plain-digits/experiment-counted.yaml) catches them.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from muster.atomic import read_json
from muster.client import Client
from muster.errors import Conflict, Forbidden, NotFound
from muster.home import Home
from muster.launch.identity import read_identity
from tests.servers import RunningServer, serving
from tests.waiting import wait_until

pytest.importorskip("torch", reason="the drills train the digits examples (torch)")
pytestmark = [pytest.mark.lifecycle, pytest.mark.timeout(900)]

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
DRILL_TIMEOUT = 800


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """One server for the module; the server-restart fault starts it again, so the one
    running at the end (server.json) is stopped too."""
    home = tmp_path_factory.mktemp("drills") / "home"
    with serving(home, options=["--min-free-disk", "0", "--slots", "2"]) as running:
        try:
            yield running
        finally:
            _stop_restarted(home, running)


def _stop_restarted(home: Path, running: RunningServer) -> None:
    found = read_json(Home(home).server_file)
    if not isinstance(found, dict) or running.proc is None or found["pid"] == running.proc.pid:
        return
    if read_identity(found["pid"]) is None:
        return
    os.kill(found["pid"], signal.SIGTERM)
    wait_until(lambda: read_identity(found["pid"]) is None, timeout=30,
               what="the restarted server to stop")


@pytest.fixture(scope="module")
def digits(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("digits") / "data"
    subprocess.run([sys.executable, str(EXAMPLES / "digits" / "prepare_data.py"), "--out",
                    str(out)], capture_output=True, timeout=120, check=True)
    return out


def context_of(example: str, digits: Path, tmp_path: Path) -> Path:
    context = tmp_path / example
    shutil.copytree(EXAMPLES / example, context, ignore=shutil.ignore_patterns("data"))
    shutil.copytree(digits, context / "data")
    return context


def drill(server: RunningServer, config: Path, context: Path, *options: str
          ) -> tuple[int, dict[str, Any]]:
    """`muster drill CONFIG CONTEXT OPTIONS --json`: its exit status and report."""
    done = subprocess.run(
        [sys.executable, "-m", "muster", "drill", str(config), str(context), *options,
         "--json", "--home", str(server.home), "--url", server.url],
        capture_output=True, text=True, timeout=DRILL_TIMEOUT, check=False)
    assert done.stdout, done.stderr
    return done.returncode, json.loads(done.stdout)


def longer(config: Path, epochs: str, more: str) -> Path:
    """The config with its epochs (flag and planned length) raised: the examples train in a
    second or two, too short for a fault to land mid-run."""
    text = config.read_text()
    config.write_text(text.replace(f"--epochs {epochs}", f"--epochs {more}")
                      .replace(f"{{epochs: {epochs}}}", f"{{epochs: {more}}}"))
    return config


def rows(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {row["name"]: row for row in report["faults"]}


def test_the_digits_example_catches_every_fault_this_machine_allows(
        server: RunningServer, digits: Path, tmp_path: Path) -> None:
    context = context_of("digits", digits, tmp_path)
    # The example as it is, trained longer: its 15 epochs take a second, too short for a
    # fault to land mid-run at any scale. Its heartbeat timeout, 120 s, is what the hang's
    # run waits out before it is STALLED: 30 s here (heartbeats come every 10 s).
    config = longer(context / "experiment.yaml", "15", "3000")
    config.write_text(config.read_text().replace("heartbeat_timeout: 120s",
                                                 "heartbeat_timeout: 30s"))
    assert "heartbeat_timeout: 30s" in config.read_text()
    status, report = drill(server, config, context, "--scale", "0.1")
    assert report["state"] == "DONE"
    assert report["clean"]["state"] == "SUCCEEDED" and report["clean"]["verified"] is True
    assert report["scaled"] == ["--epochs 3000 → 300"]
    found = rows(report)
    assert list(found) == ["corrupt-data", "drop-data", "kill-rank", "hang", "straggler",
                           "disk-full", "oom", "nan", "server-restart", "network"]
    assert "Ray" in found["network"]["skipped"]
    allowed_skips = {"network"} | ({"disk-full", "oom"} if os.geteuid() != 0 else set())
    for name, row in found.items():
        if row["skipped"] is not None:
            assert name in allowed_skips, row
            continue
        assert row["caught"] is True, row
        assert row["injected_at"] is not None and row["experiment_id"] is not None, row
    assert (found["kill-rank"]["class"], found["hang"]["class"]) == ("INFRA", "STALLED")
    assert found["oom"]["class"] == "OOM" or found["oom"]["skipped"]
    assert found["corrupt-data"]["state"] == "FAILED"  # train.py raises on a bad PNG
    assert found["server-restart"]["verdict"] == "verified"
    assert found["straggler"]["state"] == "SUCCEEDED"
    assert report["experiment_ids"][0] == report["clean"]["experiment_id"]
    assert len(report["experiment_ids"]) == 1 + sum(r["skipped"] is None for r in found.values())
    assert report["summary"].startswith(f"{len(found) - len(allowed_skips & set(found))} of")
    assert status == 0


def test_a_two_rank_ddp_run_is_drilled_on_the_rank_that_runs_not_its_warm_standby(
        server: RunningServer, digits: Path, tmp_path: Path) -> None:
    """examples/digits/ddp.yaml (2 ranks, a warm standby): the faults land on the running
    attempt's last rank, and the standby let go at the end names nothing."""
    context = context_of("digits", digits, tmp_path)
    config = longer(context / "ddp.yaml", "5", "300")
    status, report = drill(server, config, context, "--faults", "kill-rank,straggler,oom",
                           "--scale", "0.1")
    found = rows(report)
    assert report["clean"]["verified"] is True, report["clean"]
    assert found["kill-rank"]["caught"] is True, found["kill-rank"]
    assert "rank 1" in found["kill-rank"]["injection"]
    assert found["kill-rank"]["class"] == "INFRA" and "worker-1" in found["kill-rank"]["message"]
    assert found["straggler"]["caught"] is True and found["straggler"]["state"] == "SUCCEEDED"
    if os.geteuid() == 0:
        assert found["oom"]["class"] == "OOM", found["oom"]
    assert status == 0


def test_a_plain_script_s_report_names_what_it_misses_and_the_advice_catches_it(
        server: RunningServer, digits: Path, tmp_path: Path) -> None:
    context = context_of("plain-digits", digits, tmp_path)
    faults = ["--faults", "corrupt-data,drop-data,kill-rank,nan", "--scale", "0.1",
              "--data", "data"]
    status, report = drill(server, longer(context / "experiment.yaml", "100", "3000"),
                           context, *faults)
    found = rows(report)
    assert report["clean"]["state"] == "SUCCEEDED" and report["clean"]["verified"] is False
    assert found["corrupt-data"]["caught"] is False
    assert found["drop-data"]["caught"] is False
    for name in ("corrupt-data", "drop-data"):
        assert "data: {path: DIR}" in found[name]["advice"], found[name]
        assert "samples_from_log" in found[name]["advice"], found[name]
    assert found["kill-rank"]["caught"] is True
    assert found["nan"]["caught"] is None and found["nan"]["message"].startswith(
        "not injected")
    assert "`corrupt-data` and `drop-data` passed unnoticed" in report["summary"]
    assert status == 1

    status, report = drill(server, longer(context / "experiment-counted.yaml", "100", "3000"),
                           context, *faults)
    found = rows(report)
    assert report["clean"]["verified"] is True, report["clean"]
    assert found["corrupt-data"]["caught"] is True and found["corrupt-data"]["state"] == \
        "SUSPECT", found["corrupt-data"]
    assert found["drop-data"]["caught"] is True, found["drop-data"]
    assert status == 0


def test_a_drill_is_refused_with_the_problem_named(server: RunningServer,
                                                   tmp_path: Path) -> None:
    config = tmp_path / "x.yaml"
    config.write_text("name: x\nentrypoint: python t.py\n")
    (tmp_path / "t.py").write_text("print('hi')\n")
    for options, problem in ((["--faults", "pull-cable"], "no fault is called 'pull-cable'"),
                             (["--scale", "2"], "scale"), (["--data", "/etc"], "--data")):
        done = subprocess.run(
            [sys.executable, "-m", "muster", "drill", str(config), str(tmp_path), *options,
             "--home", str(server.home), "--url", server.url],
            capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode != 0 and problem in done.stderr, (options, done.stderr)
        assert "Traceback" not in done.stderr
    with server.client() as c:
        assert all(d["name"] != "x" for d in c.list_drills())  # nothing left behind


SLEEPER = """
import sys, time
for n in range(600):
    print(f"step {n}", flush=True)
    time.sleep(0.1)
"""


def test_drilling_an_experiment_as_submitted_and_canceling_it(server: RunningServer,
                                                             tmp_path: Path) -> None:
    """"Run a drill" on an experiment (POST /experiments/{id}/drills): its config and
    snapshot; a user's drill skips what only an admin or root may do; a cancel kills the
    run going on and skips the rest."""
    (tmp_path / "sleeper.py").write_text(SLEEPER)
    config = "name: sleeper\nentrypoint: python sleeper.py\n"
    with server.client() as admin:
        token = admin.create_user("dora", "user")["token"]
        viewer = admin.create_user("vic", "viewer")["token"]
    with Client(url=server.url, token=token, home=Home(server.home)) as dora:
        source = dora.create_experiment(config, tmp_path)["id"]
        dora.kill_experiment(source)
        made = dora.drill_experiment(source, faults=["kill-rank", "server-restart"],
                                     scale=1.0)
        assert made["source_experiment"] == source and made["owner"] == "dora"
        found = rows(made)
        assert "admin" in found["server-restart"]["skipped"]
        assert found["kill-rank"]["skipped"] is None
        wait_until(lambda: dora.get_drill(made["id"])["clean"]["experiment_id"] is not None,
                   timeout=30, what="the clean run's experiment")
        clean = dora.get_drill(made["id"])["clean"]["experiment_id"]
        wait_until(lambda: dora.get_experiment(clean)["trials"][0]["state"] == "RUNNING",
                   timeout=60, what="the clean run to run")
        canceled = dora.cancel_drill(made["id"])
        assert canceled["state"] == "CANCELED"
        assert rows(canceled)["kill-rank"]["skipped"] == "canceled by dora"
        wait_until(lambda: dora.get_experiment(clean)["state"] == "CANCELED",
                   timeout=60, what="the clean run to be killed")
        assert any(d["id"] == made["id"] for d in dora.list_drills())
        with pytest.raises(Conflict, match="already CANCELED"):
            dora.cancel_drill(made["id"])
    with Client(url=server.url, token=viewer, home=Home(server.home)) as vic, \
            pytest.raises(Forbidden):
        vic.drill_experiment(source)
    with server.client() as admin, pytest.raises(NotFound, match="no drill 9999"):
        admin.get_drill(9999)
