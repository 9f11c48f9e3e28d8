"""Stall detection: a replica that checked in through the harness and then made no progress.

The harness's heartbeat thread rewrites the rank's heartbeat file every few seconds with the
time of the last *progress* call (docs/run-directory.md). A live thread over a deadlocked
training loop keeps the file fresh but `progress_time` still; that is what we look at.
Scripts that never use the harness write no heartbeat file and are never judged stalled,
unless the config declares `harness: true`: then a rank that has not checked in (written its
first heartbeat) `heartbeat_timeout` after its process started is stalled too.
"""

from __future__ import annotations

import datetime as dt
import logging
from pathlib import Path

from muster.atomic import read_json
from muster.rundir import RankFiles

log = logging.getLogger(__name__)


def checked_in(attempt_dir: Path, rank: int) -> bool:
    return RankFiles(attempt_dir, rank).heartbeat.exists()


def stall_reason(attempt_dir: Path, rank: int, timeout: float, now: float) -> str | None:
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
    since = dt.datetime.fromtimestamp(float(beat["progress_time"])).strftime("%H:%M:%S")
    where = f"step {step}" if step is not None else "its check-in"
    return (f"no progress for {idle:.0f}s (heartbeat_timeout {timeout:g}s); last progress at "
            f"{where}, {since}")


def check_in_overdue(waiting_since: float, timeout: float, now: float) -> str | None:
    """Why a replica that should use the harness counts as stalled before its first
    check-in, or None while it may still be starting (imports, data loading)."""
    waited = now - waiting_since
    if waited < timeout:
        return None
    return (f"no check-in {waited:.0f}s after it started (heartbeat_timeout {timeout:g}s): "
            "the config sets `harness: true`, but this rank has not called "
            "muster.harness.init(); call it on every rank, raise "
            "failure_policy.heartbeat_timeout if start-up takes this long, or set "
            "`harness: false`")
