"""The shim's samples of its replica's resources: the `system/` series (`muster.system_metrics`).

Why the shim takes them: it is the one process that lives exactly as long as the replica,
next to it, on every launcher (a Ray replica's actor runs the same shim), and it already
watches the replica's process group (`muster.launch.activity`, `muster.launch.memory`).
What it samples goes where the run's own reports go, a file in the attempt directory
(`RankFile.SYSTEM`, appended to), which the server ingests like a metrics file
(`muster.supervise.ingest`): no network, nothing lost while the server is down, and the
server spends nothing per sample but a row. A sampler in the server would have to reach
every node, and would stop while the server restarts.

Every `interval_s` (the cluster config's `system_metrics_interval`) `tick`, called from the
shim's loop, writes one line:

- CPU: the CPU time of the group over the interval, per cent of one core. The group's CPU
  time is the sum of utime, stime and the reaped children's times of every process in the
  group, zombies included (a zombie's times move into its parent's only when it is reaped,
  so counting it until then counts each exited process exactly once); `GroupCpu` turns
  the totals into CPU per interval. A total can go down: for one sample when a process was
  reaped between the reads of its own and its parent's times in one scan (the next scan
  finds them in its parent's: counted then), or for good when an orphan reaped outside the
  group took its times along (after a second sample below, counting goes on from there).
- RSS: the summed resident memory of the group's live processes (shared pages counted once
  per process, as the memory watchdog counts them).
- GPUs: the replica's own GPUs (its `ReplicaSpec.gpus`; without that field, the GPUs its
  CUDA_VISIBLE_DEVICES names), through NVML: the mean utilisation and the summed memory in
  use. Where there is no NVML (no `nvidia-ml-py`, no driver, no such device) there is no
  GPU series, silently; any other NVML error is logged once in the shim log, and that
  sample has no GPU values.

A sample's work is a read of each of the replica's processes where the replica has a
memory cgroup of its own (`muster.launch.memory`: its `cgroup.procs` names them), else one
scan of /proc for its process group (the activity stamp's scan); and one NVML call per
GPU. What the sampler keeps between samples is one number and its members' identities.
The file is opened once, never through a link (under `run_as` the job owns the
directory): a symlink or a hard link in its place is refused, and the replica then has no
samples.
"""

from __future__ import annotations

import logging
import os
import stat
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from muster import metrics_lines
from muster.launch.base import ProcessIdentity
from muster.launch.identity import ProcStat, group_members, read_stat
from muster.launch.memory import rss_bytes
from muster.states import MetricKind
from muster.system_metrics import CPU_PERCENT, GPU_MEMORY_BYTES, GPU_UTIL_PERCENT, RSS_BYTES

__all__ = ["GpuMeter", "GpuReading", "GroupCpu", "GroupReading", "ResourceSampler",
           "read_group"]

log = logging.getLogger("muster.shim")

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
# NVML's answers that mean "no NVML here" or "no such GPU here": no series, and nothing to
# say (a machine without GPUs, fake GPUs from the cluster config). Any other is a fault.
_ABSENT = ("NVMLError_LibraryNotFound", "NVMLError_DriverNotLoaded", "NVMLError_NotFound",
           "NVMLError_GpuNotFound", "NVMLError_InvalidArgument")


@dataclass(frozen=True)
class GroupReading:
    """One look at a replica's processes: their CPU time so far, their summed RSS, and who
    they were (for the next look in a cgroup: `read_group`)."""

    cpu_ticks: int
    rss_bytes: int
    members: frozenset[ProcessIdentity] = frozenset()


def read_group(pgid: int, procs: Path | None = None,
               known: frozenset[ProcessIdentity] = frozenset()) -> GroupReading:
    """The CPU time used by the replica's processes so far (clock ticks) and their RSS now.

    They are process group `pgid`'s, found by a scan of every process of the machine; or,
    with `procs` (the `cgroup.procs` of the replica's own memory cgroup), the cgroup's and
    the zombies among those seen at the last look (`known`): a zombie has left its cgroup,
    but not yet given its times to its parent. That costs a read per member, not one per
    process of the machine. A cgroup that cannot be read any more is scanned for instead.
    """
    members = _cgroup_members(procs, known) if procs is not None else None
    if members is None:
        members = group_members(pgid, zombies=True)
    ticks = rss = 0
    for member in members:
        ticks += member.cpu_ticks
        if member.state != "Z":
            rss += rss_bytes(member.pid) or 0
    return GroupReading(ticks, rss, frozenset(m.identity for m in members))


