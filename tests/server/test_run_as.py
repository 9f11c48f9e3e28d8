"""Job isolation (`run_as: owner`): real Unix accounts, a real server running as root, and
jobs that try to read what is not theirs.

The test makes two accounts (`useradd`), links muster users alice and bob to them, and
runs alice's probe while bob's job waits: the probe, running as alice's account, must not
read the server's token, its database, its log, the submitted contexts or bob's run
directory, and must be able to write its own working directory, use the harness and
checkpoint. It then plants a link to the token in place of its own log; the server must not
serve the token through the log API. Skipped (with the reason) where accounts cannot be
made: not root, or no `useradd`; CI sets MUSTER_REQUIRE_RUN_AS=1 to fail instead.
"""

from __future__ import annotations

import json
import os
import pwd
import secrets
import shutil
import stat
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from muster.client import Client
from muster.errors import ConfigError
from muster.home import Home
from tests.server.experiments import only_trial, wait_ended, wait_trial
from tests.servers import RunningServer, serving_jobs_as_accounts

pytestmark = pytest.mark.lifecycle  # a real server, real accounts, real jobs

SYSTEM_PYTHON = Path("/usr/bin/python3")

PROBE = r'''
import json, os, sys
import muster.harness as mh

targets = json.loads(os.environ["PROBE_TARGETS"])
results = {"uid": os.getuid(), "gid": os.getgid(), "home": os.environ.get("HOME"),
           "groups": os.getgroups()}
for name, path in targets.items():
    try:
        if os.path.isdir(path):
            os.listdir(path)
        else:
            with open(path, "rb") as f:
                f.read(1)
        results[name] = "READ"
    except OSError as exc:
        results[name] = type(exc).__name__
with open("mine.txt", "w") as f:  # its own working directory
    f.write("written by the job")
with mh.init() as ctx:
    ctx.plan(steps=1)
    ctx.report_training(1, {"loss": 0.5})
    ctx.report_validation(1, {"val_loss": 0.25})
    with ctx.checkpoint.save(1) as path:
        (path / "state.txt").write_text("step 1")
with open("results.json", "w") as f:
    json.dump(results, f)
# Last: put a link to the token where muster's log of this replica is.
log = os.path.join(os.environ["MUSTER_RUN_DIR"], "attempt-1", "rank-0.log")
os.rename(log, log + ".moved")
os.symlink(targets["token"], log)
print("after the swap: this line lands in the moved log, through the shim's descriptor")
'''

WAITER = r'''
import os, time
with open("bob-secret.txt", "w") as f:
    f.write("bob's private words")
print("bob waits", flush=True)
while not os.path.exists(os.environ["RELEASE"]):
    time.sleep(0.05)
'''


def _skip_reason() -> str | None:
    if os.geteuid() != 0:
        return "making Unix accounts and dropping to them needs root"
    if shutil.which("useradd") is None or shutil.which("userdel") is None:
        return "no useradd/userdel on this machine"
    if not SYSTEM_PYTHON.exists():
        return f"no {SYSTEM_PYTHON}: the jobs need an interpreter every account can run"
    return None


@dataclass(frozen=True)
class Accounts:
    alice: pwd.struct_passwd
    bob: pwd.struct_passwd


@pytest.fixture(scope="module")
def accounts() -> Iterator[Accounts]:
    reason = _skip_reason()
    if reason is not None:
        if os.environ.get("MUSTER_REQUIRE_RUN_AS") == "1":
            pytest.fail(f"{reason} (and MUSTER_REQUIRE_RUN_AS=1 requires the run_as tests)")
        pytest.skip(reason)
    tag = secrets.token_hex(3)
    names = [f"mst-alice-{tag}", f"mst-bob-{tag}"]
    for name in names:
        subprocess.run(["useradd", "--no-create-home", "--user-group", "--shell",
                        "/usr/sbin/nologin", name], check=True, capture_output=True)
    try:
        yield Accounts(*(pwd.getpwnam(name) for name in names))
    finally:
        for name in names:
            subprocess.run(["userdel", name], check=False, capture_output=True)


