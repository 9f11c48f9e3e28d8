"""The memory of one replica's process group: its peak, the kernel's OOM kills in it, and its
limit (`resources.memory_limit`), where it has one.

The shim opens one `MemoryGuard` per replica, limit or not, before it starts the training
process:

- `CgroupMemory`: a cgroup of the replica's own, made under the shim's cgroup, that the child
  joins before it execs (so all its descendants are in it from their first byte). With a
  limit the kernel enforces it (swap included, where it can be limited); without one the
  cgroup is left unlimited and only counts. Either way its peak usage is the group's peak
  and its OOM-kill counter names an OOM kill in the group, whatever ran out: the limit, a
  parent cgroup's limit, or the machine's memory. The shim sees the counter rise and kills
  the rest of the group (a group with one process OOM-killed is broken: a parent may wait
  for ever for the child it lost). cgroup v2 (`memory.max`) where the shim's cgroup can
  delegate its memory controller (in practice: the shim runs in the root cgroup or an empty
  delegated one), else cgroup v1 (`memory.limit_in_bytes`).
- `RssWatchdog`: where no cgroup can be made (or `memory_enforcement` says "watchdog"), a
  thread sums the RSS of every process in the replica's process group: with a limit every
  `WATCHDOG_INTERVAL_S`, SIGKILLing the group once the sum exceeds it; without one every
  `SAMPLE_INTERVAL_S`, for the peak alone. It counts shared pages once per process
  (conservative), and cannot see a process that moved itself to another process group. A
  watchdog with a limit that cannot sample (`WATCHDOG_FAILURES` times in a row) does not go
  on as if it watched: it SIGKILLs the group too, and its report's `error` says why, so the
  replica ends INTERNAL with that reason instead of running without its limit (without a
  limit it only stops sampling, and reports no peak). The watchdog also keeps the identity
  (pid, start time) of every process it saw in the group and when it was first found gone,
  so that once the child has died unclean, an OOM kill in the kernel log
  (`muster.launch.kernel_log`) is matched to a process that was in the group at that
  moment, never to one that reused its pid. A process that lived less than one sampling
  interval (other than the child itself) is not known to it, nor is its OOM kill.

Contract, in the shim's order: `open_memory_guard` before the spawn (`child_setup` runs in
the forked child before exec), `watch(pgid)` once the child runs, `breached()` from the
shim's loop (True once the limit was crossed or the kernel's OOM killer struck in the
cgroup; the shim then SIGKILLs the group), `finish()` after the group was killed but BEFORE
the child is reaped (the watchdog signals the group by number, which stays reserved only
until then), `killed_by_kernel()` after the reap where the child did not exit cleanly,
`close()` after the reap (idempotent).
"""

from __future__ import annotations

import abc
import contextlib
import dataclasses
import logging
import os
import re
import signal
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from muster.errors import LaunchError
from muster.launch.base import MemoryEnforcement, ProcessIdentity
from muster.launch.identity import group_members, read_identity
from muster.sizes import format_size
from muster.states import OomSource

if TYPE_CHECKING:  # the cgroup (the common case) needs no kernel log: a shim starts faster
    from muster.launch.kernel_log import KernelKill, KernelLog

__all__ = [
    "SAMPLE_INTERVAL_S",
    "WATCHDOG_INTERVAL_S",
    "CgroupMemory",
    "GroupSample",
    "MemoryGuard",
    "MemoryReport",
    "RssWatchdog",
    "group_rss",
    "machine_memory",
    "open_cgroup",
    "open_memory_guard",
    "remove_orphaned_cgroups",
    "rss_bytes",
    "sample_group",
    "with_child_peak",
]

log = logging.getLogger("muster.shim")

