"""Environment builds and interpreter probes under `run_as: owner` (attacks R3, R4, S2 of
issue 29): real Unix accounts, a real server running as root, real uv and real builds.

A build's setup command prints its uid and its environment and tries to read the server's
token: it must run as the owner, see no variable of the server's (a canary is set in the
server's environment) and be denied the token; the package it installs from the context
must be importable by the trial, which runs in it. Another owner with the same request gets
a build of its own. A build log is its owners' and admins', not a viewer's. An
`environment.python` that a user wrote runs as its owner's account, never as root. A
user's requirement lines may not fetch from places outside the package sources; an
admin's may, and so may a user's once `package_sources` lists the place (a second server,
without run_as, whose config also opens build logs to everyone). Skipped where accounts
cannot be made, as tests/server/test_run_as.py is.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from muster.client import Client
from muster.environments.layout import EnvHome
from muster.errors import ConfigError, Forbidden
from muster.home import Home
from tests.environments.wheels import make_wheel
from tests.server.experiments import only_trial, wait_ended
from tests.server.test_run_as import SYSTEM_PYTHON, Accounts, accounts  # noqa: F401 (fixture)
from tests.servers import RunningServer, serving, serving_jobs_as_accounts

pytestmark = [pytest.mark.lifecycle, pytest.mark.timeout(300)]

CANARY = "MUSTER_CANARY"
JOB = """\
import json, os, tinyalpha
print("REPORT " + json.dumps({"uid": os.getuid(), "tinyalpha": tinyalpha.VERSION}), flush=True)
"""
WHEEL = "tinyalpha-1.0-py3-none-any.whl"


@pytest.fixture(scope="module")
def server(accounts: Accounts) -> Iterator[RunningServer]:  # noqa: F811 (the fixture)
    """`run_as: owner`, muster's package in a copy every account reads (as in
    test_run_as), a canary and a fake cloud key in the server's environment."""
    with serving_jobs_as_accounts(
            f"run_as: owner\ninterpreters: [{SYSTEM_PYTHON}]\n", prefix="muster-builds-",
            env={CANARY: secrets.token_hex(8), "AWS_SECRET_ACCESS_KEY": "canary-aws-key",
                 "UV_HTTP_RETRIES": "0"}) as running:
        yield running


@pytest.fixture(scope="module")
def users(server: RunningServer, accounts: Accounts  # noqa: F811 (the fixture)
          ) -> dict[str, str]:
    """Tokens: alice and bob (users, each their own account), vera (a viewer) and ada (an
    admin whose jobs run as alice's account)."""
    with server.client() as admin:
        return {
            "alice": admin.create_user("alice", "user",
                                       unix_user=accounts.alice.pw_name)["token"],
            "bob": admin.create_user("bob", "user", unix_user=accounts.bob.pw_name)["token"],
            "vera": admin.create_user("vera", "viewer")["token"],
            "ada": admin.create_user("ada", "admin",
                                     unix_user=accounts.alice.pw_name)["token"],
        }


def as_user(server: RunningServer, token: str) -> Client:
    return Client(url=server.url, token=token)


def context(parent: Path, environment: dict[str, Any], requirements: str | None = None,
            script: str = JOB) -> Path:
    where = Path(tempfile.mkdtemp(dir=parent))
    (where / "job.py").write_text(script)
    make_wheel(where / "wheels", "tinyalpha", "1.0")
    if requirements is not None:
        (where / "requirements.txt").write_text(requirements)
    (where / "experiment.yaml").write_text(yaml.safe_dump({
        "name": "build", "entrypoint": ["python", "job.py"], "harness": False,
        "environment": environment, "failure_policy": {"stop_grace": "2s"}}))
    return where


def submit(client: Client, where: Path) -> dict[str, Any]:
    created: dict[str, Any] = client.create_experiment(
        (where / "experiment.yaml").read_text(), where)
    return created


def ended_trial(client: Client, created: dict[str, Any]) -> dict[str, Any]:
    """The experiment's one trial, in full, once the experiment has ended."""
    trial: dict[str, Any] = client.get_trial(only_trial(wait_ended(
        client, created["id"], timeout=180))["id"])
    return trial


def report(client: Client, trial_id: int) -> dict[str, Any]:
    text = client.read_logs(trial_id).data.decode()
    line = next(x for x in text.splitlines() if x.startswith("REPORT "))
    found: dict[str, Any] = json.loads(line.removeprefix("REPORT "))
    return found


