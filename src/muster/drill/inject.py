"""The faults of a drill (`muster drill`), injected into a run from outside its script.

Each does to the training process what the real thing would:

- kill-rank (`kill_rank`): SIGKILL to the rank's training process alone, as the OOM killer
  or a crashed node would; its shim sees a death like any other.
- hang (`hang_rank`): SIGSTOP to every process of the rank's process group (DataLoader
  workers too): no progress, no output, no CPU. `resume_rank` continues it.
- straggler (`Throttle`): the group stopped and continued at a duty cycle: a slow rank.
- oom (`squeeze_memory`): the limit of the rank's own memory cgroup is lowered below its
  use. cgroup v2 reclaims, then OOM-kills in the write itself. v1 refuses a limit below the
  use (EBUSY once reclaim fails), so the limit is set as low as it takes, the training
  process is made the OOM killer's first pick (oom_score_adj 1000: raising it needs no
  privilege), and a small process of the drill's joins the cgroup and touches memory until
  the kernel OOM-kills the training process.
- corrupt-data, drop-data (`corrupt_files`, `hide_files`): a seeded choice of the run's data
  files truncated or garbled, or moved aside. A changed file is a new file put in place
  (never written in place): the data files are hard links shared with the clean snapshot.
- disk-full (`mount_small_fs`, `fill`, `release_small_fs`): the run writes to a small tmpfs
  that is filled to its last byte mid-run; the release copies what the run wrote back onto
  the real file system, at the same path.
- nan (`request_nan`): a request file the rank's harness reads (`muster.harness.drill_nan`).

Processes are signalled by identity (pid and start time, invariant 5): a process of the
rank's group is one in it now, started no earlier than its leader (the training process),
in its shim's session.
"""

from __future__ import annotations

import contextlib
import errno
import math
import os
import random
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from muster.atomic import atomic_write_json, fsync_dir
from muster.errors import InjectionError
from muster.launch.base import ProcessIdentity
from muster.launch.identity import group_members, is_alive, send_signal
from muster.launch.memory import (
    _OOM_KILL,
    _V1,
    _V2,
    _cgroup_mounts,
    _CgroupLayout,
    _under_mount,
)
from muster.launch.shim_launcher import ShimFiles
from muster.launch.small_fs import BALLAST, fill, mount_small_fs, release_small_fs
from muster.rundir import RankFiles
from muster.sizes import format_size

__all__ = [
    "BALLAST",
    "Throttle",
    "corrupt_files",
    "data_dir_in",
    "fill",
    "hang_rank",
    "hide_files",
    "kill_rank",
    "mount_small_fs",
    "rank_child",
    "release_small_fs",
    "request_nan",
    "resume_rank",
    "squeeze_memory",
]

MiB = 1 << 20
SQUEEZE_TIMEOUT_S = 30.0  # how long the OOM kill may take once the limit is down
# v1: what is added to the use for each limit tried in turn, until the kernel takes one
ABOVE_USE = (0, *(MiB << n for n in range(24)))
POLL_S = 0.05
# A cgroup's use, the one file memory.py (`_V1`, `_V2`: where the others are) never reads.
_USAGE = {_V1.version: "memory.usage_in_bytes", _V2.version: "memory.current"}
# The drill's memory-hungry neighbour: it joins the cgroup (argv[1], its cgroup.procs) and
# touches a MiB at a time until the cgroup's OOM-kill count (in argv[2]) rises, or up to
# argv[3] MiB; then it waits to be killed.
_NEIGHBOUR = """
import os, re, sys, time
procs, events, most = sys.argv[1], sys.argv[2], int(sys.argv[3])
def kills():
    with open(events) as f:
        found = re.search(r"^oom_kill ([0-9]+)$", f.read(), re.MULTILINE)
    return int(found[1]) if found else 0
with open(procs, "w") as f:
    f.write(str(os.getpid()))
start, held = kills(), []
while kills() == start and len(held) < most:
    held.append(b"\\1" * (1 << 20))
time.sleep(3600)
"""


# -- processes ---------------------------------------------------------------------------------


def rank_child(attempt_dir: Path, rank: int) -> ProcessIdentity:
    """The rank's training process, alive now.

    Raises:
        InjectionError: it has not started yet, or it has ended.
    """
    child = ShimFiles(attempt_dir, rank).child
    if child is None:
        raise InjectionError(f"rank {rank} has no training process yet (its shim has not "
                             f"started one): inject the fault once the run is running")
    if not is_alive(child):
        raise InjectionError(f"rank {rank}'s training process (pid {child.pid}) has ended")
    return child