WATCHDOG_INTERVAL_S = 0.05  # with a limit: how soon a group over it is killed
SAMPLE_INTERVAL_S = 0.5  # without one: the peak only, which a coarser sample finds too
WATCHDOG_FAILURES = 3  # samples that failed in a row before the limit counts as unenforced
CGROUP_CHECK_S = 0.05  # how often `CgroupMemory.breached` reads the group's OOM counter
RMDIR_TRIES = 100  # killed processes leave their cgroup only as they finish exiting
RMDIR_PAUSE_S = 0.02
MAX_MEMBERS = 4096  # identities the watchdog keeps; the oldest gone ones go first
MATCH_SLACK_S = 1.0  # clock ticks, a kernel log stamp and a sample's time differ by less
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")
_OOM_KILL = re.compile(r"^oom_kill (\d+)$", re.MULTILINE)
_UNSAFE_NAME = re.compile(r"[^A-Za-z0-9_.-]")


@dataclass(frozen=True)
class MemoryReport:
    """How the replica's group fared, for the exit record."""

    mechanism: str  # "cgroup-v1", "cgroup-v2" or "watchdog"
    limit_bytes: int | None  # None: no memory_limit
    peak_bytes: int | None  # None where the mechanism cannot tell
    oom: OomSource | None  # who saw the group run out of memory; None: it did not
    error: str | None = None  # why the limit could not be enforced (the group was killed)


class MemoryGuard(abc.ABC):
    """Watches one replica's process group, and holds it to `limit_bytes` where that is
    set; see the module's contract."""

    mechanism: str

    def __init__(self, limit_bytes: int | None) -> None:
        self.limit_bytes = limit_bytes

    def child_setup(self) -> Callable[[], None] | None:
        """What the forked child must run before exec, if anything."""
        return None

    @abc.abstractmethod
    def watch(self, pgid: int) -> None:
        """Start watching the group the child leads."""

    @abc.abstractmethod
    def breached(self) -> bool:
        """True once the group crossed the limit, or the kernel's OOM killer struck in it
        (cheap: the shim calls it in its loop)."""

    @property
    def error(self) -> str | None:
        """Why the limit can no longer be enforced, once that happened (the group is then
        killed); None while it is enforced, and always without a limit."""
        return None

    @abc.abstractmethod
    def finish(self) -> MemoryReport:
        """Stop watching and report; call before the child is reaped."""

    def killed_by_kernel(self) -> bool:
        """Whether the kernel log names an OOM kill of a process of the group (call after
        an unclean end, once `finish` has reported no OOM). A cgroup's counter has said
        so already: False."""
        return False

    @abc.abstractmethod
    def close(self) -> None:
        """Remove what the guard made; call after the child is reaped. Idempotent."""


@dataclass(frozen=True)
class GroupSample:
    """One look at a process group: its members' summed RSS, and who they were."""

    rss_bytes: int
    members: tuple[ProcessIdentity, ...]


def sample_group(pgid: int) -> GroupSample:
    """The summed resident set size of the live processes in process group `pgid`."""
    total, members = 0, []
    for stat in group_members(pgid):
        rss = rss_bytes(stat.pid)
        if rss is not None:  # None: it ended since the scan
            total += rss
            members.append(stat.identity)
    return GroupSample(total, tuple(members))


def group_rss(pgid: int) -> int:
    """The summed resident set size of the live processes in process group `pgid`."""
    return sample_group(pgid).rss_bytes


def rss_bytes(pid: int) -> int | None:
    """Its resident set size (`/proc/<pid>/statm`'s second field, in pages); None when it has
    ended."""
    try:
        fields = Path(f"/proc/{pid}/statm").read_bytes().split()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return int(fields[1]) * _PAGE_BYTES


def with_child_peak(report: MemoryReport, child_max_rss: int) -> MemoryReport:
    """The report with the reaped child's own peak RSS (`ru_maxrss`) as the floor of the
    watchdog's peak: samples taken every `SAMPLE_INTERVAL_S` miss a burst between two of
    them, and all of a replica that lives less than one, while the kernel kept the child's
    own peak. A cgroup counts the group's peak itself, in its own terms: left as it is."""
    if report.mechanism != RssWatchdog.mechanism or report.peak_bytes is None:
        return report
    return dataclasses.replace(report, peak_bytes=max(report.peak_bytes, child_max_rss))