def test_a_build_runs_as_its_owner_and_its_log_is_the_owner_s(
    server: RunningServer, accounts: Accounts, users: dict[str, str],  # noqa: F811
    tmp_path: Path
) -> None:
    token_path = Home(server.home).token_path
    setup = [["sh", "-c", f"echo UID=$(id -u); env; cat {token_path} && echo TOKEN-READ "
                          "|| echo TOKEN-DENIED"]]
    environment = {"python": str(SYSTEM_PYTHON), "requirements": "requirements.txt",
                   "setup": setup}
    lines = f"--no-index\n./wheels/{WHEEL}\n"
    with as_user(server, users["alice"]) as alice:
        trial = ended_trial(alice, submit(alice, context(tmp_path, environment, lines)))
        assert trial["state"] == "SUCCEEDED", trial["message"]
        assert report(alice, trial["id"]) == {"uid": accounts.alice.pw_uid, "tinyalpha": "1.0"}
        key, log = alice.environment_log(trial["environment"]["hash"])
    text = log.decode()
    assert f"UID={accounts.alice.pw_uid}\n" in text, text
    assert "\nTOKEN-DENIED\n" in text and "\nTOKEN-READ\n" not in text  # (not the argv)
    assert token_path.read_text().strip() not in text
    for variable in (CANARY, "AWS_SECRET_ACCESS_KEY", "MUSTER_HOME", "PYTHONPATH"):
        assert f"{variable}=" not in text, text
    assert f"HOME={accounts.alice.pw_dir}\n" in text and f"USER={accounts.alice.pw_name}\n" in text
    _check_build_files(EnvHome(Home(server.home).envs_dir), key, accounts.alice.pw_uid)

    # Bob asks for the same environment: he gets his own build, never runs in alice's.
    with as_user(server, users["bob"]) as bob:
        bob_trial = ended_trial(bob, submit(bob, context(tmp_path, environment, lines)))
        assert bob_trial["state"] == "SUCCEEDED", bob_trial["message"]
        assert report(bob, bob_trial["id"])["uid"] == accounts.bob.pw_uid
        assert bob_trial["environment"]["hash"] != key
        with pytest.raises(Forbidden, match="read by the owners of the experiments"):
            bob.environment_log(key)  # alice's
    _check_build_files(EnvHome(Home(server.home).envs_dir), bob_trial["environment"]["hash"],
                       accounts.bob.pw_uid)

    with as_user(server, users["vera"]) as vera:
        with pytest.raises(Forbidden, match="build_logs: everyone"):
            vera.environment_log(key[:6])
        assert {env["hash"] for env in vera.list_environments()} >= {key}
    with server.client() as admin:
        assert b"\nTOKEN-DENIED\n" in admin.environment_log(key)[1]


def _check_build_files(layout: EnvHome, key: str, uid: int) -> None:
    """The log is root's alone; the venv's top and its record root's, what the account's
    commands wrote (bin/) the account's."""
    info = layout.log(key).lstat()
    assert (info.st_uid, stat.S_IMODE(info.st_mode)) == (0, 0o600)
    built = layout.built(key)
    assert built is not None
    top = built.lstat()
    assert (top.st_uid, stat.S_IMODE(top.st_mode)) == (0, 0o755)
    assert (built / ".muster").lstat().st_uid == 0
    assert (built / ".muster" / "freeze.txt").lstat().st_uid == 0
    assert "tinyalpha @ file://" in (built / ".muster" / "freeze.txt").read_text()
    assert (built / "bin").lstat().st_uid == uid
    assert not list(layout.store.glob(f"{key}-*.context")), "the context copy is removed"


def test_why_a_build_failed_is_shown_to_its_owner_not_to_a_viewer(
    server: RunningServer, users: dict[str, str], tmp_path: Path
) -> None:
    environment = {"python": str(SYSTEM_PYTHON), "setup": [["sh", "-c", "echo own-words; "
                                                             "exit 3"]]}
    with as_user(server, users["alice"]) as alice:
        trial = ended_trial(alice, submit(alice, context(tmp_path, environment)))
        key = trial["environment"]["hash"]
        assert "own-words" in trial["message"]
        mine = {env["hash"]: env for env in alice.list_environments()}[key]
        assert mine["state"] == "FAILED" and "own-words" in mine["message"]
    with as_user(server, users["vera"]) as vera:
        seen = {env["hash"]: env for env in vera.list_environments()}[key]
        assert (seen["state"], seen["message"]) == ("FAILED", None)
    described = subprocess.run(
        [sys.executable, "-m", "muster", "trial", "describe", str(trial["id"])],
        env={**os.environ, "MUSTER_URL": server.url, "MUSTER_TOKEN": users["vera"],
             "COLUMNS": "200", "NO_COLOR": "1"}, capture_output=True, text=True, timeout=60)
    assert described.returncode == 0, described.stderr
    assert "its build log: the build log of environment" in described.stdout


