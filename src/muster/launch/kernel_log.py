"""The kernel's OOM kills, read from its log (`/dev/kmsg`), for a replica without a cgroup.

A replica in a memory cgroup of its own has the cgroup's OOM-kill counter; one without
(no cgroup could be made here) has only the kernel log. `KernelLog.open()` is called before
the training process starts and puts the reader at the log's end, so that `oom_kills()`,
called once the process has died, reads exactly what the kernel logged since: every
"Out of memory: Killed process 1234 (python) total-vm:..." (or "Memory cgroup out of
memory: Killed process ...") and "oom-kill:...,task=python,pid=1234,uid=0" line, as the pid
and the record's time. Which of those pids were the replica's, and when, is the caller's
to judge (`muster.launch.memory`): a pid alone is recycled.

Where `/dev/kmsg` cannot be read (no such device in a container, or not root where
`kernel.dmesg_restrict` is set) there is no kernel log: `problem` says why, and nothing is
ever named an OOM kill from it. Records the kernel overwrote before they were read (its
ring buffer is small, and a chatty kernel can wrap it) are skipped, with the same result
for their kills.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path

__all__ = ["KMSG", "KernelKill", "KernelLog", "parse_record"]

log = logging.getLogger("muster.shim")

KMSG = Path("/dev/kmsg")
RECORD_BYTES = 8192  # one read returns one whole record; a buffer too small for it is EINVAL
MAX_RECORDS = 100_000  # one scan reads at most this many records (a bound, not a budget)
_KILLED = re.compile(rb"\bKilled process (\d+) \(")
_OOM_KILL = re.compile(rb"^oom-kill:.*?[,:]pid=(\d+)(?:,|\s|$)")


@dataclass(frozen=True)
class KernelKill:
    """One OOM kill the kernel logged: the victim's pid, and when (seconds since boot)."""

    pid: int
    at: float


def parse_record(record: bytes) -> KernelKill | None:
    """The OOM kill one `/dev/kmsg` record reports, if it reports one.

    A record is `PRIORITY,SEQUENCE,MICROSECONDS,FLAGS[,...];MESSAGE\\n`, then continuation
    lines that start with a space (not read).
    """
    header, sep, text = record.partition(b";")
    fields = header.split(b",")
    if not sep or len(fields) < 3:
        return None
    try:
        at = int(fields[2]) / 1e6
    except ValueError:
        return None
    message = text.split(b"\n", 1)[0]
    match = _KILLED.search(message) or _OOM_KILL.match(message)
    return KernelKill(int(match[1]), at) if match else None


class KernelLog:
    """A reader of the kernel log from the moment it was opened; see the module."""

    def __init__(self, fd: int | None, problem: str | None) -> None:
        self._fd = fd
        self.problem = problem  # why there is no kernel log to read; None: there is one

    @classmethod
    def open(cls, path: Path = KMSG) -> KernelLog:
        """A reader at the log's end; one with `problem` set where it cannot be read."""
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as exc:
            return cls(None, f"cannot read {path}: {exc.strerror or exc}")
        try:
            os.lseek(fd, 0, os.SEEK_END)
        except OSError as exc:
            os.close(fd)
            return cls(None, f"cannot seek to the end of {path}: {exc.strerror or exc}")
        return cls(fd, None)

    def oom_kills(self) -> list[KernelKill]:
        """The OOM kills logged since the reader was opened (or since the last call)."""
        kills: list[KernelKill] = []
        for _ in range(MAX_RECORDS):
            record = self._next_record()
            if record is None:
                break
            kill = parse_record(record)
            if kill is not None:
                kills.append(kill)
        return kills

    def _next_record(self) -> bytes | None:
        """The next record; None at the end of the log (or where there is none)."""
        while self._fd is not None:
            try:
                return os.read(self._fd, RECORD_BYTES) or None
            except BlockingIOError:
                return None
            except BrokenPipeError:
                continue  # overwritten before we read it: on with the oldest record left
            except OSError as exc:
                self.problem = f"cannot read {KMSG}: {exc.strerror or exc}"
                log.warning("the kernel log stopped answering: %s", self.problem)
                self.close()
        return None

    def close(self) -> None:
        """Idempotent."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)
