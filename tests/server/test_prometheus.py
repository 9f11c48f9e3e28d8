"""The Prometheus text of `GET /metrics`, from a snapshot made by hand (no server)."""

from __future__ import annotations

from pathlib import Path

import pytest

from muster.server.prometheus import (
    Metric,
    Sample,
    cluster_metrics,
    escape_label_value,
    render,
)
from muster.services.cluster import ClusterSnapshot, Filesystem, GpuStatus
from muster.services.resources import ReplicaSample
from muster.states import TrialState
from muster.system_metrics import CPU_PERCENT, GPU_MEMORY_BYTES, GPU_UTIL_PERCENT, RSS_BYTES
from tests.server.exposition import parse

GIB = 1 << 30


def snapshot(gpus: tuple[GpuStatus, ...] = (),
             replicas: tuple[ReplicaSample, ...] = ()) -> ClusterSnapshot:
    counts = {state.value: 0 for state in TrialState}
    counts.update(QUEUED=3, RUNNING=1, SUCCEEDED=5, FAILED=2)
    return ClusterSnapshot(
        slots=4, slots_used=1, trial_counts=counts, gpus=gpus, gpu_note="2 fake GPUs",
        gpu_source="fake",
        filesystems=(Filesystem((Path("/h"), Path("/h/runs")), 10 * GIB, 100 * GIB),
                     Filesystem((Path("/data/exp"),), 7, 9)),
        replicas=replicas,
    )


A100 = GpuStatus(0, "Fake-A100", "a100", 40 * GIB, 3 * GIB, None, "allocated", 7)
BROKEN = GpuStatus(1, "Fake-A100", "a100", 40 * GIB, None, "cannot read it", "free", None)


@pytest.mark.parametrize(("raw", "escaped"), [
    ("plain", "plain"),
    ('say "hi"', 'say \\"hi\\"'),
    ("back\\slash", "back\\\\slash"),
    ("two\nlines", "two\\nlines"),
    ('\\"\n', '\\\\\\"\\n'),
])
def test_label_values_are_escaped(raw: str, escaped: str) -> None:
    assert escape_label_value(raw) == escaped


def test_render_writes_help_type_and_samples() -> None:
    text = render([Metric("m_total", "counter", "Things.\nMore.",
                          (Sample(3, (("a", 'x"y'),)), Sample(0.5)))])
    assert text == ('# HELP m_total Things.\\nMore.\n# TYPE m_total counter\n'
                    'm_total{a="x\\"y"} 3\nm_total 0.5\n')


def test_odd_label_values_survive_the_round_trip() -> None:
    odd = GpuStatus(0, 'GPU "one"\\\n', "a100", GIB, 0, None, "free", None)
    parsed = parse(render(cluster_metrics(snapshot((odd,)))))
    assert parsed.value("muster_gpu_memory_total_bytes", name='GPU "one"\\\n') == GIB


def test_every_metric_of_the_cluster_is_there() -> None:
    parsed = parse(render(cluster_metrics(snapshot((A100, BROKEN)))))
    assert parsed.value("muster_slots_total") == 4
    assert parsed.value("muster_slots_used") == 1
    assert parsed.value("muster_queue_length") == 3
    assert parsed.value("muster_gpu_memory_total_bytes", index="0", type="a100") == 40 * GIB
    assert parsed.value("muster_gpu_memory_used_bytes", index="0", name="Fake-A100") == 3 * GIB
    assert parsed.value("muster_gpu_allocated", index="0") == 1
    assert parsed.value("muster_gpu_allocated", index="1") == 0
    assert parsed.value("muster_disk_free_bytes", path="/h") == 10 * GIB
    assert parsed.value("muster_disk_free_bytes", path="/data/exp") == 7
    assert parsed.value("muster_trials_ended_total", state="FAILED") == 2
    assert parsed.type["muster_trials_ended_total"] == "counter"
    assert parsed.type["muster_queue_length"] == "gauge"


def test_an_unreadable_gpu_has_no_used_memory_sample() -> None:
    parsed = parse(render(cluster_metrics(snapshot((A100, BROKEN)))))
    assert parsed.value("muster_gpu_memory_used_bytes", index="1") is None
    assert parsed.value("muster_gpu_memory_total_bytes", index="1") == 40 * GIB


def test_every_trial_state_has_a_gauge_and_every_final_state_a_counter() -> None:
    parsed = parse(render(cluster_metrics(snapshot())))
    for state in TrialState:
        assert parsed.value("muster_trials", state=state.value) is not None, state
    ended = {labels["state"] for name, labels, _ in parsed.samples
             if name == "muster_trials_ended_total"}
    assert ended == {"SUCCEEDED", "FAILED", "CANCELED"}
    assert parsed.value("muster_trials", state="PAUSED") == 0


def test_without_gpus_the_gpu_metrics_have_help_and_no_samples() -> None:
    parsed = parse(render(cluster_metrics(snapshot())))
    assert "muster_gpu_allocated" in parsed.type
    assert not [s for s in parsed.samples if s[0].startswith("muster_gpu_")]


def test_each_running_replica_has_its_latest_resources() -> None:
    gpu = ReplicaSample(7, 0, {CPU_PERCENT: 101.5, RSS_BYTES: 3 * GIB, GPU_UTIL_PERCENT: 97.0,
                               GPU_MEMORY_BYTES: 30 * GIB})
    cpu_only = ReplicaSample(8, 1, {CPU_PERCENT: 0.0, RSS_BYTES: 5 << 20})
    parsed = parse(render(cluster_metrics(snapshot(replicas=(gpu, cpu_only)))))
    assert parsed.value("muster_replica_cpu_percent", trial="7", rank="0") == 101.5
    assert parsed.value("muster_replica_rss_bytes", trial="7", rank="0") == 3 * GIB
    assert parsed.value("muster_replica_gpu_utilization_percent", trial="7", rank="0") == 97
    assert parsed.value("muster_replica_gpu_memory_used_bytes", trial="7", rank="0") == 30 * GIB
    assert parsed.value("muster_replica_cpu_percent", trial="8", rank="1") == 0
    assert parsed.value("muster_replica_rss_bytes", trial="8", rank="1") == 5 << 20
    # no GPUs, no GPU sample: never a made-up 0
    assert parsed.value("muster_replica_gpu_utilization_percent", trial="8", rank="1") is None
    labels = {tuple(sorted(labels)) for name, labels, _ in parsed.samples
              if name.startswith("muster_replica_")}
    assert labels == {("rank", "trial")}
    assert parsed.type["muster_replica_cpu_percent"] == "gauge"
