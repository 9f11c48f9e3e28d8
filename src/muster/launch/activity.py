"""When a replica last showed life: output in its log, or CPU time used by its process group.

The shim keeps the replica's activity stamp (`RankFile.ACTIVE`) for the supervisor's
silence check (`failure_policy.silence_timeout`): a replica that printed nothing AND whose
process group used no CPU for that long is STALLED. Neither signal alone is enough: a data
download prints nothing for an hour but uses CPU; a process blocked on a lock or a socket
prints nothing and uses none.

The stamp is one short line, `"<last output> <last CPU use>\\n"` (Unix times, fixed width),
rewritten in place through the open file (never through a link put in its place), at most
once per `SAMPLE_S`, and only when a time moved. CPU is sampled only while the replica is
silent: a replica that keeps printing costs no /proc scan at all. A sample sums utime,
stime and the reaped children's times of every process in the group (`group_members`), per
process identity, so a process that exits is not mistaken for the group standing still, and
a new process counts as activity.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

from muster.launch.base import ProcessIdentity
from muster.launch.identity import group_members

__all__ = ["SAMPLE_S", "Activity", "ActivityStamp", "read_activity"]

log = logging.getLogger("muster.shim")

SAMPLE_S = 1.0  # how often the stamp may change, and CPU is sampled while silent
_WIDTH = 17  # "%17.3f": Unix times until the year 5138


@dataclass(frozen=True)
class Activity:
    """When the replica last wrote output and last used CPU (Unix times)."""

    output_at: float
    cpu_at: float

    @property
    def last(self) -> float:
        return max(self.output_at, self.cpu_at)


def read_activity(path: Path) -> Activity | None:
    """The stamp at `path`; None where there is none (a shim from before stamps, or one that
    could not make it) or it cannot be read as one."""
    try:
        with open(path, "rb") as file:
            fields = file.read(64).split()
    except OSError:
        return None
    try:
        output_at, cpu_at = (float(field) for field in fields)
    except ValueError:
        return None
    return Activity(output_at, cpu_at)


class ActivityStamp:
    """The shim's side: `output()` when bytes arrived, `tick(pgid)` from its loop."""

    def __init__(self, path: Path, started_at: float) -> None:
        self.output_at = self.cpu_at = started_at  # starting is a sign of life
        self._cpu: dict[ProcessIdentity, int] = {}
        self._next = 0.0
        self._written: tuple[float, float] | None = None
        self._fd: int | None = None
        try:
            self._fd = _create(path)
        except OSError as exc:
            log.error("cannot create the activity stamp %s (%s): silence_timeout cannot "
                      "judge this replica", path, exc)

    def output(self, now: float) -> None:
        self.output_at = now

    def tick(self, pgid: int) -> None:
        """Sample the group's CPU if the replica has been silent, and rewrite the stamp if a
        time moved; at most once per `SAMPLE_S`."""
        now = time.monotonic()
        if self._fd is None or now < self._next:
            return
        self._next = now + SAMPLE_S
        wall = time.time()
        if wall - self.output_at >= SAMPLE_S and self._cpu_moved(pgid):
            self.cpu_at = wall
        self._write()

    def _cpu_moved(self, pgid: int) -> bool:
        """True when a process of the group used CPU since the last sample, or is new."""
        before, self._cpu = self._cpu, {m.identity: m.cpu_ticks for m in group_members(pgid)}
        return any(before.get(identity, -1) < ticks for identity, ticks in self._cpu.items())

    def _write(self) -> None:
        times = (self.output_at, self.cpu_at)
        if self._fd is None or times == self._written:
            return
        line = f"{times[0]:{_WIDTH}.3f} {times[1]:{_WIDTH}.3f}\n".encode()
        try:
            os.pwrite(self._fd, line, 0)
        except OSError as exc:
            log.error("cannot update the activity stamp (%s); no further attempts: "
                      "silence_timeout cannot judge this replica", exc)
            self.close()
            return
        self._written = times

    def close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)


def _create(path: Path) -> int:
    """A new, empty stamp file. Never one found in its place: under `run_as` the job owns
    the attempt's directory, and a link it put there (a hard link to a file of root's, which
    O_NOFOLLOW does not stop) would have this process write into another file."""
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW,
                   0o644)
