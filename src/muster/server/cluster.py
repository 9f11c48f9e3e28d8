"""What this muster installation has and uses: slots, queue, and the disk guard."""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, select

from muster.sizes import format_size
from muster.states import TrialState
from muster.store import Trial
from muster.supervise.disk import disk_shortfall, free_bytes
from muster.supervise.supervisor import Supervisor


def cluster_status(supervisor: Supervisor) -> dict[str, Any]:
    """Slots in use (one per replica), the queue, and free disk against `min_free_disk`."""
    with supervisor.store.session_scope() as s:
        counts = dict(s.execute(select(Trial.state, func.count()).group_by(Trial.state)).all())
    runs_dir = supervisor.home.runs_dir
    free = free_bytes(runs_dir)
    shortfall = disk_shortfall(runs_dir, supervisor.min_free_disk)
    return {
        "slots": supervisor.slots,
        "slots_in_use": supervisor.slots_in_use(),
        "queued": counts.get(TrialState.QUEUED.value, 0),
        "suspect": counts.get(TrialState.SUSPECT.value, 0),
        "runs_dir": str(runs_dir),
        "free_disk_bytes": free,
        "min_free_disk_bytes": supervisor.min_free_disk,
        "disk_ok": shortfall is None,
        "disk_message": shortfall or (f"{format_size(free)} free, at least "
                                      f"{format_size(supervisor.min_free_disk)} required"),
    }