@dataclass(frozen=True)
class _Group:
    """A rank's process group: its leader (the training process) and the shim's session."""

    leader: ProcessIdentity
    session: int | None  # None: no shim known, any session

    def members(self) -> list[ProcessIdentity]:
        return [m.identity for m in group_members(self.leader.pid)
                if m.start_ticks >= self.leader.start_ticks
                and (self.session is None or m.session == self.session)]

    def signal(self, signum: int) -> list[int]:
        """`signum` to every member, by identity; the pids it reached."""
        return [member.pid for member in self.members() if send_signal(member, signum)]


def _group(attempt_dir: Path, rank: int) -> _Group | None:
    """The rank's group as its shim recorded it (None before it started one)."""
    files = ShimFiles(attempt_dir, rank)
    child, shim = files.child, files.shim
    return None if child is None else _Group(child, None if shim is None else shim.pid)


def _live_group(attempt_dir: Path, rank: int) -> _Group:
    child = rank_child(attempt_dir, rank)
    shim = ShimFiles(attempt_dir, rank).shim
    return _Group(child, None if shim is None else shim.pid)


def kill_rank(attempt_dir: Path, rank: int) -> str:
    """SIGKILL to the rank's training process (the child alone); returns what was done.

    Raises:
        InjectionError: it has not started, or has ended.
    """
    child = rank_child(attempt_dir, rank)
    if not send_signal(child, signal.SIGKILL):
        raise InjectionError(f"rank {rank}'s training process (pid {child.pid}) has ended")
    return f"SIGKILL to rank {rank}'s training process (pid {child.pid})"


def hang_rank(attempt_dir: Path, rank: int) -> str:
    """SIGSTOP to every process of the rank's process group; returns what was done.

    Raises:
        InjectionError: the training process has not started, or has ended.
    """
    stopped = _live_group(attempt_dir, rank).signal(signal.SIGSTOP)
    if not stopped:
        raise InjectionError(f"rank {rank}'s training process has ended")
    return f"SIGSTOP to rank {rank}'s process group ({_processes(stopped)})"


def resume_rank(attempt_dir: Path, rank: int) -> None:
    """SIGCONT to the rank's process group; idempotent, and nothing when it is gone."""
    group = _group(attempt_dir, rank)
    if group is not None:
        group.signal(signal.SIGCONT)


def _processes(pids: list[int]) -> str:
    shown = ", ".join(str(pid) for pid in pids[:8])
    more = f" and {len(pids) - 8} more" if len(pids) > 8 else ""
    return f"{len(pids)} process{'es' if len(pids) != 1 else ''}: pid {shown}{more}"


class Throttle:
    """A straggler: the rank's process group stopped and continued at a duty cycle (it runs
    `duty` of each `period`), from a daemon thread, until `stop` or until the group is gone.
    """

    def __init__(self, attempt_dir: Path, rank: int, duty: float = 0.5,
                 period: float = 0.2) -> None:
        if not 0 < duty < 1:
            raise ValueError(f"duty is the share of each period the rank runs, between 0 "
                             f"and 1, but got {duty=}")
        if not period > 0:
            raise ValueError(f"period is in seconds and must be positive, but got {period=}")
        self.attempt_dir, self.rank, self.duty, self.period = attempt_dir, rank, duty, period
        self._stopping = threading.Event()
        self._group: _Group | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> str:
        """Start throttling; returns what was done.

        Raises:
            InjectionError: the training process has not started, or has ended.
            RuntimeError: started already.
        """
        if self._thread is not None:
            raise RuntimeError(f"rank {self.rank}'s throttle was started already")
        self._group = _live_group(self.attempt_dir, self.rank)
        self._thread = threading.Thread(target=self._run, args=(self._group,), daemon=True,
                                        name=f"drill-throttle-rank-{self.rank}")
        self._thread.start()
        return (f"throttled rank {self.rank} to {self.duty:.0%} (SIGSTOP/SIGCONT every "
                f"{self.period:g} s)")

    def stop(self) -> None:
        """Stop throttling, and leave the group continued. Idempotent."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join()
        if self._group is not None:
            self._group.signal(signal.SIGCONT)

    def _run(self, group: _Group) -> None:
        try:
            while not self._stopping.is_set() and group.signal(signal.SIGSTOP):
                self._stopping.wait(self.period * (1 - self.duty))
                group.signal(signal.SIGCONT)
                self._stopping.wait(self.period * self.duty)
        finally:
            group.signal(signal.SIGCONT)


# -- memory ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _MemoryCgroup:
    """A memory cgroup, and which version's files it has."""

    path: Path
    layout: _CgroupLayout

    def read(self, name: str) -> int:
        return int((self.path / name).read_text().strip().split()[0])

    @property
    def usage(self) -> int:
        return self.read(_USAGE[self.layout.version])

    @property
    def limit(self) -> str:
        return (self.path / self.layout.limit).read_text().strip()

    def oom_kills(self) -> int | None:
        """The OOM kills the cgroup counted; None once it is gone (its shim removes it as
        the rank ends)."""
        try:
            text = (self.path / self.layout.events).read_text()
        except FileNotFoundError:
            return None
        match = _OOM_KILL.search(text)
        return int(match[1]) if match else 0

    def set_limit(self, value: str) -> None:
        """Write the limit (OSError as the kernel refuses it: EBUSY, EACCES...)."""
        fd = os.open(self.path / self.layout.limit, os.O_WRONLY)
        try:
            os.write(fd, value.encode())
        finally:
            os.close(fd)


