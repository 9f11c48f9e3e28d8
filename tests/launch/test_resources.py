"""The shim's resource samples (`muster.launch.resources`) on real process groups: the CPU
they report adds up to what the group used, children that came and went counted once; the
RSS is the group's; GPUs through NVML where it answers, nothing where there is none, and a
real NVML fault said once; a link in the samples' place is never written through; and a
replica under a real shim writes its `system/` lines."""

from __future__ import annotations

import itertools
import logging
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from muster import metrics_lines
from muster.errors import LaunchError
from muster.launch.base import ReplicaSpec
from muster.launch.identity import read_stat
from muster.launch.local import LocalLauncher
from muster.launch.memory import CgroupMemory, open_cgroup
from muster.launch.resources import GpuMeter, GroupCpu, ResourceSampler
from muster.metrics_lines import MetricLine
from muster.rundir import RankFiles
from muster.states import MetricKind
from muster.system_metrics import CPU_PERCENT, GPU_MEMORY_BYTES, GPU_UTIL_PERCENT, RSS_BYTES
from tests.launch.conftest import Replica, fixture_argv, kill_leftovers
from tests.waiting import wait_until

MiB = 1 << 20
TICK = 1 / os.sysconf("SC_CLK_TCK")
SPIN = "import time\nend = time.process_time() + 0.4\nwhile time.process_time() < end: pass\n"
# Waits for `go`, then runs three children one after the other, each spinning 0.4 s of CPU
# and reaped by it (its `cutime` then holds theirs), then says `done` and sleeps.
CHILDREN_COME_AND_GO = (
    "import os, subprocess, sys, time\n"
    "while not os.path.exists(sys.argv[1]): time.sleep(0.01)\n"
    f"for _ in range(3): subprocess.run([sys.executable, '-c', {SPIN!r}])\n"
    "open(sys.argv[2], 'w').close()\n"
    "time.sleep(60)\n")
# The same, but its children end long before it reaps them: zombies, out of their cgroup,
# whose times are in no parent's yet.
ZOMBIES_LINGER = (
    "import os, subprocess, sys, time\n"
    "while not os.path.exists(sys.argv[1]): time.sleep(0.01)\n"
    f"children = [subprocess.Popen([sys.executable, '-c', {SPIN!r}]) for _ in range(2)]\n"
    "time.sleep(1.5)\n"
    "for child in children: child.wait()\n"
    "open(sys.argv[2], 'w').close()\n"
    "time.sleep(60)\n")
HOLD_64_MIB = "import time\nheld = b'x' * (64 << 20)\nprint('held', flush=True)\ntime.sleep(60)\n"


@pytest.fixture
def group() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        os.killpg(proc.pid, 9)
        proc.wait()


def start(group: list[subprocess.Popen[bytes]], code: str, *args: str,
          stdout: int | None = None) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([sys.executable, "-c", code, *args], process_group=0,
                            stdout=stdout)
    group.append(proc)
    return proc


def samples(path: Path, rank: int = 0) -> list[MetricLine]:
    if not path.exists():
        return []
    lines = [metrics_lines.parse(line, rank, metrics_lines.SYSTEM_KINDS)
             for line in path.read_bytes().splitlines(keepends=True)]
    return [line for line in lines if line is not None]


def cpu_seconds(lines: list[MetricLine], began: float) -> float:
    """The CPU time the samples stand for: each one's per cent over its interval."""
    total, previous = 0.0, began
    for line in lines:
        total += line.metrics[CPU_PERCENT] / 100 * (line.time - previous)
        previous = line.time
    return total


def tick_until(sampler: ResourceSampler, pgid: int, done: Path | None = None,
               seconds: float = 0.0) -> None:
    """Tick as the shim's loop does until `done` exists, then for `seconds` more."""
    while done is not None and not done.exists():
        sampler.tick(pgid)
        time.sleep(0.01)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        sampler.tick(pgid)
        time.sleep(0.01)


@pytest.mark.parametrize(("totals", "used"), [
    ([100, 150, 150, 400], [50, 0, 250]),  # CPU time so far, at each sample
    # a child reaped between the reads of its parent and its own in one scan: its time is
    # missing once, and counted at the next sample, once
    ([100, 400, 150, 460], [300, 0, 60]),
    # an orphan reaped outside the group took 200 ticks along: a sample later, that is the
    # new base, and what the group used meanwhile still counts
    ([100, 400, 200, 230, 260], [300, 0, 30, 30]),
])
def test_cpu_per_interval_from_the_groups_cpu_so_far(totals: list[int], used: list[int]) -> None:
    cpu = GroupCpu(totals[0])
    assert [cpu.used(total) for total in totals[1:]] == used


