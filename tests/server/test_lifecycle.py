"""Trials from start to end through the real server: exits, retries, kills, the queue."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from muster.client import Client
from muster.errors import Conflict
from muster.launch.identity import is_alive, read_identity
from tests.processes import live_group
from tests.server.experiments import (
    attempt_dir,
    create,
    only_trial,
    run_to_end,
    shim_record,
    submit,
    wait_ended,
    wait_trial,
    write_context,
)
from tests.servers import RunningServer, shared_server
from tests.waiting import wait_until

pytestmark = pytest.mark.lifecycle  # starts real processes

server = shared_server()


def replicas(trial: dict[str, Any]) -> list[dict[str, Any]]:
    """The rank-0 replica of every attempt, in attempt order."""
    return [attempt["replicas"][0] for attempt in trial["attempts"]]


@pytest.mark.timeout(60)
def test_exit_0_completes_the_experiment(client: Client, tmp_path: Path) -> None:
    exp = run_to_end(client, tmp_path, "exit0.sh")
    assert exp["state"] == "COMPLETED"
    trial = only_trial(exp)
    assert (trial["state"], trial["reason"], trial["restarts"]) == ("SUCCEEDED", "OK", 0)
    (replica,) = replicas(trial)
    assert (replica["reason"], replica["exit_code"], replica["signal"]) == ("OK", 0, None)
    assert Path(replica["log_path"]).read_bytes() == b"hello from exit0\n"


@pytest.mark.timeout(60)
def test_a_traceback_fails_the_trial_at_once(client: Client, tmp_path: Path) -> None:
    exp = run_to_end(client, tmp_path, "fail_traceback.py")
    assert exp["state"] == "ERROR"
    trial = only_trial(exp)
    assert (trial["state"], trial["reason"]) == ("FAILED", "USER_ERROR")
    (replica,) = replicas(trial)
    assert (replica["reason"], replica["exit_code"], replica["signal"]) == ("USER_ERROR", 1, None)
    assert "non-zero status of 1" in replica["message"]
    assert "Termination reason: ValueError: bad shape" in replica["message"]
    assert "ValueError: bad shape" in trial["message"]


@pytest.mark.timeout(60)
def test_exit_2_is_a_permanent_error(client: Client, tmp_path: Path) -> None:
    trial = only_trial(run_to_end(client, tmp_path, "exit2.sh"))
    assert (trial["state"], trial["reason"]) == ("FAILED", "PERMANENT_ERROR")
    (replica,) = replicas(trial)
    assert (replica["reason"], replica["exit_code"]) == ("PERMANENT_ERROR", 2)
    assert "non-zero status of 2" in replica["message"]


@pytest.mark.timeout(60)
def test_a_missing_program_is_a_permanent_error(client: Client, tmp_path: Path) -> None:
    context = write_context(tmp_path, ["no-such-program-muster-test", "--flag"])
    exp = wait_ended(client, submit(client, context)["id"])
    trial = only_trial(exp)
    assert (trial["state"], trial["reason"]) == ("FAILED", "PERMANENT_ERROR")
    (replica,) = replicas(trial)
    assert replica["reason"] == "PERMANENT_ERROR"
    assert "could not start" in replica["message"]
    assert "no-such-program-muster-test" in replica["message"]


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("name", "code"), [("SIGSEGV", 139), ("SIGABRT", 134)])
def test_a_crash_by_signal_is_retried_three_times(
    client: Client, tmp_path: Path, server: RunningServer, name: str, code: int
) -> None:
    trial = only_trial(run_to_end(client, tmp_path, "kill_self.py", name))
    assert (trial["state"], trial["reason"], trial["restarts"]) == ("FAILED", "TRANSIENT", 3)
    assert [a["number"] for a in trial["attempts"]] == [1, 2, 3, 4]
    assert [a["state"] for a in trial["attempts"]] == ["FAILED"] * 4
    logs = set()
    for number, replica in enumerate(replicas(trial), start=1):
        assert (replica["reason"], replica["signal"], replica["exit_code"]) == (
            "TRANSIENT", name, code)
        log = Path(replica["log_path"])
        assert log == attempt_dir(server.home, trial, number) / "rank-0.log"
        assert log.read_bytes() == f"about to raise {name}\n".encode()
        logs.add(log)
    assert len(logs) == 4
    events = [e["message"] or "" for e in client.get_trial(trial["id"])["events"]]
    assert "TRANSIENT failure; giving up after 3 retries" in events


@pytest.mark.timeout(60)
def test_a_sigkill_loses_no_line(client: Client, tmp_path: Path) -> None:
    exp = run_to_end(client, tmp_path, "lines_then_sigkill.py", "5000",
                     failure_policy={"replica_restarts": 0, "trial_retries": 0})
    trial = only_trial(exp)
    assert (trial["state"], trial["reason"]) == ("FAILED", "INFRA")
    (replica,) = replicas(trial)
    assert (replica["reason"], replica["signal"], replica["exit_code"]) == ("INFRA", "SIGKILL", 137)
    expected = b"".join(b"line %d\n" % i for i in range(5000))
    assert Path(replica["log_path"]).read_bytes() == expected


def kill_by(how: str, client: Client, server: RunningServer, experiment_id: int) -> None:
    if how == "api":
        client.kill_experiment(experiment_id)
        return
    env = {**os.environ, "MUSTER_HOME": str(server.home), "MUSTER_URL": server.url}
    done = subprocess.run([sys.executable, "-m", "muster", "experiment", "kill",
                           str(experiment_id)], env=env, capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert b"kill requested" in done.stdout


@pytest.mark.timeout(90)
@pytest.mark.parametrize("how", ["api", "cli"])
def test_kill_ends_the_whole_process_group(
    client: Client, tmp_path: Path, server: RunningServer, how: str
) -> None:
    pid_file = tmp_path / "grandchild.pid"
    exp = create(client, tmp_path, "grandchild.py", str(pid_file), "sleep",
                 failure_policy={"stop_grace": "1s"})
    trial = only_trial(exp)
    wait_until(pid_file.exists, timeout=30, what="the grandchild to start")
    grandchild = read_identity(int(pid_file.read_text()))
    assert grandchild is not None
    pgid = shim_record(server.home, trial)["pgid"]
    assert grandchild.pid in live_group(pgid)

    kill_by(how, client, server, exp["id"])
    exp = wait_ended(client, exp["id"])

    assert exp["state"] == "CANCELED"
    trial = only_trial(exp)
    assert trial["state"] == "CANCELED"
    (replica,) = replicas(trial)
    assert replica["reason"] == "STOPPED"
    assert "stopped by muster" in replica["message"]
    assert live_group(pgid) == []
    assert not is_alive(grandchild)


@pytest.mark.timeout(60)
def test_kill_is_idempotent(client: Client, tmp_path: Path) -> None:
    exp = create(client, tmp_path, "ignore_term.py", str(tmp_path / "ready"),
                 failure_policy={"stop_grace": "1s"})
    wait_until((tmp_path / "ready").exists, timeout=30, what="the trial to start")
    first = client.kill_experiment(exp["id"])
    assert first["state"] == "ACTIVE"  # stopping: the grace period is still running
    try:
        again = client.kill_experiment(exp["id"])
    except Conflict as exc:  # it may already have ended
        assert "already CANCELED" in str(exc)
    else:
        assert again["state"] in {"ACTIVE", "CANCELED"}
    ended = wait_ended(client, exp["id"])
    assert ended["state"] == "CANCELED"
    with pytest.raises(Conflict, match=f"experiment {exp['id']} is already CANCELED"):
        client.kill_experiment(exp["id"])
    assert only_trial(client.get_experiment(exp["id"]))["state"] == "CANCELED"


@pytest.mark.timeout(90)
def test_kill_of_a_queued_trial_never_starts_it(client: Client, tmp_path: Path) -> None:
    release = [tmp_path / f"release-{n}" for n in range(4)]
    running = [create(client, tmp_path, "wait_for_file.py", str(path)) for path in release]
    for exp in running:
        wait_trial(client, only_trial(exp)["id"], {"RUNNING"})
    queued = create(client, tmp_path, "exit0.sh")
    assert only_trial(client.get_experiment(queued["id"]))["state"] == "QUEUED"

    client.kill_experiment(queued["id"])
    ended = wait_ended(client, queued["id"])
    assert ended["state"] == "CANCELED"
    trial = only_trial(ended)
    assert (trial["state"], trial["attempts"]) == ("CANCELED", [])
    assert b"".join(client.follow_logs(trial["id"])) == b""  # nothing to show, and it ends

    for path in release:
        path.write_text("go")
    for exp in running:
        assert wait_ended(client, exp["id"])["state"] == "COMPLETED"
    assert only_trial(client.get_experiment(queued["id"]))["attempts"] == []


SHOW_DATA = """\
import os, sys, time