def _memory_cgroup_of(pid: int) -> _MemoryCgroup | None:
    """The memory cgroup `pid` is in (v1's memory hierarchy, else v2's), None if none."""
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return None
    mounts = _cgroup_mounts()
    entries = [line.split(":", 2) for line in lines]
    for _, controllers, path in entries:
        if "memory" in controllers.split(",") and "memory" in mounts:
            directory = _under_mount(mounts["memory"], path)
            return None if directory is None else _MemoryCgroup(directory, _V1)
    for hierarchy, controllers, path in entries:
        if hierarchy == "0" and not controllers and "cgroup2" in mounts:
            directory = _under_mount(mounts["cgroup2"], path)
            if directory is not None and (directory / _V2.limit).exists():
                return _MemoryCgroup(directory, _V2)
    return None


def _own_cgroup(attempt_dir: Path, rank: int, child: ProcessIdentity) -> _MemoryCgroup:
    """The memory cgroup of the rank's training process, if it is its own: not its shim's,
    nor the server's."""
    cgroup = _memory_cgroup_of(child.pid)
    if cgroup is None:
        raise InjectionError(f"rank {rank}'s training process is in no memory cgroup this "
                             "server can see (no cgroup memory controller is mounted here)")
    shim = ShimFiles(attempt_dir, rank).shim
    others = [("the server", os.getpid())] + ([("its shim", shim.pid)] if shim else [])
    for whose, pid in others:
        other = _memory_cgroup_of(pid)
        if other is not None and other.path == cgroup.path:
            raise InjectionError(
                f"rank {rank}'s training process has no memory cgroup of its own (it shares "
                f"{cgroup.path} with {whose}): its shim could make none, so its memory is "
                "watched by the RSS watchdog, and squeezing that cgroup would squeeze more "
                "than the rank")
    return cgroup


def squeeze_memory(attempt_dir: Path, rank: int) -> str:
    """Lower the limit of the rank's memory cgroup below its use, so that the kernel
    OOM-kills its training process; returns what was done, once it was.

    Raises:
        InjectionError: no live training process, no memory cgroup of its own, a limit
            this process may not write, or no OOM kill within SQUEEZE_TIMEOUT_S (the limit
            is then put back).
    """
    child = rank_child(attempt_dir, rank)
    cgroup = _own_cgroup(attempt_dir, rank, child)
    before, kills, usage = cgroup.limit, cgroup.oom_kills(), cgroup.usage
    limit = _lower_limit(cgroup, rank)
    adj = None
    try:
        if is_alive(child):
            adj = _set_oom_score_adj(child, "1000")
            _push_until_killed(cgroup, child, limit)
    except InjectionError:
        cgroup.set_limit(before)
        if adj is not None:  # putting a lower value back may need privilege: the error
            with contextlib.suppress(InjectionError):  # that matters is the one raised
                _set_oom_score_adj(child, adj)
        raise
    after = cgroup.oom_kills()
    how = "OOM-killed" if after is not None and after > (kills or 0) else "ended"
    gone = ("; its cgroup was removed with it before the OOM count could be read again (its "
            "exit record says how it ended)" if after is None else "")
    return (f"lowered rank {rank}'s memory limit to {format_size(limit)} "
            f"({cgroup.layout.version}; it used {format_size(usage)}): the kernel {how} "
            f"its training process (pid {child.pid}){gone}")


