"""Live resources (issue 36, deliverable 5) on a real server: each replica's CPU and memory,
sampled by its shim into the `system/` series, in `trial describe` (latest and peak per
rank), in the series the trial page charts, and in `/metrics` while the trial runs; and
the samples never count as the trial's own evidence of training."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from muster.client import Client
from muster.system_metrics import CPU_PERCENT, RSS_BYTES, series_name
from tests.cli.test_cli import on
from tests.server.experiments import TRIAL_ENDED, only_trial, wait_trial
from tests.server.exposition import parse
from tests.servers import RunningServer, serving
from tests.waiting import wait_until

pytestmark = [pytest.mark.lifecycle, pytest.mark.timeout(240)]

MiB = 1 << 20
INTERVAL = 0.25  # the cluster config's system_metrics_interval: a sample every 0.25 s
# Holds 64 MiB and computes until the file argv[1] exists (or for argv[2] seconds).
WORK = """\
import os, sys, time
held = b"x" * (64 << 20)
print("holding 64 MiB", flush=True)
end = time.monotonic() + float(sys.argv[2])
while not os.path.exists(sys.argv[1]) and time.monotonic() < end:
    sum(i * i for i in range(10_000))
print("done", flush=True)
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    top = tmp_path_factory.mktemp("resources")
    cluster = top / "cluster.yaml"
    cluster.write_text(f"system_metrics_interval: {INTERVAL}s\n")
    with serving(top / "home", options=("--min-free-disk", "0",
                                        "--cluster-config", str(cluster))) as running:
        yield running


@pytest.fixture
def client(server: RunningServer) -> Iterator[Client]:
    with server.client() as made:
        yield made


def submit(client: Client, parent: Path, seconds: float, replicas: int = 1,
           verify: dict[str, Any] | None = None) -> tuple[dict[str, Any], Path]:
    """A trial of WORK with `replicas` replicas; returns it and the file that ends it."""
    context = parent / "context"
    context.mkdir()
    (context / "work.py").write_text(WORK)
    stop = parent / "stop"
    config = {"name": "resources", "entrypoint": ["python", "work.py", str(stop), str(seconds)],
              "resources": {"replicas": replicas}, "failure_policy": {"stop_grace": "2s"},
              "verify": verify or {}}
    exp: dict[str, Any] = dict(client.create_experiment(json.dumps(config), context))
    return only_trial(exp), stop


def replicas_sampled(client: Client, trial_id: int, ranks: int, samples: int
                     ) -> list[dict[str, Any]]:
    resources: list[dict[str, Any]] = client.get_trial(trial_id)["resources"]  # type: ignore[assignment]
    enough = len(resources) == ranks and all(r["samples"] >= samples for r in resources)
    return resources if enough else []


def prometheus(server: RunningServer) -> Any:
    answer = httpx.get(f"{server.url}/api/v1/metrics",
                       headers={"Authorization": f"Bearer {server.token}"})
    assert answer.status_code == 200
    return parse(answer.text)


def test_each_replica_has_its_resources_while_it_runs_and_after(
        server: RunningServer, client: Client, tmp_path: Path) -> None:
    trial, stop = submit(client, tmp_path, seconds=120, replicas=2)
    running = wait_until(lambda: replicas_sampled(client, trial["id"], 2, 4), timeout=90,
                         what="four samples of each replica")
    for replica in running:
        # 64 MiB held by each rank's process, and CPU used to compute
        assert replica["rss_bytes"]["peak"] >= 64 * MiB
        assert replica["cpu_percent"]["peak"] > 0
        assert replica["gpu_util_percent"] is None  # no GPU here: no GPU series at all
        assert replica["gpu_memory_bytes"] is None
        assert replica["sampled_at"] is not None
    assert [r["rank"] for r in running] == [0, 1]

    scraped = wait_until(lambda: (p := prometheus(server)).value(
        "muster_replica_rss_bytes", trial=str(trial["id"]), rank="1") and p, timeout=30,
        what="the replicas in /metrics")
    for rank in ("0", "1"):
        assert scraped.value("muster_replica_rss_bytes", trial=str(trial["id"]),
                             rank=rank) >= 64 * MiB
        assert scraped.value("muster_replica_cpu_percent", trial=str(trial["id"]),
                             rank=rank) is not None
        assert scraped.value("muster_replica_gpu_utilization_percent",
                             trial=str(trial["id"]), rank=rank) is None

    described = on(server, "trial", "describe", str(trial["id"]))
    assert described.returncode == 0, described.stderr
    table = described.stdout[described.stdout.index("Resources, latest / peak"):]
    assert "CPU % (of one core)" in table and "Memory (RSS)" in table
    rows = [line.split("│") for line in table.splitlines() if line.startswith("│")]
    assert [row[1].strip() for row in rows if row[1].strip().isdigit()] == ["0", "1"]

    stop.touch()
    ended = wait_trial(client, trial["id"], TRIAL_ENDED, timeout=60)
    after = ended["resources"]
    assert [r["rank"] for r in after] == [0, 1]
    assert all(r["rss_bytes"]["peak"] >= 64 * MiB for r in after)  # the peak stays
    # only RUNNING trials' replicas are exported: the label sets stay bounded
    assert prometheus(server).value("muster_replica_rss_bytes", trial=str(trial["id"]),
                                    rank="0") is None

    answer = httpx.get(f"{server.url}/api/v1/trials/{trial['id']}/series",  # the page's
                       headers={"Authorization": f"Bearer {server.token}"})
    series = {s["name"]: s for s in answer.json()["series"] if s["kind"] == "system"}
    for number in (0, 1):
        cpu = series[series_name(CPU_PERCENT, number)]
        rss = series[series_name(RSS_BYTES, number)]
        assert cpu["reports"] == after[number]["samples"] and cpu["reports"] >= 4
        assert rss["highest"] == after[number]["rss_bytes"]["peak"]
        assert rss["values"][-1] == after[number]["rss_bytes"]["latest"]


def test_samples_are_no_evidence_of_training(client: Client, tmp_path: Path) -> None:
    """A script that reports nothing fails `require_metrics` exactly as it did before there
    were samples, although it ran long enough for many of them."""
    trial, _ = submit(client, tmp_path, seconds=3, verify={"require_metrics": ["loss"]})
    ended = wait_trial(client, trial["id"], TRIAL_ENDED | {"SUSPECT"}, timeout=90)
    samples = client.all_metrics(trial["id"], kind="system")
    assert len(samples) >= 5  # it was sampled, and the samples are stored
    assert all(set(s["metrics"]) <= {CPU_PERCENT, RSS_BYTES} for s in samples)
    assert client.all_metrics(trial["id"]) == []  # none is among its reports
    assert ended["state"] == "SUSPECT"
    assert ended["verdict"] == "SUSPECT: require_metrics: loss was never reported"
    assert ended["best_validation"] == {}
    checks = {c["name"]: (c["status"], c["detail"]) for c in ended["verification"]["checks"]}
    assert checks["require_metrics"] == ("failed", "loss was never reported")
    assert checks["finite_metrics"] == ("not_run", "not run: no metric reported")
    assert checks["metrics_readable"] == ("not_run", "not run: no metric line was written")
    assert checks["completed"][0] == "not_run"
    assert not ended["verification"]["verified"]
