"""The `system/` samples in the store, and the one warning a trial gets when its GPU sits idle
while its CPU works (`muster.supervise.gpu_idle`): the decision over real sample values,
then ingestion of a run directory's samples files, written as the shim writes them, on both
database backends."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest
from sqlalchemy import select

from muster import metrics_lines
from muster.downsample import Series
from muster.states import EventReason, MetricKind, MetricSource
from muster.store import Event, Metric, MetricSeries, Store
from muster.supervise.gpu_idle import IdleGpu, Sample, idle_gpu, idle_gpu_message
from muster.supervise.ingest import ingest_trial
from muster.system_metrics import (
    CPU_PERCENT,
    GPU_MEMORY_BYTES,
    GPU_UTIL_PERCENT,
    RSS_BYTES,
    series_name,
)
from tests.supervise.test_ingest import RunDir, add_run

GiB = 1 << 30
START = 1_765_000_000.0


@pytest.fixture
def store(shared_store: Store) -> Store:
    return shared_store


def every_10s(cpu: Sequence[float], gpu: Sequence[float | None]) -> list[Sample]:
    """Samples 10 s apart (the default interval), as the shim reads them."""
    return [Sample(START + 10 * i, c, g) for i, (c, g) in enumerate(zip(cpu, gpu, strict=True))]


# 61 samples 10 s apart span 10 minutes. CPU values as a CPU-bound PyTorch script reads
# (one core busy, a data loader's worker now and then); GPU utilisation as NVML gives it.
BUSY_CPU = [98.7, 101.2, 99.9, 143.5, 99.1] * 12 + [100.4]
WAITING_CPU = [0.4, 0.0, 1.2, 0.3, 0.0] * 12 + [0.2]


@pytest.mark.parametrize(("samples", "warned"), [
    # the GPU read 0% for 10 minutes while one core or more worked: running on CPU
    (every_10s(BUSY_CPU, [0.0] * 61), (600.0, 108.3)),
    # 9 minutes 50 s is not yet 10 minutes
    (every_10s(BUSY_CPU[:60], [0.0] * 60), None),
    # busy on the GPU for an hour first, idle for the last 10 minutes: warned for those
    (every_10s(BUSY_CPU * 6, [97.0] * 305 + [0.0] * 61), (600.0, 108.3)),
    # one sample of GPU work in the window clears it
    (every_10s(BUSY_CPU, [0.0] * 30 + [3.0] + [0.0] * 30), None),
    # waiting (for data, for a peer) uses neither: not the script's fault
    (every_10s(WAITING_CPU, [0.0] * 61), None),
    # a replica without GPU readings (no NVML) is never judged
    (every_10s(BUSY_CPU, [None] * 61), None),
    ([], None),
])
def test_an_idle_gpu_beside_a_busy_cpu_is_running_on_cpu(
        samples: list[Sample], warned: tuple[float, float] | None) -> None:
    idle = idle_gpu(samples)
    assert (None if idle is None else (idle.seconds, round(idle.cpu_percent, 1))) == warned


def test_the_warning_says_which_rank_and_what_to_check() -> None:
    assert idle_gpu_message(0, IdleGpu(612.0, 99.6)) == (
        "rank 0 is not using its GPU: running on CPU? Its GPU utilisation stayed at 0% for 10 "
        "minutes while its CPU was 100% busy (100% is one core); check that the model and its "
        "data are moved to the GPU, and that the environment's torch has CUDA")


def write_samples(run: RunDir, rank: int, samples: list[Sample], attempt: int = 1) -> None:
    """The samples as the shim writes them (`metrics_lines.template`, kind system)."""
    path = run.root / f"attempt-{attempt}" / f"rank-{rank}.system.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("ab") as out:
        for sample in samples:
            values: dict[str, float | int] = {CPU_PERCENT: sample.cpu_percent or 0.0,
                                              RSS_BYTES: 3 * GiB}
            if sample.gpu_util_percent is not None:
                values[GPU_UTIL_PERCENT] = sample.gpu_util_percent
                values[GPU_MEMORY_BYTES] = GiB // 2
            template = metrics_lines.template(MetricKind.SYSTEM, tuple(values), rank)
            nanoseconds = int(sample.time * 1e9)
            out.write((template % (nanoseconds // 1_000_000, *values.values(),
                                   nanoseconds)).encode())


def gpu_warnings(store: Store, trial_id: int) -> list[str | None]:
    with store.session_scope() as s:
        return list(s.scalars(select(Event.message).where(
            Event.trial_id == trial_id, Event.reason == EventReason.GPU_IDLE)))


def test_samples_are_stored_per_rank_and_are_no_reports(store: Store, tmp_path: Path) -> None:
    run = add_run(store, tmp_path)
    write_samples(run, 0, every_10s([50.0, 150.0], [10.0, 20.0]))
    write_samples(run, 1, every_10s([70.0], [None]))
    report = ingest_trial(store, run.trial_id)
    assert (report.system_added, report.metrics_added) == (3, 0)  # no report to judge
    with store.session_scope() as s:
        rows = s.execute(select(Metric.rank, Metric.kind, Metric.source, Metric.values)
                         .where(Metric.trial_id == run.trial_id).order_by(Metric.id)).all()
        series = {row.name: (row.reports, row.highest) for row in s.scalars(
            select(MetricSeries).where(MetricSeries.trial_id == run.trial_id))}
    assert [(rank, kind, source) for rank, kind, source, _ in rows] == [
        (0, MetricKind.SYSTEM, MetricSource.SHIM)] * 2 + [(1, MetricKind.SYSTEM,
                                                           MetricSource.SHIM)]
    # every rank's own series: the reports' series are rank 0's alone
    assert series == {
        series_name(CPU_PERCENT, 0): (2, 150.0), series_name(RSS_BYTES, 0): (2, 3 * GiB),
        series_name(GPU_UTIL_PERCENT, 0): (2, 20.0),
        series_name(GPU_MEMORY_BYTES, 0): (2, GiB // 2),
        series_name(CPU_PERCENT, 1): (1, 70.0), series_name(RSS_BYTES, 1): (1, 3 * GiB)}
    assert ingest_trial(store, run.trial_id).system_added == 0  # read once


def test_a_gpu_idle_for_10_minutes_beside_a_busy_cpu_is_warned_once(
        store: Store, tmp_path: Path) -> None:
    run = add_run(store, tmp_path)
    write_samples(run, 0, every_10s(BUSY_CPU, [95.0] * 61))  # rank 0 uses its GPU
    write_samples(run, 1, every_10s(BUSY_CPU[:30], [0.0] * 30))
    ingest_trial(store, run.trial_id)
    assert gpu_warnings(store, run.trial_id) == []  # 5 minutes so far
    later = [Sample(s.time + 300, s.cpu_percent, s.gpu_util_percent)
             for s in every_10s(BUSY_CPU[30:], [0.0] * 31)]
    write_samples(run, 1, later)
    ingest_trial(store, run.trial_id)
    warned = gpu_warnings(store, run.trial_id)
    assert len(warned) == 1 and warned[0] is not None
    assert warned[0].startswith("rank 1 is not using its GPU: running on CPU? Its GPU "
                                "utilisation stayed at 0% for 10 minutes while its CPU was")
    write_samples(run, 1, [Sample(START + 610, 99.0, 0.0)])
    ingest_trial(store, run.trial_id)
    assert len(gpu_warnings(store, run.trial_id)) == 1  # once per trial


def test_a_replica_that_waits_with_its_gpu_idle_is_not_warned(
        store: Store, tmp_path: Path) -> None:
    run = add_run(store, tmp_path)
    write_samples(run, 0, every_10s(WAITING_CPU, [0.0] * 61))
    ingest_trial(store, run.trial_id)
    assert gpu_warnings(store, run.trial_id) == []


def test_a_series_of_samples_is_never_cut_back(store: Store, tmp_path: Path) -> None:
    """Samples of one rank from two attempts on machines whose clocks differ: the curve
    keeps its later samples, where a resumed run's reports would cut it back."""
    run = add_run(store, tmp_path, attempts=2)
    write_samples(run, 0, every_10s([10.0, 20.0, 30.0], [None] * 3), attempt=1)
    behind = [Sample(START + 5, 99.0, None), Sample(START + 25, 40.0, None)]
    write_samples(run, 0, behind, attempt=2)
    ingest_trial(store, run.trial_id)
    with store.session_scope() as s:
        row = s.scalars(select(MetricSeries).where(
            MetricSeries.trial_id == run.trial_id,
            MetricSeries.name == series_name(CPU_PERCENT, 0))).one()
        steps, values = Series.from_json(row.curve).points()
    start_ms = int(START * 1000)
    assert steps == [start_ms, start_ms + 10_000, start_ms + 20_000, start_ms + 25_000]
    assert values == [10.0, 20.0, 30.0, 40.0]