def _lower_limit(cgroup: _MemoryCgroup, rank: int) -> int:
    """Set the lowest limit the kernel takes: half the use (v2 takes it, and OOM-kills in
    the write), else (v1 refuses: EBUSY) the use as it is then, plus 0, 1, 2, 4... MiB."""
    if _took_limit(cgroup, limit := cgroup.usage // 2, rank):
        return limit
    for above in ABOVE_USE:
        if _took_limit(cgroup, limit := cgroup.usage + above, rank):
            return limit
    raise InjectionError(f"the kernel refused every memory limit near rank {rank}'s use "
                         f"({format_size(cgroup.usage)}) in {cgroup.path}")


def _took_limit(cgroup: _MemoryCgroup, limit: int, rank: int) -> bool:
    """Whether the kernel took `limit`: False for EBUSY (above it, the use it cannot
    reclaim)."""
    try:
        cgroup.set_limit(str(limit))
    except OSError as exc:
        if exc.errno == errno.EBUSY:
            return False
        raise InjectionError(
            f"squeezing rank {rank}'s memory needs write access to "
            f"{cgroup.path / cgroup.layout.limit} ({exc.strerror}; running as uid "
            f"{os.geteuid()}): run the server as root") from exc
    return True


def _set_oom_score_adj(child: ProcessIdentity, value: str) -> str | None:
    """Set the child's oom_score_adj; returns the value it had (None: it has ended). The
    file is opened first, then the identity checked: a recycled pid never gets it."""
    try:
        fd = os.open(f"/proc/{child.pid}/oom_score_adj", os.O_RDWR)
    except FileNotFoundError:
        return None
    try:
        if not is_alive(child):
            return None
        had = os.read(fd, 16).decode().strip()
        os.write(fd, value.encode())
        return had
    except OSError as exc:
        raise InjectionError(f"could not make the training process (pid {child.pid}) the "
                             f"OOM killer's first pick: {exc.strerror}") from exc
    finally:
        os.close(fd)


def _push_until_killed(cgroup: _MemoryCgroup, child: ProcessIdentity, limit: int) -> None:
    """Run the drill's memory-hungry neighbour in the cgroup until the child is gone."""
    argv = [sys.executable, "-I", "-S", "-c", _NEIGHBOUR, str(cgroup.path / "cgroup.procs"),
            str(cgroup.path / cgroup.layout.events), str((limit >> 20) + 16)]
    neighbour = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.PIPE, start_new_session=True)
    try:
        deadline = time.monotonic() + SQUEEZE_TIMEOUT_S
        while is_alive(child) and neighbour.poll() is None and time.monotonic() < deadline:
            time.sleep(POLL_S)
    finally:
        neighbour.kill()
        _, err = neighbour.communicate(timeout=SQUEEZE_TIMEOUT_S)
    if is_alive(child):
        said = err.decode(errors="replace").strip().splitlines()[-1:] or ["nothing"]
        raise InjectionError(
            f"the training process (pid {child.pid}) outlived its memory limit of "
            f"{format_size(limit)} for {SQUEEZE_TIMEOUT_S:g} s (the drill's process that "
            f"uses memory beside it said: {said[0]})")


# -- data files --------------------------------------------------------------------------------


def corrupt_files(data_dir: Path, fraction: float = 0.1, seed: int = 0) -> list[str]:
    """Truncate or garble a seeded choice of ceil(fraction * n) of the n non-empty regular
    files under `data_dir` (an empty file cannot be corrupted): the first half of the
    choice cut to half their length, the rest overwritten with random bytes. Each is
    replaced by a new file, never written in place. Returns their relative paths, sorted.

    Raises:
        ValueError: `fraction` is not in (0, 1].
        InjectionError: there is no such file.
    """
    files = [rel for rel in _regular_files(data_dir) if (data_dir / rel).stat().st_size > 0]
    chosen = _choose(files, fraction, seed, data_dir)
    half = (len(chosen) + 1) // 2
    for rel in chosen[:half]:
        _replace(data_dir / rel, _truncated(data_dir / rel))
    for rel in chosen[half:]:
        _replace(data_dir / rel, _garbled(data_dir / rel, random.Random(f"{seed}:{rel}")))
    return sorted(chosen)