def _cgroup_members(procs: Path, known: frozenset[ProcessIdentity]) -> list[ProcStat] | None:
    """The cgroup's processes and the zombies among `known`; None where the cgroup is gone."""
    try:
        pids = {int(word) for word in procs.read_bytes().split()}
    except (OSError, ValueError):
        return None
    found = []
    for pid in pids | {identity.pid for identity in known}:
        stat = read_stat(pid)
        if stat is None or stat.state in ("X", "x"):
            continue
        if pid in pids or (stat.state == "Z" and stat.identity in known):
            found.append(stat)
    return found


class GroupCpu:
    """The CPU a group used per interval, from its CPU time so far (`GroupReading.cpu_ticks`)
    at each sample: a total that went down counts nothing, and the time is counted once the
    total is back above what was counted (a process read twice or not at all in one scan);
    a total still down at the next sample is the group's new base (see the module)."""

    def __init__(self, ticks: int) -> None:
        self.counted = ticks  # the highest total seen since the base
        self._last = ticks
        self._down = False

    def used(self, ticks: int) -> int:
        """The ticks used since the previous sample, given the total now."""
        last, self._last = self._last, ticks
        if ticks >= self.counted:
            used, self.counted, self._down = ticks - self.counted, ticks, False
        elif self._down:  # down for good: go on from here
            used, self.counted, self._down = max(0, ticks - last), ticks, False
        else:
            used, self._down = 0, True
        return used


@dataclass(frozen=True)
class GpuReading:
    """The replica's GPUs now: mean utilisation (per cent) and summed memory in use."""

    util_percent: float
    memory_bytes: int


class GpuMeter:
    """The utilisation and memory of a few GPUs (NVML indices), read through NVML.

    `nvml` is the `pynvml` module (imported here when not given); a test passes an object
    with its functions and exception classes. `read()` is None where NVML or the GPUs are
    absent, or where the read failed (logged the first time).
    """

    def __init__(self, indices: Sequence[int], nvml: Any = None) -> None:
        self.indices = tuple(indices)
        self._nvml = nvml
        self._handles: list[Any] = []
        self._started = False
        self._logged = False
        if self.indices:
            self._open()

    def _open(self) -> None:
        if self._nvml is None:
            try:
                import pynvml
            except ImportError:
                return  # no nvidia-ml-py: no GPU series
            self._nvml = pynvml
        try:
            self._nvml.nvmlInit()
            self._started = True
            self._handles = [self._nvml.nvmlDeviceGetHandleByIndex(i) for i in self.indices]
        except self._nvml.NVMLError as exc:
            self._handles = []
            self._fault(exc, "cannot open the replica's GPUs")

    @property
    def available(self) -> bool:
        """Whether the GPUs are there to read."""
        return bool(self._handles)

    def read(self) -> GpuReading | None:
        """The GPUs now; None where they cannot be read."""
        if not self._handles:
            return None
        nvml = self._nvml
        try:
            utils = [float(nvml.nvmlDeviceGetUtilizationRates(h).gpu) for h in self._handles]
            used = sum(int(nvml.nvmlDeviceGetMemoryInfo(h).used) for h in self._handles)
        except nvml.NVMLError as exc:
            self._fault(exc, "cannot read the replica's GPUs")
            return None
        return GpuReading(sum(utils) / len(utils), used)

    def close(self) -> None:
        """Shut NVML down, if it was started; idempotent."""
        if not self._started:
            return
        self._started = False
        self._handles = []
        try:
            self._nvml.nvmlShutdown()
        except self._nvml.NVMLError as exc:
            self._fault(exc, "cannot shut NVML down")

    def _fault(self, exc: Exception, what: str) -> None:
        """Say why, once; a machine without NVML or without these GPUs is no fault."""
        absent = tuple(kind for name in _ABSENT
                       if isinstance(kind := getattr(self._nvml, name, None), type))
        if isinstance(exc, absent) or self._logged:
            return
        self._logged = True
        log.error("%s (GPU %s): NVML says %s (%s); the replica's GPU series have no values "
                  "while this lasts", what, ",".join(map(str, self.indices)), exc,
                  type(exc).__name__)