def machine_memory() -> int | None:
    """This machine's memory in bytes (None where the system does not say)."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * _PAGE_BYTES
    except (OSError, ValueError):
        return None


def _since_boot() -> float:
    """Now, in seconds since boot: the clock of process start times and kernel log stamps."""
    return time.clock_gettime(time.CLOCK_BOOTTIME)


class _Members:
    """Every process identity seen in the group, with when it was first found gone (seconds
    since boot; None: not yet). At most `MAX_MEMBERS`, the oldest gone ones dropped first."""

    def __init__(self) -> None:
        self._gone: dict[ProcessIdentity, float | None] = {}

    def saw(self, members: Iterable[ProcessIdentity], at: float) -> None:
        present = set(members)
        for identity in present:
            self._gone.setdefault(identity, None)
        for identity, gone in self._gone.items():
            if gone is None and identity not in present:
                self._gone[identity] = at
        if len(self._gone) > MAX_MEMBERS:
            gone_first = sorted((g, i) for i, g in self._gone.items() if g is not None)
            for _, identity in gone_first[: len(self._gone) - MAX_MEMBERS]:
                del self._gone[identity]

    def had(self, kill: KernelKill) -> bool:
        """True when a process of the group had the victim's pid at the time of the kill:
        started before it, and not yet found gone."""
        for identity, gone in self._gone.items():
            started = identity.start_ticks / _CLOCK_TICKS
            if (identity.pid == kill.pid and started - MATCH_SLACK_S <= kill.at
                    and (gone is None or kill.at <= gone + MATCH_SLACK_S)):
                return True
        return False


class RssWatchdog(MemoryGuard):
    """Samples the group's total RSS in a thread: its peak, who was in it, and with a limit
    a SIGKILL to the group above it; the kernel log names OOM kills (see the module)."""

    mechanism = "watchdog"

    def __init__(self, limit_bytes: int | None, interval_s: float | None = None,
                 sample: Callable[[int], GroupSample] | None = None,
                 kernel_log: KernelLog | None = None) -> None:
        super().__init__(limit_bytes)
        default = SAMPLE_INTERVAL_S if limit_bytes is None else WATCHDOG_INTERVAL_S
        self._interval_s = default if interval_s is None else interval_s
        self._sample_group = sample or sample_group
        if kernel_log is None:
            from muster.launch.kernel_log import KernelLog

            kernel_log = KernelLog.open()
        self._kernel_log = kernel_log
        if self._kernel_log.problem is not None:
            log.info("no kernel log to name OOM kills in the replica's group: %s",
                     self._kernel_log.problem)
        self._members = _Members()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._peak = 0
        self._breached = False
        self._error: str | None = None
        self._gave_up = False  # without a limit: the samples failed, the peak is unknown
        self._failures = 0  # samples that failed in a row

    def watch(self, pgid: int) -> None:
        leader = read_identity(pgid)
        if leader is not None:  # known even if it dies before the first sample
            self._members.saw([leader], _since_boot())
        # The first sample now, before the thread starts: a replica that ends before the
        # thread's first would have no peak (its own `ru_maxrss` is the floor after it:
        # `with_child_peak`).
        self._try_sample(pgid)
        self._thread = threading.Thread(
            target=self._run, args=(pgid,), name="memory-watchdog", daemon=True
        )
        self._thread.start()

    def _run(self, pgid: int) -> None:
        """Every interval after the first sample (`watch`'s), until stopped or done."""
        while not self._breached and self._error is None and not self._gave_up:
            if self._stop.wait(self._interval_s):
                return
            self._try_sample(pgid)

    def _try_sample(self, pgid: int) -> None:
        try:
            self._sample(pgid)
            self._failures = 0
        except Exception as exc:  # noqa: BLE001 - a watchdog that dies leaves no limit
            self._failures += 1
            log.warning("the memory watchdog could not sample group %d (%d in a row): "
                        "%s: %s", pgid, self._failures, type(exc).__name__, exc)
            if self._failures >= WATCHDOG_FAILURES:
                self._give_up(pgid, f"{type(exc).__name__}: {exc}")

    def _give_up(self, pgid: int, error: str) -> None:
        """Sampling failed for good. With a limit it cannot be enforced any more: stop the
        group rather than let it run without one, and say why. Without one, only the peak
        is lost."""
        reason = (f"the RSS watchdog could not sample the process group "
                  f"{WATCHDOG_FAILURES} times in a row ({error})")
        if self.limit_bytes is None:
            self._gave_up = True
            log.error("%s: the replica's peak memory is not recorded", reason)
            return
        self._error = reason
        log.error("%s: SIGKILL to group %d so that it never runs without its memory limit "
                  "of %s", reason, pgid, format_size(self.limit_bytes))
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)

    def _sample(self, pgid: int) -> None:
        sample = self._sample_group(pgid)
        self._members.saw(sample.members, _since_boot())
        self._peak = max(self._peak, sample.rss_bytes)
        if self.limit_bytes is not None and sample.rss_bytes > self.limit_bytes:
            self._breached = True
            log.warning(
                "group %d uses %s, over its limit of %s: SIGKILL",
                pgid, format_size(sample.rss_bytes), format_size(self.limit_bytes),
            )
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)

    def breached(self) -> bool:
        return self._breached

    @property
    def error(self) -> str | None:
        return self._error

    def finish(self) -> MemoryReport:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        peak = None if self._gave_up else self._peak
        oom = OomSource.WATCHDOG if self._breached else None
        return MemoryReport(self.mechanism, self.limit_bytes, peak, oom, self._error)

    def killed_by_kernel(self) -> bool:
        kills = [kill for kill in self._kernel_log.oom_kills() if self._members.had(kill)]
        for kill in kills[:1]:
            log.warning("the kernel log names an OOM kill of pid %d of the replica's group",
                        kill.pid)
        return bool(kills)

    def close(self) -> None:
        """The thread has stopped (`finish`); only the kernel log is left to close."""
        self._kernel_log.close()