@pytest.fixture(scope="module")
def shared_server(accounts: Accounts) -> Iterator[RunningServer]:
    """A server with `run_as: owner`; its jobs run on the system's interpreter, which a
    user may name once an admin allowed it (`interpreters`)."""
    with serving_jobs_as_accounts(
            f"run_as: owner\ninterpreters: [{SYSTEM_PYTHON}]\n") as server:
        yield server


def config(name: str, script: str, harness: bool = False, **variables: str) -> str:
    return yaml.safe_dump({
        "name": name, "entrypoint": ["python", script], "harness": harness,
        "environment": {"python": str(SYSTEM_PYTHON), "variables": variables},
        "failure_policy": {"stop_grace": "2s"},
    })


def context(parent: Path, script: str, text: str) -> Path:
    where = parent / script.removesuffix(".py")
    where.mkdir()
    (where / script).write_text(text)
    return where


def test_a_job_reads_nothing_of_muster_s_or_another_owner_s(
    shared_server: RunningServer, accounts: Accounts, tmp_path: Path
) -> None:
    home = Home(shared_server.home)
    with shared_server.client() as admin:
        alice = admin.create_user("alice", "user", unix_user=accounts.alice.pw_name)
        bob = admin.create_user("bob", "user", unix_user=accounts.bob.pw_name)
    release = shared_server.home.parent / "release"  # where bob's account can look
    with Client(url=shared_server.url, token=bob["token"]) as as_bob:
        waiting = as_bob.create_experiment(
            config("waiter", "waiter.py", RELEASE=str(release)),
            context(tmp_path, "waiter.py", WAITER))
        bob_trial = wait_trial(as_bob, only_trial(waiting)["id"], {"RUNNING"})
    bob_run = home.run_dir(bob_trial["uuid"])
    targets = {
        "token": str(home.token_path), "database": str(shared_server.home / "muster.db"),
        "server_log": str(shared_server.home / "server.log"),
        "contexts": str(home.experiments_dir), "runs_listing": str(home.runs_dir),
        "bob_run": str(bob_run.path), "bob_workdir": str(bob_run.workdir),
        "bob_secret": str(bob_run.workdir / "bob-secret.txt"),
        "bob_log": str(bob_run.attempt(1).rank(0).log), "secrets": str(home.secrets_dir),
    }
    with Client(url=shared_server.url, token=alice["token"]) as as_alice:
        probe = as_alice.create_experiment(
            config("probe", "probe.py", harness=True, PROBE_TARGETS=json.dumps(targets)),
            context(tmp_path, "probe.py", PROBE))
        ended = wait_ended(as_alice, probe["id"], timeout=90)
        trial = only_trial(ended)
        run = home.run_dir(trial["uuid"])
        results = json.loads((run.workdir / "results.json").read_text())
        denied = {name: results[name] for name in targets}
        assert denied == {name: "PermissionError" for name in targets}, results
        assert (results["uid"], results["gid"]) == (accounts.alice.pw_uid,
                                                   accounts.alice.pw_gid)
        assert results["home"] == accounts.alice.pw_dir
        assert 0 not in results["groups"]
        assert ended["state"] == "COMPLETED", trial["message"]
        assert trial["state"] == "SUCCEEDED" and trial["verification"]["verified"]
        assert [m["metrics"] for m in as_alice.get_metrics(trial["id"], kind="validation")] \
            == [{"val_loss": 0.25}]
        assert [c["intact"] for c in as_alice.list_checkpoints(trial["id"])] == [True]
        # The planted link is no log: muster (root) serves nothing through it.
        served = as_alice.read_logs(trial["id"]).data
        token = home.token_path.read_bytes().strip()
        assert token not in served and served == b""
        assert b"after the swap" in (run.attempt(1).rank(0).log.parent
                                     / "rank-0.log.moved").read_bytes()
    _check_ownership(run, accounts.alice)
    release.touch()
    with shared_server.client() as admin:
        assert wait_ended(admin, waiting["id"])["state"] == "COMPLETED"


