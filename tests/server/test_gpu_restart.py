"""A server SIGKILLed while trials hold GPUs: the restarted server finds every allocation,
books none twice and loses none."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from muster.client import Client
from tests.server.experiments import FAST_POLICY, wait_trial
from tests.server.queueing import serving_with
from tests.servers import RunningServer
from tests.waiting import wait_until

pytestmark = [pytest.mark.lifecycle, pytest.mark.timeout(120)]
FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "fake_gpu_job.py"
CLUSTER_YAML = """\
gpus:
  - {index: 0, name: Fake-A100, memory: 40GiB}
  - {index: 1, name: Fake-A100, memory: 40GiB}
"""


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RunningServer]:
    config = tmp_path / "cluster.yaml"
    config.write_text(CLUSTER_YAML)
    with serving_with(tmp_path / "home", "--cluster-config", str(config)) as running:
        yield running


def gpu_job(client: Client, server: RunningServer, tmp_path: Path, name: str,
            **resources: Any) -> tuple[int, Path]:
    release = tmp_path / f"release-{name}"
    config = {"name": name, "entrypoint": ["python", str(FIXTURE)],
              "environment": {"variables": {"FAKE_GPUS_DIR": str(server.home / "fake-gpus"),
                                            "RELEASE": str(release)}},
              "resources": resources, "failure_policy": FAST_POLICY}
    context = tmp_path / f"context-{name}"
    context.mkdir()
    return client.create_experiment(json.dumps(config), context)["trials"][0]["id"], release


def holders(client: Client) -> dict[int, tuple[str, int | None]]:
    return {g["index"]: (g["state"], g["trial_id"]) for g in client.cluster_status()["gpus"]}


def test_a_sigkilled_server_keeps_its_gpu_allocations(server: RunningServer,
                                                      tmp_path: Path) -> None:
    with server.client() as client:
        first, release_first = gpu_job(client, server, tmp_path, "first", gpus_per_replica=1)
        wait_trial(client, first, {"RUNNING"})
        before = holders(client)
    assert sorted(before.values()) == [("allocated", first), ("free", None)]
    server.kill()
    server.start_with(["--min-free-disk", "0", "--slots", "1", "--cluster-config",
                       str(tmp_path / "cluster.yaml")])
    with server.client() as client:
        assert holders(client) == before  # nothing lost, nothing freed under a live trial
        second, release_second = gpu_job(client, server, tmp_path, "second",
                                         gpus_per_replica=2)
        # A new trial is QUEUED at once; the next supervisor pass writes its reason.
        reason = wait_until(lambda: client.get_trial(second)["queue_reason"], timeout=30,
                            what=f"trial {second} to get a queue reason")
        assert reason == "position 1: waiting for 2 GPUs, 1 free"
        release_first.touch()
        assert wait_trial(client, first, {"SUCCEEDED", "FAILED"})["state"] == "SUCCEEDED"
        wait_trial(client, second, {"RUNNING"})
        assert sorted(holders(client).values()) == [("allocated", second)] * 2
        release_second.touch()
        assert wait_trial(client, second, {"SUCCEEDED", "FAILED"})["state"] == "SUCCEEDED"
    assert not list((server.home / "fake-gpus").glob("*/holder"))