@dataclass(frozen=True)
class _CgroupLayout:
    """Where one cgroup version keeps the files the guard uses."""

    version: str
    limit: str
    swap_limit: str
    swap_counts_memory: bool  # v1's limit is on memory + swap; v2's on swap alone
    events: str  # holds an "oom_kill N" line
    peak: str
    group_kill: str | None  # makes the OOM killer take the whole group, not one process


_V1 = _CgroupLayout(
    "cgroup-v1",
    limit="memory.limit_in_bytes",
    swap_limit="memory.memsw.limit_in_bytes",
    swap_counts_memory=True,
    events="memory.oom_control",
    peak="memory.max_usage_in_bytes",
    group_kill=None,
)
_V2 = _CgroupLayout(
    "cgroup-v2",
    limit="memory.max",
    swap_limit="memory.swap.max",
    swap_counts_memory=False,
    events="memory.events",
    peak="memory.peak",
    group_kill="memory.oom.group",
)


class CgroupMemory(MemoryGuard):
    """A memory cgroup of the replica's own: the kernel enforces the limit, if any, and
    counts the group's peak and its OOM kills."""

    def __init__(self, limit_bytes: int | None, path: Path, layout: _CgroupLayout) -> None:
        super().__init__(limit_bytes)
        self.path = path
        self.mechanism = layout.version
        self._layout = layout
        self._oom_kills = 0
        self._next_check = 0.0
        self._closed = False

    @classmethod
    def create(
        cls, limit_bytes: int | None, parent: Path, name: str, layout: _CgroupLayout
    ) -> CgroupMemory:
        """Make the cgroup `parent/name`, with the limit set where there is one. Raises
        OSError where it cannot."""
        path = parent / name
        path.mkdir()
        guard = cls(limit_bytes, path, layout)
        try:
            guard._configure()
        except OSError:
            guard.close()
            raise
        return guard

    def _configure(self) -> None:
        layout = self._layout
        if self.limit_bytes is not None:  # none: a new cgroup is unlimited
            _write(self.path / layout.limit, str(self.limit_bytes))
            # Without a swap limit the group would swap instead of running out of memory.
            # Where swap is not accounted the file is missing or refuses: nothing to limit.
            with contextlib.suppress(OSError):
                swap = self.limit_bytes if layout.swap_counts_memory else 0
                _write(self.path / layout.swap_limit, str(swap))
        if layout.group_kill is not None:
            with contextlib.suppress(OSError):  # older kernels: the shim kills the rest
                _write(self.path / layout.group_kill, "1")

    def child_setup(self) -> Callable[[], None]:
        procs = os.fsencode(self.path / "cgroup.procs")

        def join() -> None:  # runs in the forked child: plain system calls only
            fd = os.open(procs, os.O_WRONLY)
            try:
                os.write(fd, str(os.getpid()).encode())
            finally:
                os.close(fd)

        return join

    def watch(self, pgid: int) -> None:
        """Nothing to start: the kernel watches the cgroup, which the child joined at fork."""

    def breached(self) -> bool:
        now = time.monotonic()
        if not self._oom_kills and now >= self._next_check:
            self._next_check = now + CGROUP_CHECK_S
            self._oom_kills = self._read_oom_kills()
        return self._oom_kills > 0

    def finish(self) -> MemoryReport:
        self._oom_kills = self._read_oom_kills()
        peak = _read_int(self.path / self._layout.peak)
        oom = OomSource.CGROUP if self._oom_kills > 0 else None
        return MemoryReport(self.mechanism, self.limit_bytes, peak, oom)

    def _read_oom_kills(self) -> int:
        try:
            match = _OOM_KILL.search((self.path / self._layout.events).read_text())
        except OSError:
            return 0
        return int(match[1]) if match else 0

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for tries_left in range(RMDIR_TRIES, 0, -1):
            try:
                self.path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError as exc:  # EBUSY while killed processes finish exiting
                if tries_left == 1:
                    log.warning("could not remove the memory cgroup %s: %s", self.path, exc)
                else:
                    time.sleep(RMDIR_PAUSE_S)


