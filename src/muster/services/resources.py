"""Each replica's resources as the `system/` series hold them (`muster.system_metrics`).

What `trial describe` shows (`replica_resources`: each rank's latest sample and peak) and
what `/metrics` exports (`running_replicas`: the latest sample of each replica of a RUNNING
trial). Both read the series rows alone, never the samples: a row per resource and rank,
whose highest value is the peak and whose curve's last point the latest sample, however
long the trial ran.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sqlalchemy import select
from sqlalchemy.orm import Session

from muster import api
from muster.downsample import stored_last
from muster.states import MetricKind, TrialState
from muster.store import MetricSeries, Trial
from muster.system_metrics import (
    CPU_PERCENT,
    GPU_MEMORY_BYTES,
    GPU_UTIL_PERCENT,
    RSS_BYTES,
    split_series_name,
)

__all__ = ["ReplicaSample", "replica_resources", "running_replicas"]


@dataclass(frozen=True)
class ReplicaSample:
    """The latest sample of one replica of a RUNNING trial: `{metric name: value}`."""

    trial_id: int
    rank: int
    values: dict[str, float]


@dataclass
class _Rank:
    """What one rank's series say, as they are read."""

    readings: dict[str, api.ResourceReading] = field(default_factory=dict)
    samples: int = 0
    sampled_at: float | None = None


def replica_resources(s: Session, trial_id: int) -> list[api.ReplicaResources]:
    """Each rank's latest sample and peak of every resource it sampled, by rank."""
    rows = s.execute(select(MetricSeries.name, MetricSeries.reports, MetricSeries.highest,
                            MetricSeries.curve)
                     .where(MetricSeries.trial_id == trial_id,
                            MetricSeries.kind == MetricKind.SYSTEM))
    ranks: dict[int, _Rank] = {}
    for name, reports, highest, curve in rows:
        found = split_series_name(name)
        last = stored_last(curve)
        if found is None or last is None or highest is None:
            continue
        metric, rank = found
        seen = ranks.setdefault(rank, _Rank())
        seen.readings[metric] = {"latest": last[1], "peak": highest}
        seen.samples = max(seen.samples, reports)
        at = last[0] / 1000  # a sample's step is its time in milliseconds
        seen.sampled_at = at if seen.sampled_at is None else max(seen.sampled_at, at)
    return [_resources(rank, ranks[rank]) for rank in sorted(ranks)]


def running_replicas(s: Session) -> list[ReplicaSample]:
    """The latest sample of each replica of the RUNNING trials, by trial and rank."""
    rows = s.execute(select(MetricSeries.trial_id, MetricSeries.name, MetricSeries.curve)
                     .join(Trial, Trial.id == MetricSeries.trial_id)
                     .where(Trial.state == TrialState.RUNNING,
                            MetricSeries.kind == MetricKind.SYSTEM))
    found: dict[tuple[int, int], dict[str, float]] = {}
    for trial_id, name, curve in rows:
        series = split_series_name(name)
        last = stored_last(curve)
        if series is not None and last is not None:
            found.setdefault((trial_id, series[1]), {})[series[0]] = last[1]
    return [ReplicaSample(trial_id, rank, values)
            for (trial_id, rank), values in sorted(found.items())]


def _resources(rank: int, seen: _Rank) -> api.ReplicaResources:
    get = seen.readings.get
    return {"rank": rank, "samples": seen.samples, "sampled_at": seen.sampled_at,
            "cpu_percent": get(CPU_PERCENT), "rss_bytes": get(RSS_BYTES),
            "gpu_util_percent": get(GPU_UTIL_PERCENT),
            "gpu_memory_bytes": get(GPU_MEMORY_BYTES)}