def data_dir_in(root: Path, relative: str) -> Path:
    """`root/relative`, the data directory a data fault damages, where it resolves inside
    `root` (the run's copy of the context): a link out of it (to the shared data, or
    anywhere) is never followed into files the drill must not touch.

    Raises:
        InjectionError: it leads outside `root`, or is no directory.
    """
    found = (root / relative).resolve()
    if not found.is_relative_to(root.resolve()):
        raise InjectionError(f"the data directory {relative!r} leads outside the run's copy "
                             "of the context (a link): a drill damages only that copy")
    if not found.is_dir():
        raise InjectionError(f"the data directory {relative!r} is not a directory in the "
                             "context")
    return found


def hide_files(data_dir: Path, holding: Path, fraction: float = 0.1, seed: int = 0) -> list[str]:
    """Move a seeded choice of ceil(fraction * n) of the n regular files under `data_dir`
    into `holding` (same relative paths); returns those paths, sorted.

    Raises:
        ValueError: `fraction` is not in (0, 1].
        InjectionError: no files, `holding` inside `data_dir`, or on another file system.
    """
    if holding.resolve().is_relative_to(data_dir.resolve()):
        raise InjectionError(f"the hidden files' place {holding} must be outside the data "
                             f"directory {data_dir}")
    chosen = _choose(_regular_files(data_dir), fraction, seed, data_dir)
    for rel in chosen:
        (holding / rel).parent.mkdir(parents=True, exist_ok=True)
        try:
            os.rename(data_dir / rel, holding / rel)
        except OSError as exc:
            raise InjectionError(f"could not move {data_dir / rel} to {holding / rel} "
                                 f"({exc.strerror}): the place for hidden files must be "
                                 "on the data's file system") from exc
    return sorted(chosen)


def _regular_files(data_dir: Path) -> list[str]:
    """Every regular file under `data_dir` (links not followed), relative paths, sorted."""
    found = []
    for root, dirs, names in os.walk(data_dir):
        dirs.sort()
        for name in names:
            path = os.path.join(root, name)
            if stat.S_ISREG(os.lstat(path).st_mode):
                found.append(os.path.relpath(path, data_dir))
    return sorted(found)


def _choose(files: list[str], fraction: float, seed: int, data_dir: Path) -> list[str]:
    if not 0 < fraction <= 1:
        raise ValueError(f"fraction is the share of the files to change, in (0, 1], but "
                         f"got {fraction=}")
    if not files:
        raise InjectionError(f"{data_dir} holds no file a drill could change")
    return random.Random(seed).sample(files, math.ceil(fraction * len(files)))


def _chunks(path: Path, length: int | None = None) -> Iterator[bytes]:
    """The bytes of `path` (its first `length`), a MiB at a time."""
    left = os.lstat(path).st_size if length is None else length
    with open(path, "rb") as source:
        while left > 0 and (chunk := source.read(min(MiB, left))):
            left -= len(chunk)
            yield chunk


def _truncated(path: Path) -> Iterator[bytes]:
    """Its first half (at least one byte cut)."""
    return _chunks(path, os.lstat(path).st_size // 2)


def _garbled(path: Path, rng: random.Random) -> Iterator[bytes]:
    """Random bytes, as many as it has, each chunk unlike the one it replaces."""
    for chunk in _chunks(path):
        noise = rng.randbytes(len(chunk))
        yield noise if noise != chunk else bytes([noise[0] ^ 0xFF]) + noise[1:]


def _replace(path: Path, chunks: Iterator[bytes]) -> None:
    """A new file at `path` with `chunks` and the old one's mode, owner and times: a temp
    file beside it, fsynced, renamed over it (the old inode, and its other links, stay)."""
    old = os.lstat(path)
    tmp = path.with_name(f".{path.name}.drill-{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o600)
    try:
        for chunk in chunks:
            _write_all(fd, chunk)
        os.fchmod(fd, stat.S_IMODE(old.st_mode))
        if os.geteuid() == 0:
            os.fchown(fd, old.st_uid, old.st_gid)
        os.fsync(fd)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    finally:
        os.close(fd)
    os.utime(tmp, ns=(old.st_atime_ns, old.st_mtime_ns))
    os.replace(tmp, path)
    fsync_dir(path.parent)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


# -- nan -----------------------------------------------------------------------------------------


def request_nan(attempt_dir: Path, rank: int) -> str:
    """Ask the rank's harness to make the next loss it reports NaN; returns what was done.

    Raises:
        InjectionError: the attempt has no directory.
    """
    if not attempt_dir.is_dir():
        raise InjectionError(f"the attempt directory {attempt_dir} does not exist")
    atomic_write_json(RankFiles(attempt_dir, rank).drill_nan, {"requested_at": time.time()})
    return f"asked rank {rank}'s harness to make the next loss it reports NaN"
