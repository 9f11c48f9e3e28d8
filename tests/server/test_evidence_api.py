"""Evidence on request through a real server: `POST /trials/{id}/dump` asks the shims of a
running trial for a bundle and answers with each rank's line; the replica rows keep it;
`GET /trials/{id}/evidence` streams the attempt's bundles as a tar.gz that `muster trial
evidence` unpacks; and the CLI's `muster trial dump`, `describe` and `evidence` say it all."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest

from muster.client import Client
from muster.errors import Conflict, InvalidRequest, NotFound
from muster.rundir import BUNDLE_ID
from muster.services.evidence import DumpsInFlight
from tests.server.experiments import (
    FIXTURES,
    attempt_dir,
    only_trial,
    wait_ended,
    wait_trial,
)
from tests.servers import RunningServer, shared_server
from tests.waiting import wait_until

pytestmark = pytest.mark.lifecycle

server = shared_server()


def marked_line(marker: str) -> int:
    lines = (FIXTURES / "stuck.py").read_text().splitlines()
    return next(n for n, text in enumerate(lines, 1) if text.endswith(f"# {marker}"))


def stuck_trial(client: Client, parent: Path, *args: str, replicas: int = 1,
                secret: str | None = None) -> dict[str, Any]:
    """A trial running tests/fixtures/stuck.py ARGS, once every rank printed "stuck"."""
    context = parent / "context"
    context.mkdir()
    (context / "stuck.py").write_bytes((FIXTURES / "stuck.py").read_bytes())
    config: dict[str, Any] = {"name": "stuck", "entrypoint": ["python", "stuck.py", *args],
                              "resources": {"replicas": replicas},
                              "failure_policy": {"stop_grace": "2s"}}
    if secret is not None:  # printed by the script: the evidence shows it masked
        config["environment"] = {"secrets": ["SHOWN"]}
        config["entrypoint"] = ["sh", "-c", 'echo "token $SHOWN"; exec python stuck.py "$@"',
                                "sh", *args]
    (context / "experiment.yaml").write_text(json.dumps(config))
    created = client.create_experiment((context / "experiment.yaml").read_text(), context,
                                       secrets=None if secret is None else {"SHOWN": secret})
    trial = only_trial(created)
    wait_trial(client, trial["id"], {"RUNNING"})
    for rank in range(replicas):
        log = attempt_dir(client_home(client), trial, 1) / f"rank-{rank}.log"
        wait_until(lambda log=log: log.exists() and b"stuck" in log.read_bytes(), timeout=120,
                   what=f"rank {rank} of trial {trial['id']} to get stuck")
    return trial


def client_home(client: Client) -> Path:
    return client.home.root


def muster(server: RunningServer, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """`python -m muster ARGS` against `server`, as a person would type it."""
    env = {**os.environ, "MUSTER_HOME": str(server.home), "MUSTER_URL": server.url,
           "NO_COLOR": "1", "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "muster", *args], env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=90)


def test_a_dump_names_the_lock_line_and_the_bundle_comes_back(
        server: RunningServer, client: Client, tmp_path: Path) -> None:
    trial = stuck_trial(client, tmp_path, "lock")
    line = f"rank 0 waits in Lock.acquire at stuck.py:{marked_line('LOCK_LINE')}"
    done = muster(server, "trial", "dump", str(trial["id"]), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    printed = done.stdout.splitlines()
    assert printed[0] == line
    bundle = printed[1].split()[1]
    assert BUNDLE_ID.fullmatch(bundle) and bundle.endswith("-requested")
    assert f"muster trial evidence {trial['id']} --attempt 1 DIR" in printed[1]
    # The replica keeps its latest bundle and line; describe shows them.
    (replica,) = client.get_trial(trial["id"])["attempts"][0]["replicas"]
    assert (replica["evidence"], replica["stack_summary"]) == (f"evidence/{bundle}", line)
    described = muster(server, "trial", "describe", str(trial["id"]), cwd=tmp_path).stdout
    assert f"attempt 1 (evidence/{bundle}): {line}" in described
    # The bundle, through the CLI, unpacked: every file of the rank's part.
    got = muster(server, "trial", "evidence", str(trial["id"]), "out", cwd=tmp_path)
    assert got.returncode == 0, got.stderr
    part = tmp_path / "out" / bundle / "rank-0"
    assert sorted(p.name for p in part.iterdir()) == [
        "log-tail.txt", "processes.json", "stacks.json", "stacks.txt", "summary.json"]
    assert json.loads((part / "summary.json").read_text())["line"] == line
    assert "wait_on_lock (stuck.py:" in (part / "stacks.txt").read_text()
    # A second dump: another bundle (ids have whole seconds: it waits for the next one).
    again = client.dump_trial(trial["id"])
    assert again["bundle"] != bundle and again["ranks"][0]["complete"]
    # Once the trial has ended there is nothing to dump, but its evidence is kept.
    client.kill_experiment(trial["experiment_id"])
    wait_ended(client, trial["experiment_id"])
    with pytest.raises(Conflict, match="only a RUNNING trial's processes can be dumped"):
        client.dump_trial(trial["id"])
    client.download_evidence(trial["id"], tmp_path / "later", attempt=1)
    assert sorted(p.name for p in (tmp_path / "later").iterdir()) == sorted(
        [bundle, again["bundle"]])
    with pytest.raises(InvalidRequest, match="with files in it"):
        client.download_evidence(trial["id"], tmp_path / "later")
    with pytest.raises(NotFound, match="has no attempt 2"):
        client.download_evidence(trial["id"], tmp_path / "none", attempt=2)


def test_two_gloo_ranks_are_dumped_together(client: Client, tmp_path: Path) -> None:
    trial = stuck_trial(client, tmp_path, "all-reduce", "store", replicas=2)
    result = client.dump_trial(trial["id"])
    assert [part["line"] for part in result["ranks"]] == [
        f"rank 0 waits in time.sleep at stuck.py:{marked_line('SLEEP_LINE')}",
        f"rank 1 waits in all_reduce at stuck.py:{marked_line('ALL_REDUCE_LINE')}"]
    assert all(part["complete"] and part["tool"] == "py-spy" for part in result["ranks"])
    assert result["path"] == str(attempt_dir(client_home(client), trial, 1) / "evidence"
                                 / result["bundle"])
    client.kill_experiment(trial["experiment_id"])


def test_the_archive_masks_secrets_and_holds_only_regular_files(
        server: RunningServer, client: Client, tmp_path: Path) -> None:
    trial = stuck_trial(client, tmp_path, "lock")
    result = client.dump_trial(trial["id"])
    evidence = attempt_dir(server.home, trial, 1) / "evidence"
    (evidence / result["bundle"] / "rank-0" / "planted").symlink_to("/etc/passwd")
    response = httpx.get(f"{server.url}/api/v1/trials/{trial['id']}/evidence",
                         headers={"Authorization": f"Bearer {server.token}"}, timeout=30)
    assert response.status_code == 200 and response.headers["x-muster-attempt"] == "1"
    assert response.headers["content-type"] == "application/gzip"
    assert response.headers["content-disposition"] == (
        f'attachment; filename="trial-{trial["id"]}-attempt-1-evidence.tar.gz"')
    archive = tmp_path / "evidence.tar.gz"
    archive.write_bytes(response.content)
    with tarfile.open(archive) as tar:
        members = tar.getmembers()
    assert all(m.isreg() and m.name.startswith(f"evidence/{result['bundle']}/rank-0/")
               for m in members)
    assert "planted" not in {Path(m.name).name for m in members}
    client.kill_experiment(trial["experiment_id"])


def test_a_secret_the_trial_printed_is_masked_in_its_evidence(
        server: RunningServer, client: Client, tmp_path: Path) -> None:
    trial = stuck_trial(client, tmp_path, "lock", secret="s3cr3t-value-123")
    assert b"token s3cr3t-value-123" in (attempt_dir(server.home, trial, 1)
                                         / "rank-0.log").read_bytes()
    client.dump_trial(trial["id"])
    client.download_evidence(trial["id"], tmp_path / "out")
    (tail,) = (tmp_path / "out").glob("*/rank-0/log-tail.txt")
    assert tail.read_text().startswith("token ****************\n")
    client.kill_experiment(trial["experiment_id"])


def test_what_cannot_be_dumped_or_downloaded_is_said(client: Client, tmp_path: Path) -> None:
    with pytest.raises(NotFound, match="trial 999999 does not exist"):
        client.dump_trial(999999)
    trial = stuck_trial(client, tmp_path, "lock")
    with pytest.raises(NotFound, match="has no evidence bundle"):
        client.download_evidence(trial["id"], tmp_path / "out")
    client.kill_experiment(trial["experiment_id"])


def test_one_dump_per_trial_at_a_time() -> None:
    dumps = DumpsInFlight()
    with dumps.holding(7):
        with pytest.raises(Conflict, match="a dump of trial 7 is under way"), \
                dumps.holding(7):
            pass
        with dumps.holding(8):  # another trial's is its own
            pass
    with dumps.holding(7):  # and once the first is done, the next
        pass
    taken: list[bool] = []

    def take() -> None:
        try:
            with dumps.holding(9):
                taken.append(True)
                barrier.wait(timeout=5)
        except Conflict:
            taken.append(False)
            barrier.wait(timeout=5)

    barrier = threading.Barrier(2)
    threads = [threading.Thread(target=take) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(taken) == [False, True]