def test_an_interpreter_a_user_wrote_runs_as_its_owner_never_as_root(
    server: RunningServer, accounts: Accounts, users: dict[str, str],  # noqa: F811
    tmp_path: Path
) -> None:
    """`environment.python` is a script alice's account owns (as one her job could
    write); an admin whose jobs run as alice submits it (a user may not name it at all)."""
    where = Path(tempfile.mkdtemp(prefix="muster-python-", dir="/tmp"))
    try:
        record = where / "ran-as"
        script = where / "python"
        script.write_text(f"#!/bin/sh\nid -u >> {record}\nexec {SYSTEM_PYTHON} \"$@\"\n")
        script.chmod(0o755)
        for path in (where, script):
            os.chown(path, accounts.alice.pw_uid, accounts.alice.pw_gid)
        where.chmod(0o755)
        environment = {"python": str(script)}
        with as_user(server, users["alice"]) as alice, \
                pytest.raises((Forbidden, ConfigError), match=r"environment\.python"):
            submit(alice, context(tmp_path, environment, script="print('REPORT {}')\n"))
        with as_user(server, users["ada"]) as ada:
            trial = ended_trial(ada, submit(ada, context(tmp_path, environment,
                                                         script="print('REPORT {}')\n")))
            assert trial["state"] == "SUCCEEDED", trial["message"]
            ada.trial_snapshot(trial["id"])  # it lists the interpreter's packages
        ran = record.read_text().split()
        assert ran and set(ran) == {str(accounts.alice.pw_uid)}, ran
    finally:
        shutil.rmtree(where, ignore_errors=True)


def test_a_user_may_fetch_only_from_the_package_sources(
    server: RunningServer, users: dict[str, str], tmp_path: Path
) -> None:
    direct = {"pip": [f"tinyalpha @ http://127.0.0.1:9/{WHEEL}"]}
    index = {"requirements": "requirements.txt"}
    with as_user(server, users["alice"]) as alice:
        with pytest.raises(ConfigError) as refused:
            submit(alice, context(tmp_path, direct))
        said = str(refused.value)
        assert "environment.pip[0]" in said and "fetches from 127.0.0.1:9" in said
        assert "ask an admin to add it to package_sources in the cluster config" in said
        with pytest.raises(ConfigError, match=r"environment.requirements .*127\.0\.0\.1:9"):
            submit(alice, context(tmp_path, index,
                                  "--index-url http://127.0.0.1:9/simple\ntinyalpha\n"))
    with as_user(server, users["ada"]) as ada:
        created = submit(ada, context(tmp_path, direct))  # an admin's are not checked
        ada.kill_experiment(created["id"])


def test_package_sources_and_build_logs_everyone_open_what_they_name(
    tmp_path_factory: pytest.TempPathFactory, tmp_path: Path
) -> None:
    top = tmp_path_factory.mktemp("open")
    cluster = top / "cluster.yaml"
    cluster.write_text("package_sources: ['127.0.0.1:9']\nbuild_logs: everyone\n")
    with serving(top / "home", options=["--min-free-disk", "0", "--cluster-config",
                                        str(cluster)], env={"UV_HTTP_RETRIES": "0"}) as open_:
        with open_.client() as admin:
            uma = admin.create_user("uma", "user")["token"]
            vera = admin.create_user("vera", "viewer")["token"]
        with as_user(open_, uma) as user:
            created = submit(user, context(tmp_path, {
                "pip": [f"tinyalpha @ http://127.0.0.1:9/{WHEEL}"]}))
            key = user.get_trial(only_trial(created)["id"])["environment"]["hash"]
            user.kill_experiment(created["id"])
        with as_user(open_, vera) as viewer:
            assert viewer.environment_log(key)[0] == key
