"""Trials without the harness seen from outside (issue 30, item 9), through a real server:
each attempt's launch records the interpreter the trial's layer runs and the packages it
imports, and `muster trial diff` compares two plain scripts by them (a package one
installed into its own layer with pip, another interpreter) and a plain script with a
harness run."""

from __future__ import annotations

import json
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from muster.client import Client
from muster.home import Home
from muster.rundir import RunDir
from tests.cli.test_cli import on
from tests.environments.wheels import make_wheel
from tests.server.experiments import TRIAL_ENDED, only_trial, wait_trial
from tests.server.test_run_as import SYSTEM_PYTHON, Accounts, accounts  # noqa: F401 (fixture)
from tests.servers import RunningServer, serving_jobs_as_accounts, shared_server
from tests.waiting import wait_until

pytestmark = [pytest.mark.lifecycle, pytest.mark.timeout(240)]

server = shared_server()

ENDED = TRIAL_ENDED | {"SUSPECT"}

# The first attempt installs the context's wheel into the trial's own layer, as a user's
# `pip install` in a job does, and asks to be run again (a transient exit); the second
# trains. Neither imports muster.
INSTALLS_THEN_TRAINS = """\
import os, subprocess, sys
if os.environ["MUSTER_ATTEMPT"] == "1":
    wheel = next(os.path.join("wheels", name) for name in os.listdir("wheels"))
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-index", "--no-deps",
                    "--disable-pip-version-check", "-q", wheel], check=True)
    sys.exit(75)
print("training with what was installed")
"""
PLAIN = "print('training, no harness')\n"
HARNESS = "import muster.harness as mh\nwith mh.init():\n    print('training')\n"


def plain_trial(client: Client, parent: Path, script: str, *, python: str | None = None,
                wheel: str | None = None, harness: bool = False) -> int:
    """Run `script` to its end as a one-trial experiment; its trial's id."""
    context = parent / f"ctx-{len(list(parent.iterdir()))}"
    context.mkdir()
    (context / "train.py").write_text(script)
    if wheel is not None:
        make_wheel(context / "wheels", "tinyalpha", wheel)
    config: dict[str, Any] = {
        "name": "outside", "entrypoint": ["python", "train.py"], "harness": harness,
        "failure_policy": {"stop_grace": "2s", "transient_exit_codes": [75]}}
    if python is not None:
        config["environment"] = {"python": python}
    created = client.create_experiment(yaml.safe_dump(config), context)
    trial = wait_trial(client, only_trial(created)["id"], ENDED, timeout=180)
    # (A harness run that reports nothing may end SUSPECT: what it was made of is known.)
    assert trial["state"] in ({"SUCCEEDED", "SUSPECT"} if harness else {"SUCCEEDED"}), (
        trial["message"])
    return int(trial["id"])


def outside_of(server: RunningServer, client: Client, trial_id: int) -> dict[str, Any]:
    """The trial's outside part, once its latest attempt's is written (on a thread of its
    own, after the launch)."""
    trial = client.get_trial(trial_id)
    latest = max(trial["attempts"], key=lambda a: a["number"])
    run = RunDir(Home(server.home).run_dir(trial["uuid"]).path)
    wait_until(lambda: run.outside_snapshot(latest["number"]).is_file(), timeout=30,
               what=f"trial {trial_id}'s outside snapshot")
    part: dict[str, Any] = client.trial_snapshot(trial_id)["outside"]
    assert part["attempt"] == latest["number"]
    return part


def other_interpreter() -> str:
    """An interpreter of another version than the server's, or skip."""
    system = Path("/usr/bin/python3")
    if not system.is_file():
        pytest.skip("no /usr/bin/python3 on this machine")
    done = subprocess.run([str(system), "-c", "import platform; print(platform.python_version())"],
                          capture_output=True, text=True, check=True)
    if done.stdout.strip() == ".".join(map(str, sys.version_info[:3])):
        pytest.skip("/usr/bin/python3 is the same version as the server's interpreter")
    return str(system)


def test_two_plain_scripts_differ_in_what_each_installed_into_its_layer(
        server: RunningServer, client: Client, tmp_path: Path) -> None:
    one = plain_trial(client, tmp_path, INSTALLS_THEN_TRAINS, wheel="1.0")
    two = plain_trial(client, tmp_path, INSTALLS_THEN_TRAINS, wheel="2.0")
    first, second = outside_of(server, client, one), outside_of(server, client, two)
    assert first["source"] == "outside" and first["attempt"] == 2
    assert first["packages"]["tinyalpha"] == "1.0" and second["packages"]["tinyalpha"] == "2.0"
    # The trial part knows only what the layer was made from: not what the job installed.
    assert "tinyalpha" not in client.trial_snapshot(one)["trial"]["environment"]["packages"]
    assert first["python"] == {"version": ".".join(map(str, sys.version_info[:3])),
                               "implementation": "cpython"}
    assert len(first["code"]["tree_sha256"]) == 64 and first["unknown"] == {}

    found = client.diff_trials(one, two)
    assert {"group": "packages", "field": "outside.packages.tinyalpha", "a": "1.0", "b": "2.0",
            "rank": None} in found["differences"]
    assert "tinyalpha: 1.0 vs 2.0 (seen from outside)" in found["lines"]

    done = on(server, "trial", "diff", str(one), str(two))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "packages:" in lines and "  tinyalpha: 1.0 vs 2.0 (seen from outside)" in lines
    as_json = on(server, "trial", "diff", str(one), str(two), "--json")
    assert as_json.returncode == 0, as_json.stderr
    assert json.loads(as_json.stdout) == {"differences": found["differences"]}


