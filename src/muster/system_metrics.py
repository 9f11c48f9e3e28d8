"""The `system/` series: each replica's resources, sampled by its shim while it runs.

Every `interval` seconds (the cluster config's `system_metrics_interval`, 10 s by default)
the shim of each replica (`muster.launch.resources`) appends one line to its
`RankFile.SYSTEM` file, in the metrics-lines format (`muster.metrics_lines`) with kind
`system`; ingestion stores it as a `metrics` row of that kind (source `shim`) and folds it
into one series per metric and rank. A line holds what could be read:

- `system/cpu_percent`: the CPU time the replica's process group used over the interval,
  per cent of one core (400 = four cores busy);
- `system/rss_bytes`: the summed resident memory of the group's processes;
- `system/gpu_util_percent`, `system/gpu_memory_bytes`: with GPUs, through NVML, the mean
  utilisation and the summed used memory of the replica's own GPUs (absent without them).

A line's `step` is its time in whole milliseconds, so a replica's samples rise through its
attempts and a chart's x is the clock. These samples describe the machine, not the run:
no verification, progress, searcher or export ever reads them as evidence of training.

A series is named by metric and rank (`series_name`: `system/cpu_percent/rank-1`), unlike
the reports' series, which are rank 0's alone: every replica's resources are charted.
Standard library only: the shim imports this.
"""

from __future__ import annotations

import re

__all__ = [
    "CPU_PERCENT", "DEFAULT_INTERVAL_S", "GPU_MEMORY_BYTES", "GPU_UTIL_PERCENT",
    "MAX_INTERVAL_S", "MIN_INTERVAL_S", "NAMES", "PREFIX", "RSS_BYTES", "series_name",
    "split_series_name",
]

PREFIX = "system/"
CPU_PERCENT = "system/cpu_percent"
RSS_BYTES = "system/rss_bytes"
GPU_UTIL_PERCENT = "system/gpu_util_percent"
GPU_MEMORY_BYTES = "system/gpu_memory_bytes"
NAMES = (CPU_PERCENT, RSS_BYTES, GPU_UTIL_PERCENT, GPU_MEMORY_BYTES)

DEFAULT_INTERVAL_S = 10.0
MIN_INTERVAL_S = 0.1  # the tests'; each sample is a database row
MAX_INTERVAL_S = 3600.0

_SERIES = re.compile(r"(system/[a-z_]+)/rank-([0-9]{1,9})")


def series_name(name: str, rank: int) -> str:
    """The series of metric `name` of rank `rank`: `system/cpu_percent/rank-0`."""
    return f"{name}/rank-{rank}"


def split_series_name(series: str) -> tuple[str, int] | None:
    """(metric name, rank) of a `system` series' name; None for any other name."""
    match = _SERIES.fullmatch(series)
    return None if match is None else (match[1], int(match[2]))
