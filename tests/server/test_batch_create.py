"""Batch create: several configs sharing one context upload in one `POST /experiments`,
created together or not at all, against a real server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from muster.client import MAX_BATCH, MAX_BATCH_CONFIG_BYTES, Client, _batches, pack_context
from muster.errors import ConfigError
from muster.home import Home
from muster.server.upload_form import MAX_BATCH as SERVER_MAX_BATCH
from muster.server.upload_form import MAX_BATCH_CONFIG_BYTES as SERVER_MAX_BATCH_BYTES
from tests.server.experiments import config_text, wait_ended
from tests.servers import RunningServer, shared_server

pytestmark = pytest.mark.lifecycle  # starts real processes

server = shared_server()


@pytest.fixture
def client(server: RunningServer) -> Client:
    return Client(url=server.url, home=Home(server.home))


def _context(tmp_path: Path) -> Path:
    context = tmp_path / "context"
    context.mkdir()
    (context / "train.py").write_text("import sys\nprint('arg', sys.argv[1])\n")
    return context


def _experiment_dirs(server: RunningServer) -> set[str]:
    experiments = Home(server.home).experiments_dir
    return {path.name for path in experiments.iterdir()} if experiments.is_dir() else set()


def _count(client: Client) -> int:
    return len(client.list_experiments(archived=True))


def test_a_batch_shares_one_upload_and_every_experiment_runs(client: Client,
                                                             tmp_path: Path) -> None:
    context = _context(tmp_path)
    texts = [config_text(["python", "train.py", str(n)], name=f"batch-{n}") for n in range(3)]
    created = client.create_experiments(texts, context)
    assert [exp["name"] for exp in created] == ["batch-0", "batch-1", "batch-2"]
    assert len({exp["id"] for exp in created}) == 3
    for n, exp in enumerate(created):
        ended = wait_ended(client, exp["id"])
        assert ended["state"] == "COMPLETED"
        trial = ended["trials"][0]
        assert trial["state"] == "SUCCEEDED"
        assert client.read_logs(trial["id"]).data == f"arg {n}\n".encode()


def test_the_contexts_are_copies_of_one_snapshot(server: RunningServer, client: Client,
                                                 tmp_path: Path) -> None:
    before = _experiment_dirs(server)
    created = client.create_experiments(
        [config_text(["python", "train.py", "x"], name=f"copy-{n}") for n in range(2)],
        _context(tmp_path))
    new = sorted(_experiment_dirs(server) - before)
    assert len(new) == 2 == len(created)
    experiments = Home(server.home).experiments_dir
    scripts = [experiments / name / "context" / "train.py" for name in new]
    assert scripts[0].read_bytes() == scripts[1].read_bytes() == (
        tmp_path / "context" / "train.py").read_bytes()
    assert scripts[0] != scripts[1]  # each experiment has a snapshot of its own


def test_one_bad_config_creates_none_and_names_it(server: RunningServer, client: Client,
                                                  tmp_path: Path) -> None:
    before, dirs = _count(client), _experiment_dirs(server)
    good = config_text(["python", "train.py", "1"], name="fine")
    bad = "name: broken\nentrypoint: [python, train.py]\nresources: {replicas: 0}\n"
    with pytest.raises(ConfigError) as info:
        client.create_experiments([good, good, bad], _context(tmp_path))
    assert "config 3 of 3" in str(info.value)
    assert "replicas" in str(info.value)
    assert _count(client) == before
    assert _experiment_dirs(server) == dirs  # no snapshot left behind


def test_a_single_config_still_answers_one_object(server: RunningServer) -> None:
    response = httpx.post(f"{server.url}/api/v1/experiments",
                          headers={"Authorization": f"Bearer {server.token}"},
                          data={"config": config_text(["python", "-c", "pass"], name="one")})
    assert response.status_code == 201
    assert response.json()["name"] == "one"


def test_a_urlencoded_batch_answers_a_list_in_order(server: RunningServer,
                                                    client: Client) -> None:
    texts = [config_text(["python", "-c", "pass"], name=f"form-{n}") for n in range(3)]
    response = httpx.post(f"{server.url}/api/v1/experiments",
                          headers={"Authorization": f"Bearer {server.token}"},
                          data={"config": texts})
    assert response.status_code == 201
    assert [exp["name"] for exp in response.json()] == ["form-0", "form-1", "form-2"]
    for exp in response.json():
        assert wait_ended(client, exp["id"])["state"] == "COMPLETED"


@pytest.mark.parametrize("kind", ["multipart", "urlencoded"])
def test_more_configs_than_a_batch_holds_are_refused(server: RunningServer, client: Client,
                                                     tmp_path: Path, kind: str) -> None:
    before = _count(client)
    texts = ["name: x\nentrypoint: [python, -c, pass]\n"] * (SERVER_MAX_BATCH + 1)
    files = ({"context": ("c.tar.gz", pack_context(_context(tmp_path)), "application/gzip")}
             if kind == "multipart" else None)
    response = httpx.post(f"{server.url}/api/v1/experiments",
                          headers={"Authorization": f"Bearer {server.token}"},
                          data={"config": texts}, files=files, timeout=60)
    assert response.status_code == 413
    assert f"more than {SERVER_MAX_BATCH} `config` fields" in response.json()["message"]
    assert _count(client) == before


def test_configs_over_the_batch_byte_limit_are_refused(server: RunningServer,
                                                       client: Client) -> None:
    before = _count(client)
    padding = "# " + "x" * (900 * 1024) + "\n"  # under a config's 1 MiB, not 18 of them
    texts = [f"name: big\nentrypoint: [python, -c, pass]\n{padding}"] * 19
    files = {"unused": ("u", b"", "application/octet-stream")}  # a multipart form
    response = httpx.post(f"{server.url}/api/v1/experiments",
                          headers={"Authorization": f"Bearer {server.token}"},
                          data={"config": texts}, files=files, timeout=60)
    assert response.status_code == 413
    assert "configs are larger than 16 MiB together" in response.json()["message"]
    assert _count(client) == before


def test_the_sdk_splits_what_one_request_cannot_hold() -> None:
    assert (MAX_BATCH, MAX_BATCH_CONFIG_BYTES) == (SERVER_MAX_BATCH, SERVER_MAX_BATCH_BYTES)
    batches = list(_batches(["a"] * (2 * MAX_BATCH + 1)))
    assert [len(batch) for batch in batches] == [MAX_BATCH, MAX_BATCH, 1]
    big = "y" * (MAX_BATCH_CONFIG_BYTES // 3 + 1)
    assert [len(batch) for batch in _batches([big] * 4)] == [2, 2]


def test_a_batch_over_the_limit_from_the_sdk_still_creates_all(client: Client,
                                                               monkeypatch: pytest.MonkeyPatch
                                                               ) -> None:
    """The SDK's own split: three requests of two for five configs (the limit lowered on
    the client only), every experiment created once, in order."""
    monkeypatch.setattr("muster.client.MAX_BATCH", 2)
    texts = [config_text(["python", "-c", "pass"], name=f"split-{n}") for n in range(5)]
    created = client.create_experiments(texts, None)
    assert [exp["name"] for exp in created] == [f"split-{n}" for n in range(5)]


def test_the_cli_creates_a_batch_and_waits(server: RunningServer, tmp_path: Path) -> None:
    context = _context(tmp_path)
    for n in range(2):
        (context / f"exp{n}.yaml").write_text(
            config_text(["python", "train.py", str(n)], name=f"cli-{n}"))
    env = {**os.environ, "MUSTER_HOME": str(server.home), "MUSTER_URL": server.url}
    done = subprocess.run([sys.executable, "-m", "muster", "experiment", "create-batch",
                           str(context / "exp0.yaml"), str(context / "exp1.yaml"), "--wait",
                           "--json"], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    ended = json.loads(done.stdout)
    assert [(exp["name"], exp["state"]) for exp in ended] == [("cli-0", "COMPLETED"),
                                                             ("cli-1", "COMPLETED")]
