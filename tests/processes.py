"""Finding and killing what a test's muster home started, so no test leaks processes."""

from __future__ import annotations

import json
import signal
from pathlib import Path

from muster.launch.base import ProcessIdentity
from muster.launch.identity import group_members, send_signal
from muster.rundir import RankFile, every_rank_file


def live_group(pgid: int) -> list[int]:
    """PIDs of the live (non-zombie) members of process group `pgid`."""
    return [member.pid for member in group_members(pgid)]


def kill_home_processes(home: Path) -> None:
    """SIGKILL every shim and training process recorded under `home`/runs that still lives.

    Only processes that provably are that replica's are touched: a recorded group number
    may by now name another test's group (pids recycle while two workers churn through
    thousands of processes), so a member must be in the shim's session and have started no
    earlier than the recorded child.
    """
    for shim_file in every_rank_file(home / "runs", RankFile.STATUS):
        record = json.loads(shim_file.read_text())
        pgid, shim_pid = record.get("pgid"), record.get("shim_pid")
        child_ticks = record.get("child_start_ticks")
        if isinstance(pgid, int) and pgid > 1 and isinstance(shim_pid, int) \
                and isinstance(child_ticks, int):
            for member in group_members(pgid):
                if member.session == shim_pid and member.start_ticks >= child_ticks:
                    send_signal(member.identity, signal.SIGKILL)
        ticks = record.get("shim_start_ticks")
        if isinstance(shim_pid, int) and isinstance(ticks, int):
            send_signal(ProcessIdentity(shim_pid, ticks), signal.SIGKILL)
