"""`GET /cluster`, `GET /metrics` and `muster cluster status` with a fake GPU inventory."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from muster.client import Client
from muster.config.cluster import FakeGpuConfig
from muster.schedule.inventory import FakeInventory
from tests.server.exposition import Exposition, parse
from tests.server.queueing import serving_with, start_blocker
from tests.servers import RunningServer

pytestmark = pytest.mark.lifecycle  # starts real processes

GIB = 1 << 30
GPUS = [FakeGpuConfig(index=0, name="Fake-A100", memory=40 * GIB, type="a100"),
        FakeGpuConfig(index=1, name="Fake-A100", memory=40 * GIB, type="a100")]
CLUSTER_YAML = """\
gpus:
  - {index: 0, name: Fake-A100, memory: 40GiB, type: a100}
  - {index: 1, name: Fake-A100, memory: 40GiB, type: a100}
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    config = tmp_path_factory.mktemp("config") / "cluster.yaml"
    config.write_text(CLUSTER_YAML)
    with serving_with(tmp_path_factory.mktemp("server") / "home",
                      "--cluster-config", str(config)) as running:
        yield running


@pytest.fixture(scope="module")
def gpu_trial(server: RunningServer, tmp_path_factory: pytest.TempPathFactory
              ) -> dict[str, Any]:
    """A trial that sleeps on one fake A100 for the whole module."""
    with server.client() as c:
        return start_blocker(c, tmp_path_factory.mktemp("blocker"), gpus_per_replica=1,
                             gpu_type="a100")


@pytest.fixture
def inventory(server: RunningServer) -> Iterator[FakeInventory]:
    """The server's fake GPUs, as the test sets their used memory; both at 0 afterwards."""
    fake = FakeInventory(GPUS, server.home / "fake-gpus")
    yield fake
    for gpu in GPUS:
        fake.set_used(gpu.index, 0)


def metrics(server: RunningServer) -> Exposition:
    token = server.token
    answer = httpx.get(f"{server.url}/api/v1/metrics",
                       headers={"Authorization": f"Bearer {token}"})
    assert answer.status_code == 200, answer.text
    return parse(answer.text)


@pytest.mark.timeout(120)
def test_status_shows_each_gpu_its_memory_and_its_trial(
    client: Client, gpu_trial: dict[str, Any], inventory: FakeInventory
) -> None:
    inventory.set_used(1, 5 * GIB)
    info = client.cluster_status()
    assert info["gpu_note"] == "2 fake GPUs from the cluster config"
    held, idle = info["gpus"]
    assert held == {"index": 0, "name": "Fake-A100", "type": "a100",
                    "memory_total_bytes": 40 * GIB, "memory_used_bytes": 0,
                    "memory_error": None, "state": "allocated", "trial_id": gpu_trial["id"]}
    assert idle["memory_used_bytes"] == 5 * GIB and idle["state"] == "free"
    assert idle["trial_id"] is None
    assert info["trial_counts"]["RUNNING"] == 1 and info["trial_counts"]["PAUSED"] == 0
    assert info["queue_length"] == info["queued"] == 0
    assert info["slots_in_use"] == 0  # a replica with GPUs takes no slot
    [filesystem] = info["filesystems"]  # the test's home, runs and experiments share one
    assert filesystem["paths"] == [str(client.home.root), str(client.home.runs_dir),
                                   str(client.home.experiments_dir)]
    assert 0 < filesystem["free_bytes"] <= filesystem["total_bytes"]
    jobs = [job for job in client.list_jobs() if job["trial_id"] == gpu_trial["id"]]
    assert [(job["gpus"], job["gpus_per_replica"], job["gpu_type"]) for job in jobs] == [
        ([0], 1, "a100")]


@pytest.mark.timeout(120)
def test_metrics_show_gpu_memory_and_allocation(
    server: RunningServer, gpu_trial: dict[str, Any], inventory: FakeInventory
) -> None:
    inventory.set_used(1, 5 * GIB)
    parsed = metrics(server)
    gpu1 = {"index": "1", "name": "Fake-A100", "type": "a100"}
    assert parsed.value("muster_gpu_memory_used_bytes", **gpu1) == 5 * GIB
    assert parsed.value("muster_gpu_memory_total_bytes", **gpu1) == 40 * GIB
    assert parsed.value("muster_gpu_allocated", index="0") == 1
    assert parsed.value("muster_gpu_allocated", index="1") == 0


@pytest.mark.timeout(120)
def test_an_unreadable_gpu_says_why_and_has_no_used_sample(
    server: RunningServer, client: Client, gpu_trial: dict[str, Any], inventory: FakeInventory
) -> None:
    inventory.used_path(1).write_text("lots\n")
    gpu = client.cluster_status()["gpus"][1]
    assert gpu["memory_used_bytes"] is None
    assert "must hold a whole number of bytes" in gpu["memory_error"]
    parsed = metrics(server)
    assert parsed.value("muster_gpu_memory_used_bytes", index="1") is None
    assert parsed.value("muster_gpu_memory_used_bytes", index="0") == 0
    env = {**os.environ, "MUSTER_HOME": str(server.home), "MUSTER_URL": server.url,
           "COLUMNS": "250", "NO_COLOR": "1"}
    human = subprocess.run([sys.executable, "-m", "muster", "cluster", "status"], env=env,
                           capture_output=True, text=True, timeout=60, check=True).stdout
    assert "2 fake GPUs from the cluster config" in human
    assert "Fake-A100" in human and "allocated" in human and "unreadable" in human
    assert "1 RUNNING" in human
    assert str(Path(server.home)) in human