_cgroups = itertools.count()


@pytest.fixture(params=["process group", "cgroup"])
def members(request: pytest.FixtureRequest) -> Iterator[CgroupMemory | None]:
    """Where the sampler finds the replica's processes: a scan for its process group, or
    the memory cgroup of its own that the shim makes where it can (the child joins it)."""
    if request.param == "process group":
        yield None
        return
    try:
        cgroup = open_cgroup(None, f"muster-test-resources-{os.getpid()}-{next(_cgroups)}")
    except LaunchError as exc:
        pytest.skip(f"no memory cgroup can be made here: {exc}")
    yield cgroup
    cgroup.close()


@pytest.mark.parametrize("code", [CHILDREN_COME_AND_GO, ZOMBIES_LINGER],
                         ids=["reaped at once", "zombies linger"])
def test_children_that_came_and_went_count_once(
        tmp_path: Path, members: CgroupMemory | None, group: list[subprocess.Popen[bytes]],
        code: str) -> None:
    go, done = tmp_path / "go", tmp_path / "done"
    proc = subprocess.Popen([sys.executable, "-c", code, str(go), str(done)], process_group=0,
                            preexec_fn=members.child_setup() if members else None)
    group.append(proc)
    leader = proc.pid
    sampler = ResourceSampler(tmp_path / "rank-0.system.jsonl", 0, 0.1,
                              procs=members.path / "cgroup.procs" if members else None)
    before = read_stat(leader)
    began = time.time()
    sampler.start(leader)
    go.touch()
    tick_until(sampler, leader, done, seconds=0.35)  # the last child's end in a sample too
    after = read_stat(leader)  # every child reaped: its cutime holds them all
    sampler.close()
    assert before is not None and after is not None
    used = (after.cpu_ticks - before.cpu_ticks) * TICK
    assert used >= 0.8  # two or three children of 0.4 s each
    lines = samples(tmp_path / "rank-0.system.jsonl")
    assert len(lines) >= 10
    assert cpu_seconds(lines, began) == pytest.approx(used, abs=3 * TICK + 0.01)
    assert max(line.metrics[CPU_PERCENT] for line in lines) > 0