def open_memory_guard(
    limit_bytes: int | None, enforcement: MemoryEnforcement, name: str
) -> MemoryGuard:
    """The guard for one replica: a cgroup named `name` where one can be made and
    `enforcement` allows it, else the watchdog. Without a limit there is nothing to enforce,
    so a cgroup that cannot be made is never an error then.

    Raises:
        LaunchError: a limit is set, `enforcement` is "cgroup", and no memory cgroup can be
            made here.
    """
    if enforcement == "watchdog":
        return RssWatchdog(limit_bytes)
    try:
        return open_cgroup(limit_bytes, name)
    except LaunchError as exc:
        if enforcement == "cgroup" and limit_bytes is not None:
            raise
        what = "enforcing the memory limit" if limit_bytes is not None else "sampling memory"
        log.info("%s with the RSS watchdog: %s", what, exc)
        return RssWatchdog(limit_bytes)


def open_cgroup(limit_bytes: int | None, name: str) -> CgroupMemory:
    """A memory cgroup named `name` under this process's own, v2 before v1.

    Raises:
        LaunchError: none can be made here; the message says why for each hierarchy tried.
    """
    problems = []
    for layout, parent in _own_memory_cgroups():
        try:
            if layout is _V2 and not _delegates_memory(parent):
                problems.append(f"{layout.version} at {parent}: memory is not delegated here")
                continue
            return CgroupMemory.create(limit_bytes, parent, _safe(name), layout)
        except OSError as exc:
            problems.append(f"{layout.version} at {parent}: {exc.strerror or exc}")
    reason = "; ".join(problems) or "no cgroup memory controller is mounted"
    raise LaunchError(f"Cannot make a memory cgroup: {reason}.")