while not os.path.exists(sys.argv[1]):
    time.sleep(0.02)
print(open("data.txt").read(), end="")
"""


@pytest.mark.timeout(60)
def test_the_run_sees_the_context_as_it_was_submitted(
    client: Client, tmp_path: Path, server: RunningServer
) -> None:
    release = tmp_path / "release"
    context = write_context(tmp_path, ["python", "show_data.py", str(release)],
                            files={"show_data.py": SHOW_DATA, "data.txt": "submitted\n"})
    for skipped in (".git", "__pycache__"):
        (context / skipped).mkdir()
        (context / skipped / "big").write_bytes(b"not part of the snapshot")
    exp = submit(client, context)
    (context / "data.txt").write_text("edited after submission\n")
    (context / "new_file.txt").write_text("new\n")
    release.write_text("go")
    exp = wait_ended(client, exp["id"])
    assert exp["state"] == "COMPLETED"
    (replica,) = replicas(only_trial(exp))
    assert Path(replica["log_path"]).read_bytes() == b"submitted\n"
    snapshot = server.home / "experiments" / exp["uuid"] / "context"
    assert (snapshot / "data.txt").read_text() == "submitted\n"
    assert not (snapshot / "new_file.txt").exists()
    assert not (snapshot / ".git").exists() and not (snapshot / "__pycache__").exists()