class ResourceSampler:
    """Appends a sample of the replica's resources to its `RankFile.SYSTEM` file every
    `interval_s`: `start(pgid)` once the child runs, `tick(pgid)` from the shim's loop,
    `close()` at the end.

    With `after` (a warm standby's go file), sampling starts once that file exists: a
    standby waits beside the attempt it may replace, and samples of both under one rank
    would interleave.
    """

    def __init__(self, path: Path, rank: int, interval_s: float,
                 gpus: GpuMeter | None = None, after: Path | None = None,
                 procs: Path | None = None) -> None:
        self.rank = rank
        self.interval_s = interval_s
        self._gpus = gpus
        self._after = after
        self._procs = procs  # the replica's cgroup's `cgroup.procs`, where it has one
        self._members: frozenset[ProcessIdentity] = frozenset()
        self._templates: dict[tuple[str, ...], str] = {}
        self._began = 0.0  # when the interval of the next sample began (monotonic)
        self._cpu: GroupCpu | None = None
        self._next = 0.0
        self._fd = _open_samples(path)

    def start(self, pgid: int) -> None:
        """Take the first CPU reading, which the first sample's interval starts from (once
        the `after` file exists, where there is one)."""
        if self._after is not None and not self._after.exists():
            return
        self._after = None
        self._began = time.monotonic()
        self._cpu = GroupCpu(self._read(pgid).cpu_ticks)
        self._next = self._began + self.interval_s

    def tick(self, pgid: int) -> None:
        """Write a sample if one is due."""
        now = time.monotonic()
        if self._fd is None or now < self._next:
            return
        if self._cpu is None:  # waiting for the `after` file: look again in an interval
            self._next = now + self.interval_s
            self.start(pgid)
            return
        taken_at = time.time_ns()  # the sample's time: when its interval ends, not its write
        self._next = now + self.interval_s
        reading = self._read(pgid)
        began, self._began = self._began, now
        used = self._cpu.used(reading.cpu_ticks) / _CLOCK_TICKS
        values: dict[str, float | int] = {
            CPU_PERCENT: round(100.0 * used / max(now - began, 1e-6), 1),
            RSS_BYTES: reading.rss_bytes,
        }
        gpu = self._gpus.read() if self._gpus is not None else None
        if gpu is not None:
            values[GPU_UTIL_PERCENT] = round(gpu.util_percent, 1)
            values[GPU_MEMORY_BYTES] = gpu.memory_bytes
        self._write(values, taken_at)

    def _read(self, pgid: int) -> GroupReading:
        reading = read_group(pgid, self._procs, self._members)
        self._members = reading.members
        return reading

    def _write(self, values: dict[str, float | int], at: int) -> None:
        names = tuple(values)
        template = self._templates.get(names)
        if template is None:
            template = self._templates[names] = metrics_lines.template(
                MetricKind.SYSTEM, names, self.rank)
        line = template % (at // 1_000_000, *values.values(), at)
        assert self._fd is not None
        try:
            os.write(self._fd, line.encode())
        except OSError as exc:
            log.error("cannot write the resource samples (%s); no further samples", exc)
            self.close()

    def close(self) -> None:
        """Close the file and the GPUs; idempotent."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)
        if self._gpus is not None:
            self._gpus.close()


def _open_samples(path: Path) -> int | None:
    """The samples file, open for appending (an earlier incarnation's samples stay); None,
    logged, where it cannot be, or where a link stands in its place."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC
                     | os.O_NOFOLLOW, 0o644)
    except OSError as exc:
        log.error("cannot open the resource samples %s (%s): the replica has no system/ "
                  "series", path, exc)
        return None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
        os.close(fd)
        log.error("%s is not a file of its own (a hard link?): the replica has no system/ "
                  "series", path)
        return None
    return fd