# A replica's cgroup, as the shim names it: `muster-<trial>-a<attempt>-r<rank>-<shim pid>`.
_REPLICA_CGROUP = re.compile(r"muster-.+-a[0-9]+-r[0-9]+-([0-9]+)")


def remove_orphaned_cgroups() -> list[Path]:
    """Remove the replica cgroups under this process's own whose shim is gone: a shim
    SIGKILLed (or killed with its machine's power) leaves its cgroup behind, empty once its
    group has died. One whose shim's pid lives is left alone (it may be starting), and the
    kernel refuses to remove one that still holds a process. Returns those removed."""
    removed = []
    for _, parent in _own_memory_cgroups():
        with contextlib.suppress(OSError):
            for child in parent.iterdir():
                found = _REPLICA_CGROUP.fullmatch(child.name)
                if found is None or os.path.exists(f"/proc/{found[1]}"):
                    continue
                try:
                    child.rmdir()
                except OSError:
                    continue  # its last processes are still exiting: the next sweep's
                removed.append(child)
    return removed


def _own_memory_cgroups() -> Iterator[tuple[_CgroupLayout, Path]]:
    """This process's cgroup directories that can hold a memory cgroup: v2 first, then v1."""
    cgroups = _read_lines("/proc/self/cgroup")
    mounts = _cgroup_mounts()
    for line in cgroups:
        hierarchy, controllers, path = line.split(":", 2)
        if hierarchy == "0" and not controllers and "cgroup2" in mounts:
            directory = _under_mount(mounts["cgroup2"], path)
            if directory is not None:
                yield _V2, directory
    for line in cgroups:
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(",") and "memory" in mounts:
            directory = _under_mount(mounts["memory"], path)
            if directory is not None:
                yield _V1, directory


def _cgroup_mounts() -> dict[str, tuple[str, Path]]:
    """(root, mount point) of the cgroup2 hierarchy and of the v1 memory hierarchy."""
    mounts: dict[str, tuple[str, Path]] = {}
    for line in _read_lines("/proc/self/mountinfo"):
        left, _, right = line.partition(" - ")
        fields, fstype = left.split(), right.split()
        if len(fields) < 5 or len(fstype) < 3:
            continue
        if fstype[0] == "cgroup2":
            mounts.setdefault("cgroup2", (fields[3], Path(fields[4])))
        elif fstype[0] == "cgroup" and "memory" in fstype[2].split(","):
            mounts.setdefault("memory", (fields[3], Path(fields[4])))
    return mounts


def _under_mount(mount: tuple[str, Path], path: str) -> Path | None:
    """The directory of cgroup `path` (as /proc/self/cgroup names it) under `mount`."""
    root, point = mount
    if path != root and not path.startswith(root.rstrip("/") + "/"):
        return None  # our cgroup is outside what this mount shows
    return point / path[len(root) :].lstrip("/")


def _delegates_memory(directory: Path) -> bool:
    """True when cgroups made in `directory` get the v2 memory controller. It is enabled
    there if need be, which a cgroup that holds processes may not do (then: False)."""
    try:
        if "memory" in (directory / "cgroup.subtree_control").read_text().split():
            return True
        if "memory" not in (directory / "cgroup.controllers").read_text().split():
            return False
        _write(directory / "cgroup.subtree_control", "+memory")
    except OSError:
        return False
    return True


def _safe(name: str) -> str:
    return _UNSAFE_NAME.sub("_", name)


def _read_lines(path: str) -> list[str]:
    try:
        return Path(path).read_text().splitlines()
    except OSError:
        return []


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def _write(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)
