"""`GET /api/v1/cluster` and `muster cluster status`: slots, queue and the disk guard."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

from muster.client import Client
from tests.servers import RunningServer

pytestmark = pytest.mark.lifecycle  # starts real processes

def test_cluster_status_reports_slots_queue_and_disk(client: Client) -> None:
    info = client.cluster_status()
    assert info["slots"] == 4 and info["slots_in_use"] == 0 and info["queued"] == 0
    assert info["min_free_disk_bytes"] == 0 and info["disk_ok"] is True
    assert info["free_disk_bytes"] > 0
    assert info["disk_message"].endswith("required")
    # One node with the local launcher: this machine, where its ranks meet.
    assert info["nodes"] == [{"id": socket.gethostname(), "address": "127.0.0.1",
                              "alive": True, "cpus": os.cpu_count(), "gpus": 0,
                              "cpus_free": None, "gpus_free": 0.0,
                              "hostname": socket.gethostname(), "quarantined": False,
                              "quarantine_reason": None, "replicas": []}]


def test_the_cli_shows_it_and_says_when_launches_wait(server: RunningServer) -> None:
    server.stop()
    guarded = RunningServer(home=server.home, db_url=server.db_url)
    guarded.start_with(["--min-free-disk", "1000000TiB"])
    try:
        env = {**os.environ, "MUSTER_HOME": str(server.home), "MUSTER_URL": guarded.url}
        run = subprocess.run([sys.executable, "-m", "muster", "cluster", "status", "--json"],
                             env=env, capture_output=True, text=True, timeout=60, check=True)
        info = json.loads(run.stdout)
        assert info["disk_ok"] is False
        assert info["disk_message"].startswith("waiting for disk: ")
        human = subprocess.run([sys.executable, "-m", "muster", "cluster", "status"], env=env,
                               capture_output=True, text=True, timeout=60, check=True)
        assert "launches wait" in human.stdout and "waiting for disk" in human.stdout
        assert f"node {socket.gethostname()} (127.0.0.1): alive, {os.cpu_count()} CPUs" in (
            human.stdout)
    finally:
        guarded.stop()
