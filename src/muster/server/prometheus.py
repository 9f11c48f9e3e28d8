"""`GET /api/v1/metrics`: the cluster in Prometheus's text exposition format (0.0.4).

The format is a few lines of text, so it is written here rather than with a client
library: `cluster_metrics` turns a `ClusterSnapshot` into metrics, `render` writes them.
Both are pure. The route needs the bearer token like every other; Prometheus sends it with
`authorization: {credentials_file: <the server's $MUSTER_HOME/secrets/token>}` in its scrape config.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from muster.services.cluster import ClusterSnapshot, GpuStatus
from muster.services.resources import ReplicaSample
from muster.states import TrialState
from muster.system_metrics import CPU_PERCENT, GPU_MEMORY_BYTES, GPU_UTIL_PERCENT, RSS_BYTES

__all__ = ["CONTENT_TYPE", "Metric", "Sample", "cluster_metrics", "escape_label_value",
           "render"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

Labels = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Sample:
    value: float
    labels: Labels = ()


@dataclass(frozen=True)
class Metric:
    name: str
    kind: Literal["gauge", "counter"]
    help: str
    samples: tuple[Sample, ...]


def render(metrics: Iterable[Metric]) -> str:
    """The exposition text: HELP and TYPE lines, then one `name{labels} value` per sample."""
    lines: list[str] = []
    for metric in metrics:
        lines.append(f"# HELP {metric.name} {_escape_help(metric.help)}")
        lines.append(f"# TYPE {metric.name} {metric.kind}")
        lines += [f"{metric.name}{_labels(sample.labels)} {_number(sample.value)}"
                  for sample in metric.samples]
    return "\n".join(lines) + "\n"


def escape_label_value(value: str) -> str:
    """A label value as the format quotes it: backslash, double quote and newline escaped."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _labels(labels: Labels) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{name}="{escape_label_value(value)}"' for name, value in labels) + "}"


def _number(value: float) -> str:
    if isinstance(value, int) or value.is_integer():
        return str(int(value))
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(value)


def cluster_metrics(snapshot: ClusterSnapshot) -> list[Metric]:
    """The gauges and counters of `GET /metrics`."""
    return [
        _gauge("muster_slots_total", "Replicas without GPUs that may run at once.",
               [Sample(snapshot.slots)]),
        _gauge("muster_slots_used", "Slots taken by trials that hold their resources.",
               [Sample(snapshot.slots_used)]),
        _gauge("muster_queue_length", "Trials waiting in the queue (QUEUED).",
               [Sample(snapshot.queue_length)]),
        *_gpu_metrics(snapshot.gpus),
        _gauge("muster_disk_free_bytes", "Free bytes on each file system holding the muster "
               "home, its run directories or its experiments; labeled with the first path.",
               [Sample(fs.free_bytes, (("path", str(fs.path)),))
                for fs in snapshot.filesystems]),
        _gauge("muster_trials", "Trials in each state.",
               [Sample(n, (("state", state),)) for state, n in snapshot.trial_counts.items()]),
        Metric("muster_trials_ended_total", "counter",
               "Trials that have ended, by final state (rows are never deleted).",
               tuple(Sample(snapshot.trial_counts[state], (("state", state),))
                     for state in TrialState if state.is_terminal())),
        *_replica_metrics(snapshot.replicas),
    ]


# The `system/` series a replica's gauges show, with their help (`muster.system_metrics`).
_REPLICA_GAUGES = (
    ("muster_replica_cpu_percent", CPU_PERCENT,
     "CPU used by each replica of a RUNNING trial (its process group) over its latest "
     "sampling interval, per cent of one core."),
    ("muster_replica_rss_bytes", RSS_BYTES,
     "Resident memory of each replica's process group, at its latest sample."),
    ("muster_replica_gpu_utilization_percent", GPU_UTIL_PERCENT,
     "Mean utilisation of each replica's own GPUs (NVML), at its latest sample."),
    ("muster_replica_gpu_memory_used_bytes", GPU_MEMORY_BYTES,
     "Memory in use on each replica's own GPUs (NVML), at its latest sample."),
)


def _replica_metrics(replicas: tuple[ReplicaSample, ...]) -> list[Metric]:
    """One gauge per resource, a sample per replica of a RUNNING trial: the label sets are
    bounded by the replicas that run at once (`trial`, `rank`)."""
    def labels(replica: ReplicaSample) -> Labels:
        return (("trial", str(replica.trial_id)), ("rank", str(replica.rank)))

    return [_gauge(name, help_text, [Sample(r.values[metric], labels(r)) for r in replicas
                                     if metric in r.values])
            for name, metric, help_text in _REPLICA_GAUGES]


def _gpu_metrics(gpus: tuple[GpuStatus, ...]) -> list[Metric]:
    def labels(gpu: GpuStatus) -> Labels:
        return (("index", str(gpu.index)), ("name", gpu.name), ("type", gpu.type))

    return [
        _gauge("muster_gpu_memory_total_bytes", "Memory of each GPU.",
               [Sample(gpu.memory_total, labels(gpu)) for gpu in gpus]),
        _gauge("muster_gpu_memory_used_bytes",
               "Memory in use on each GPU, read now (no sample when it cannot be read).",
               [Sample(gpu.memory_used, labels(gpu)) for gpu in gpus
                if gpu.memory_used is not None]),
        _gauge("muster_gpu_allocated", "1 while a trial holds the GPU, else 0.",
               [Sample(int(gpu.allocated), labels(gpu)) for gpu in gpus]),
    ]


def _gauge(name: str, help_text: str, samples: list[Sample]) -> Metric:
    return Metric(name, "gauge", help_text, tuple(samples))