def test_two_plain_scripts_on_other_interpreters_differ_in_its_version(
        server: RunningServer, client: Client, tmp_path: Path) -> None:
    system = other_interpreter()
    mine = plain_trial(client, tmp_path, PLAIN)
    theirs = plain_trial(client, tmp_path, PLAIN, python=system)
    version = outside_of(server, client, theirs)["python"]["version"]
    assert outside_of(server, client, mine)["python"]["version"] != version
    found = client.diff_trials(mine, theirs)
    ours = ".".join(map(str, sys.version_info[:3]))
    assert {"group": "frameworks", "field": "outside.python.version", "a": ours, "b": version,
            "rank": None} in found["differences"]
    done = on(server, "trial", "diff", str(mine), str(theirs))
    assert done.returncode == 0, done.stderr
    assert f"  python.version: {ours} vs {version} (seen from outside)" in done.stdout.splitlines()


def test_a_plain_script_against_a_harness_run(
        server: RunningServer, client: Client, tmp_path: Path) -> None:
    plain = plain_trial(client, tmp_path, PLAIN)
    harnessed = plain_trial(client, tmp_path, HARNESS, harness=True)
    seen = outside_of(server, client, plain)
    both = client.trial_snapshot(harnessed)
    outside_of(server, client, harnessed)  # recorded for a harness run too
    # What the harness saw and what muster saw from outside agree on the interpreter.
    assert both["ranks"]["0"]["python"]["version"] == seen["python"]["version"]
    assert client.trial_snapshot(plain)["ranks"] == {}
    found = client.diff_trials(plain, harnessed)
    # Their code and config differ, and the harness's side has rank parts, the plain
    # script none; their packages and interpreter, seen from outside, are the same.
    assert [d["field"] for d in found["differences"]] == [
        "code.tree_sha256", "ranks", "config.harness"]
    assert "ranks: [] vs [0]" in found["lines"]

    system = other_interpreter()
    other = plain_trial(client, tmp_path, PLAIN, python=system)
    found = client.diff_trials(other, harnessed)
    assert any(d["field"] == "outside.python.version" for d in found["differences"])


# Installs a distribution into the trial's own layer as an installer would (its metadata),
# then asks to be run again.
WRITES_ITS_LAYER = """\
import os, sys, sysconfig
if os.environ["MUSTER_ATTEMPT"] == "1":
    meta = os.path.join(sysconfig.get_paths()["purelib"], "tinybeta-3.1.dist-info")
    os.makedirs(meta)
    with open(os.path.join(meta, "METADATA"), "w") as out:
        out.write("Metadata-Version: 2.1\\nName: tinybeta\\nVersion: 3.1\\n")
    sys.exit(75)
"""


def test_under_run_as_the_record_is_the_server_s_and_sees_the_job_s_layer(
        accounts: Accounts, tmp_path: Path) -> None:  # noqa: F811 (the fixture)
    with serving_jobs_as_accounts(f"run_as: owner\ninterpreters: [{SYSTEM_PYTHON}]\n",
                                  prefix="muster-outside-") as running:
        with running.client() as admin:
            alice = admin.create_user("alice", "user", unix_user=accounts.alice.pw_name)
        with Client(url=running.url, token=alice["token"]) as as_alice:
            trial_id = plain_trial(as_alice, tmp_path, WRITES_ITS_LAYER,
                                   python=str(SYSTEM_PYTHON))
            part = outside_of(running, as_alice, trial_id)
            uuid = as_alice.get_trial(trial_id)["uuid"]
        assert part["attempt"] == 2 and part["packages"]["tinybeta"] == "3.1"
        assert part["python"]["version"] is not None and part["unknown"] == {}
        run = RunDir(Home(running.home).run_dir(uuid).path)
        layer = run.env.lstat()  # the job's alone: read by the probe as the job's account
        assert (layer.st_uid, stat.S_IMODE(layer.st_mode)) == (accounts.alice.pw_uid, 0o700)
        record = run.outside_snapshot(2).lstat()  # the server's, where the job cannot write
        assert (record.st_uid, stat.S_IMODE(record.st_mode)) == (0, 0o600)
        assert run.outside_snapshot(2).parent == run.path