def test_a_sleeping_group_uses_no_cpu_and_its_memory_is_summed(
        tmp_path: Path, group: list[subprocess.Popen[bytes]]) -> None:
    proc = start(group, HOLD_64_MIB, stdout=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline() == b"held\n"
    sampler = ResourceSampler(tmp_path / "rank-3.system.jsonl", 3, 0.1)
    began = time.time()
    sampler.start(proc.pid)
    tick_until(sampler, proc.pid, seconds=0.6)
    sampler.close()
    lines = samples(tmp_path / "rank-3.system.jsonl", rank=3)
    assert len(lines) >= 3
    assert cpu_seconds(lines, began) < 2 * TICK
    for line in lines:
        assert line.kind is MetricKind.SYSTEM and line.rank == 3
        assert set(line.metrics) == {CPU_PERCENT, RSS_BYTES}  # no GPUs: no GPU series
        assert 64 * MiB <= line.metrics[RSS_BYTES] <= 128 * MiB
        assert line.step == int(line.time * 1000)  # a sample's step is its time in ms


class FakeNvml:
    """Stands in for `pynvml` (no GPU here): its functions and exception classes, with the
    GPUs' utilisation and memory as given, and a fault to raise from the reads."""

    class NVMLError(Exception):
        pass

    class NVMLError_LibraryNotFound(NVMLError):
        pass

    class NVMLError_GpuIsLost(NVMLError):
        pass

    def __init__(self, gpus: dict[int, tuple[int, int]], fault: Exception | None = None,
                 init_fault: Exception | None = None) -> None:
        self.gpus, self.fault, self.init_fault = gpus, fault, init_fault
        self.shutdowns = 0

    def nvmlInit(self) -> None:
        if self.init_fault is not None:
            raise self.init_fault

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> Any:
        if self.fault is not None:
            raise self.fault
        return SimpleNamespace(gpu=self.gpus[handle][0], memory=0)

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> Any:
        return SimpleNamespace(used=self.gpus[handle][1], total=80 << 30)


def test_the_gpus_read_are_the_replicas_own(tmp_path: Path,
                                            group: list[subprocess.Popen[bytes]]) -> None:
    nvml = FakeNvml({0: (90, 10 << 30), 1: (30, 2 << 30), 2: (70, 6 << 30)})
    meter = GpuMeter([1, 2], nvml=nvml)
    pgid = start(group, "import time; time.sleep(60)").pid
    sampler = ResourceSampler(tmp_path / "rank-0.system.jsonl", 0, 0.1, meter)
    sampler.start(pgid)
    tick_until(sampler, pgid, seconds=0.35)
    sampler.close()
    lines = samples(tmp_path / "rank-0.system.jsonl")
    assert lines and all(line.metrics[GPU_UTIL_PERCENT] == 50.0 for line in lines)
    assert all(line.metrics[GPU_MEMORY_BYTES] == 8 << 30 for line in lines)
    assert nvml.shutdowns == 1


def test_without_nvml_there_is_no_gpu_series_and_nothing_to_say(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="muster.shim")
    meter = GpuMeter([0])  # the real pynvml: this machine has no NVIDIA driver
    assert not meter.available and meter.read() is None
    meter.close()
    absent = FakeNvml({}, init_fault=FakeNvml.NVMLError_LibraryNotFound("no library"))
    assert GpuMeter([0], nvml=absent).read() is None
    assert caplog.records == []


def test_a_real_nvml_fault_is_said_once(tmp_path: Path, group: list[subprocess.Popen[bytes]],
                                        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="muster.shim")
    nvml = FakeNvml({0: (50, 1 << 30)}, fault=FakeNvml.NVMLError_GpuIsLost("GPU is lost"))
    pgid = start(group, "import time; time.sleep(60)").pid
    sampler = ResourceSampler(tmp_path / "rank-0.system.jsonl", 0, 0.05, GpuMeter([0], nvml))
    sampler.start(pgid)
    tick_until(sampler, pgid, seconds=0.4)
    sampler.close()
    lines = samples(tmp_path / "rank-0.system.jsonl")
    assert len(lines) >= 3
    assert all(set(line.metrics) == {CPU_PERCENT, RSS_BYTES} for line in lines)
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1, said
    assert said[0].startswith("cannot read the replica's GPUs (GPU 0): NVML says GPU is lost "
                              "(NVMLError_GpuIsLost)")


def test_a_warm_standby_is_sampled_once_promoted(
        tmp_path: Path, group: list[subprocess.Popen[bytes]]) -> None:
    go = tmp_path / "rank-0.standby-go.json"
    pgid = start(group, "import time; time.sleep(60)").pid
    sampler = ResourceSampler(tmp_path / "rank-0.system.jsonl", 0, 0.05, after=go)
    sampler.start(pgid)
    tick_until(sampler, pgid, seconds=0.3)
    assert samples(tmp_path / "rank-0.system.jsonl") == []  # it waits beside the active one
    go.write_text("{}")
    promoted = time.time()
    tick_until(sampler, pgid, seconds=0.4)
    sampler.close()
    lines = samples(tmp_path / "rank-0.system.jsonl")
    assert len(lines) >= 3 and lines[0].time >= promoted


@pytest.mark.parametrize("link", ["symlink", "hardlink"])
def test_a_link_in_place_of_the_samples_is_not_written_through(
        tmp_path: Path, group: list[subprocess.Popen[bytes]], link: str) -> None:
    target = tmp_path / "not-the-samples"
    target.write_text("precious\n")
    path = tmp_path / "rank-0.system.jsonl"
    (path.symlink_to if link == "symlink" else path.hardlink_to)(target)
    pgid = start(group, "import time; time.sleep(60)").pid
    sampler = ResourceSampler(path, 0, 0.05)
    sampler.start(pgid)
    tick_until(sampler, pgid, seconds=0.2)
    sampler.close()
    assert target.read_text() == "precious\n"


def test_a_replica_under_its_shim_writes_its_system_lines(tmp_path: Path) -> None:
    spec = ReplicaSpec(
        trial_uuid="resources", attempt=1, rank=0, argv=fixture_argv("silent_compute.py", "60"),
        env={}, cwd=tmp_path, attempt_dir=tmp_path / "attempt-1", stop_grace=1.0,
        gpus=(0,), system_metrics_interval=0.1)
    launcher = LocalLauncher()
    try:
        launcher.submit(spec)
        replica = Replica(launcher, spec)
        files = RankFiles(spec.attempt_dir, 0)
        lines = wait_until(lambda: samples(files.system)[2:] and samples(files.system),
                           timeout=30, what="three samples")
        replica.cancel()
        replica.wait_exit()
    finally:
        kill_leftovers(tmp_path)
    # GPU 0 is its own, but there is no NVML here: CPU and memory only, and no complaint.
    assert all(set(line.metrics) == {CPU_PERCENT, RSS_BYTES} for line in lines)
    assert all(line.metrics[RSS_BYTES] > 0 for line in lines)
    assert "NVML" not in files.shim_log.read_text()
