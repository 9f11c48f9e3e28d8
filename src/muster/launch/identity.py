"""Process identity from /proc (invariant 5): a pid is only trusted together with its start time.

A pid alone is recycled by the kernel; (pid, start ticks since boot) never is. Everything here
reads `/proc/<pid>/stat`, so it works in a process that did not start the one it asks about
(a restarted server).
"""

from __future__ import annotations

import errno
import os
import signal
from dataclasses import dataclass
from pathlib import Path

from muster.launch.base import ProcessIdentity

__all__ = [
    "ProcStat",
    "group_members",
    "is_alive",
    "own_identity",
    "parse_stat",
    "read_identity",
    "read_stat",
    "send_signal",
]

_PROC = Path("/proc")
_DEAD_STATES = frozenset({"Z", "X", "x"})


@dataclass(frozen=True)
class ProcStat:
    """The few fields of `/proc/<pid>/stat` muster needs."""

    pid: int
    state: str
    pgid: int
    session: int
    start_ticks: int
    # utime + stime + cutime + cstime: the CPU time it and its reaped children used, in ticks
    cpu_ticks: int = 0

    @property
    def is_dead(self) -> bool:
        """True for a zombie (exited, not yet reaped) or a dying task."""
        return self.state in _DEAD_STATES

    @property
    def identity(self) -> ProcessIdentity:
        return ProcessIdentity(pid=self.pid, start_ticks=self.start_ticks)


def parse_stat(text: str) -> ProcStat:
    """Parse one `/proc/<pid>/stat` line.

    The command name (field 2) may hold spaces and parentheses, so the fixed fields are
    taken after the LAST ')'. Raises ValueError on a line that does not have that shape.
    """
    head, sep, tail = text.rpartition(")")
    if not sep:
        raise ValueError(f"/proc stat line has no ')' after the command name: {text[:80]!r}")
    pid = int(head.split("(", 1)[0])
    fields = tail.split()
    # `fields[0]` is field 3 of proc(5) ("state"); field N is fields[N - 3].
    if len(fields) < 20:
        raise ValueError(f"/proc stat line has {len(fields) + 2} fields, expected >= 22")
    return ProcStat(
        pid=pid,
        state=fields[0],
        pgid=int(fields[2]),
        session=int(fields[3]),
        start_ticks=int(fields[19]),
        cpu_ticks=sum(int(field) for field in fields[11:15]),
    )


def read_stat(pid: int) -> ProcStat | None:
    """The parsed stat of `pid`, or None when no such process exists (any more)."""
    try:
        text = (_PROC / str(pid) / "stat").read_text(encoding="utf-8", errors="replace")
    except (FileNotFoundError, ProcessLookupError):
        return None
    return parse_stat(text)


def read_identity(pid: int) -> ProcessIdentity | None:
    """The identity of the process now holding `pid`, or None when there is none."""
    stat = read_stat(pid)
    return None if stat is None else stat.identity


def own_identity() -> ProcessIdentity:
    """The identity of the calling process."""
    identity = read_identity(os.getpid())
    if identity is None:
        raise RuntimeError("/proc/self/stat is unreadable: muster needs a Linux /proc")
    return identity


def is_alive(identity: ProcessIdentity) -> bool:
    """True when that very process (same pid AND start ticks) exists and is not a zombie."""
    stat = read_stat(identity.pid)
    return stat is not None and stat.start_ticks == identity.start_ticks and not stat.is_dead


def group_members(pgid: int, *, zombies: bool = False) -> list[ProcStat]:
    """Every live (non-zombie) process whose process group is `pgid`, found by scanning /proc;
    with `zombies`, the exited ones not yet reaped too (their CPU times are still there)."""
    members = []
    for entry in _PROC.iterdir():
        if not entry.name.isdigit():
            continue
        stat = read_stat(int(entry.name))
        if stat is not None and stat.pgid == pgid and (
                not stat.is_dead or (zombies and stat.state == "Z")):
            members.append(stat)
    return members


def send_signal(identity: ProcessIdentity, signum: int) -> bool:
    """Signal the process only if it is still the one `identity` names; True if sent.

    A pidfd pins the process before the identity check, so the signal cannot reach a process
    that took over the pid in between.
    """
    try:
        pidfd = os.pidfd_open(identity.pid)
    except ProcessLookupError:
        return False
    except OSError as exc:
        if exc.errno != errno.ENOSYS:
            raise
        return _send_signal_without_pidfd(identity, signum)
    try:
        if not is_alive(identity):
            return False
        signal.pidfd_send_signal(pidfd, signum)
        return True
    except ProcessLookupError:
        return False
    finally:
        os.close(pidfd)


def _send_signal_without_pidfd(identity: ProcessIdentity, signum: int) -> bool:
    """Kernels older than 5.3 have no pidfd: check the identity, then signal by pid."""
    if not is_alive(identity):
        return False
    try:
        os.kill(identity.pid, signum)
    except ProcessLookupError:
        return False
    return True
