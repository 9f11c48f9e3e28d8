"""Stall detection: a replica that makes no progress (harness) or shows no life (any script).

The harness's heartbeat thread rewrites the rank's heartbeat file every few seconds with the
time of the last *progress* call (docs/run-directory.md). A live thread over a deadlocked
training loop keeps the file fresh but `progress_time` still; that is what we look at.
Scripts that never use the harness write no heartbeat file and are never judged stalled,
unless the config declares `harness: true`: then a rank that has not checked in (written its
first heartbeat) `heartbeat_timeout` after its process started is stalled too.

Every replica, harness or not, is also judged by its shim's activity stamp
(`muster.launch.activity`): no output AND no CPU time used by its process group for
`silence_timeout` is a stall. The heartbeat is the finer signal where there is one (a loop
that spins without progress still uses CPU); silence catches what never checks in.

Each judgement is a `Stall`: why, and since when (the last progress, check-in start or sign
of life). The supervisor writes both into the rank's stall marker, and the replica's end
records the start (`replicas.stalled_since`), so usage counts the stalled time exactly
(`muster.services.usage`) without reading a sentence.
"""

from __future__ import annotations

import datetime as dt
import logging
from dataclasses import dataclass
from pathlib import Path

from muster.atomic import read_json
from muster.launch.activity import read_activity
from muster.launch.dumps import SUMMARY
from muster.rundir import AttemptDir, RankFiles
from muster.states import Integration

log = logging.getLogger(__name__)


def checked_in(attempt_dir: Path, rank: int) -> bool:
    return RankFiles(attempt_dir, rank).heartbeat.exists()


def integration_of(attempt_dir: Path, rank: int = 0) -> Integration | None:
    """What connected the rank to muster, from its heartbeat (`muster.harness.heartbeat`):
    None before it checked in, or for a file that does not say a known one (the harness
    before integrations wrote none: then it was the harness)."""
    try:
        beat = read_json(RankFiles(attempt_dir, rank).heartbeat)
    except (OSError, ValueError):
        return None
    if not isinstance(beat, dict):
        return None
    name = beat.get("integration", Integration.HARNESS.value)
    try:
        return Integration(name)
    except ValueError:
        return None


@dataclass(frozen=True)
class Stall:
    """A replica judged stalled: why (one line), and when the stall began (Unix time): its
    last progress, the start of its wait for a check-in, or its last sign of life."""

    reason: str
    since: float


def stall_reason(attempt_dir: Path, rank: int, timeout: float, now: float) -> Stall | None:
    """Why the replica counts as stalled at `now`, or None while it makes progress."""
    path = RankFiles(attempt_dir, rank).heartbeat
    try:
        beat = read_json(path)
    except ValueError as exc:  # the harness writes it atomically: this file is damaged
        log.warning("cannot read the heartbeat %s (%s); no stall check until it is rewritten",
                    path, exc)
        return None
    if not isinstance(beat, dict) or not isinstance(beat.get("progress_time"), int | float):
        return None
    idle = now - float(beat["progress_time"])
    if idle < timeout:
        return None
    step = beat.get("step")
    progress = float(beat["progress_time"])
    where = f"step {step}" if step is not None else "its check-in"
    return Stall(f"no progress for {idle:.0f}s (heartbeat_timeout {timeout:g}s); last progress "
                 f"at {where}, {_clock(progress)}", progress)


def check_in_overdue(waiting_since: float, timeout: float, now: float) -> Stall | None:
    """Why a replica that should use the harness counts as stalled before its first
    check-in, or None while it may still be starting (imports, data loading)."""
    waited = now - waiting_since
    if waited < timeout:
        return None
    return Stall(f"no check-in {waited:.0f}s after it started (heartbeat_timeout "
                 f"{timeout:g}s): the config sets `harness: true`, but this rank has not "
                 "called muster.harness.init(); call it on every rank, raise "
                 "failure_policy.heartbeat_timeout if start-up takes this long, or set "
                 "`harness: false`", waiting_since)


def silence_reason(files: RankFiles, started_at: float, timeout: float,
                   now: float) -> Stall | None:
    """Why the replica counts as stalled at `now` by its activity stamp: no output and no CPU
    for `timeout` since the later of the two (and of its start), or None while it shows life
    or has no stamp."""
    activity = read_activity(files.active)
    if activity is None:
        return None
    last = max(activity.last, started_at)
    idle = now - last
    if idle < timeout:
        return None
    return Stall(f"no output and no CPU time used for {_span(idle)} (silence_timeout "
                 f"{_span(timeout)}); last output at "
                 f"{_clock(max(activity.output_at, started_at))}, last CPU use at "
                 f"{_clock(max(activity.cpu_at, started_at))}", last)


def _span(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"


def _clock(stamp: float) -> str:
    return dt.datetime.fromtimestamp(stamp).strftime("%H:%M:%S")


@dataclass(frozen=True)
class StallEvidence:
    """The evidence bundle taken before a stalled replica was stopped."""

    bundle: str  # its directory, relative to the attempt's ("evidence/<id>")
    lines: list[str]  # per rank collected, the main thread's stack in one line

    @property
    def summary(self) -> str | None:
        return "\n".join(self.lines) or None


def stall_evidence(attempt_dir: AttemptDir, rank: int) -> StallEvidence | None:
    """The evidence bundle the replica's stall asked for, if it did: every rank's part."""
    marker = read_json(attempt_dir.rank(rank).stalled)
    bundle = marker.get("bundle") if isinstance(marker, dict) else None
    ranks = marker.get("ranks", [rank]) if isinstance(marker, dict) else []
    if not isinstance(bundle, str) or not isinstance(ranks, list):
        return None
    try:
        directory = attempt_dir.evidence_of(bundle, rank).parent
    except ValueError:
        return None
    lines = [line for other in sorted(r for r in ranks if isinstance(r, int))
             if (line := _stack_line(directory / f"rank-{other}", other)) is not None]
    return StallEvidence(str(directory.relative_to(attempt_dir.path)), lines)


def stalled_since(attempt_dir: AttemptDir, rank: int) -> float | None:
    """When the replica's stall began, as its stall marker says; None where it has no
    marker, or one from before markers said it."""
    marker = read_json(attempt_dir.rank(rank).stalled)
    since = marker.get("since") if isinstance(marker, dict) else None
    if isinstance(since, bool) or not isinstance(since, int | float):
        return None
    return float(since)


def _stack_line(directory: Path, rank: int) -> str | None:
    """Rank `rank`'s main-thread line from its part of a bundle; None where it has none."""
    try:
        summary = read_json(directory / SUMMARY)
    except ValueError as exc:  # written atomically: a damaged one says nothing
        log.warning("cannot read the evidence summary in %s: %s", directory, exc)
        return None
    line = summary.get("line") if isinstance(summary, dict) else None
    if not isinstance(line, str) or not line:
        return None
    return line if line.startswith("rank ") else f"rank {rank} {line}"