def _check_ownership(run: object, account: pwd.struct_passwd) -> None:
    from muster.rundir import RunDir

    assert isinstance(run, RunDir)
    top = run.path.lstat()
    assert (top.st_uid, stat.S_IMODE(top.st_mode)) == (0, 0o711)  # root's: entered only
    for mine in (run.workdir, run.env, run.checkpoints, run.attempt(1).path):
        info = mine.lstat()
        assert (info.st_uid, stat.S_IMODE(info.st_mode)) == (account.pw_uid, 0o700), mine
    assert (run.workdir / "mine.txt").stat().st_uid == account.pw_uid
    assert run.attempt(1).rank(0).spec.stat().st_uid == 0  # muster's files stay root's
    assert stat.S_IMODE(run.attempt(1).rank(0).spec.stat().st_mode) == 0o600


def test_an_owner_without_an_account_is_refused_at_submission(
    shared_server: RunningServer, tmp_path: Path
) -> None:
    with shared_server.client() as admin:
        carol = admin.create_user("carol", "user", unix_user="mst-nobody-here")
    with Client(url=shared_server.url, token=carol["token"]) as as_carol, \
            pytest.raises(ConfigError) as refused:
        as_carol.create_experiment(config("x", "probe.py"), context(tmp_path, "probe.py",
                                                                    "print(1)\n"))
    assert "there is no Unix account 'mst-nobody-here'" in str(refused.value)
    assert "muster user edit carol --unix-user NAME" in str(refused.value)


WARM = r'''
import os
import muster.harness as mh
with mh.init() as ctx:
    ctx.plan(steps=3)
    restored = ctx.checkpoint.restore()
    if restored is not None:
        whose = "warm start" if restored.warm_start else "own"
        print(f"started from {(restored.path / 'weights.txt').read_text()} ({whose})")
    for step in (1, 2, 3):  # counted from 0 on a warm start: its own steps (verification)
        ctx.report_validation(step, {"val_loss": 0.25})
    with ctx.checkpoint.save(3) as path:
        (path / "weights.txt").write_text(os.environ["WEIGHTS"])
'''


def test_a_warm_start_from_another_owners_checkpoint_is_a_copy_the_job_owns(
    shared_server: RunningServer, accounts: Accounts, tmp_path: Path
) -> None:
    """Any reader may start from any checkpoint: root copies alice's (in her private run
    directory) into bob's run directory, where bob's job reads it; `source/` itself stays
    root's, the copy is bob's."""
    home = Home(shared_server.home)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    with shared_server.client() as admin:
        alice = admin.create_user("warm-alice", "user", unix_user=accounts.alice.pw_name)
        bob = admin.create_user("warm-bob", "user", unix_user=accounts.bob.pw_name)

    def warm(name: str, weights: str, **searcher: int) -> str:
        return yaml.safe_dump({
            "name": name, "entrypoint": ["python", "warm.py"], "harness": True,
            "environment": {"python": str(SYSTEM_PYTHON), "variables": {"WEIGHTS": weights}},
            "searcher": {"name": "single", "metric": "val_loss", **searcher}})

    with Client(url=shared_server.url, token=alice["token"]) as as_alice:
        source = only_trial(wait_ended(as_alice, as_alice.create_experiment(
            warm("source", "alice's weights"), context(tmp_path / "a", "warm.py", WARM))["id"],
            timeout=90))
    with Client(url=shared_server.url, token=bob["token"]) as as_bob:
        ended = wait_ended(as_bob, as_bob.create_experiment(
            warm("fine-tune", "bob's weights", source_trial_id=source["id"]),
            context(tmp_path / "b", "warm.py", WARM))["id"], timeout=90)
        trial = only_trial(ended)
        assert trial["state"] == "SUCCEEDED", trial["message"]
        assert b"started from alice's weights (warm start)" in as_bob.read_logs(trial["id"]).data
    run = home.run_dir(trial["uuid"])
    top = run.source.lstat()
    assert (top.st_uid, stat.S_IMODE(top.st_mode)) == (0, 0o711)
    [copy] = run.source.iterdir()
    assert (copy.lstat().st_uid, stat.S_IMODE(copy.lstat().st_mode)) == (
        accounts.bob.pw_uid, 0o700)
