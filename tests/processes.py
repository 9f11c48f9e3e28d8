"""Finding and killing what a test's muster home started, so no test leaks processes."""

from __future__ import annotations

import contextlib
import json
import os
import signal
from pathlib import Path

from muster.launch.base import ProcessIdentity
from muster.launch.identity import group_members, send_signal
from muster.rundir import RankFile, every_rank_file


def live_group(pgid: int) -> list[int]:
    """PIDs of the live (non-zombie) members of process group `pgid`."""
    return [member.pid for member in group_members(pgid)]


def kill_home_processes(home: Path) -> None:
    """SIGKILL every shim and training process group recorded under `home`/runs."""
    for shim_file in every_rank_file(home / "runs", RankFile.STATUS):
        record = json.loads(shim_file.read_text())
        pgid = record.get("pgid")
        if isinstance(pgid, int) and pgid > 1 and live_group(pgid):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)
        pid, ticks = record.get("shim_pid"), record.get("shim_start_ticks")
        if isinstance(pid, int) and isinstance(ticks, int):
            send_signal(ProcessIdentity(pid, ticks), signal.SIGKILL)
