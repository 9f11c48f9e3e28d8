"""Multi-rank trials for the log tests: rows made directly in a store, and each rank's log
and index written in the shim's format, with chosen chunk times so the merge is known.

The rows are test setup, not transitions (like `tests/store/rows.py`). A trial made here is
never touched by a running server's supervisor: its attempts are not live and it is not
queued or restarting.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from muster.store import Store, Trial
from tests.store.rows import add_attempt, add_experiment, add_replica, add_trial

Chunk = tuple[float, bytes]  # (the time the shim read it, its bytes)


@dataclass(frozen=True)
class RankFiles:
    """One rank's `rank-<r>.log` and `rank-<r>.index` in an attempt directory."""

    run_dir: Path
    rank: int

    @property
    def log(self) -> Path:
        return self.run_dir / f"rank-{self.rank}.log"

    @property
    def index(self) -> Path:
        return self.run_dir / f"rank-{self.rank}.index"

    def append(self, *chunks: Chunk) -> None:
        """Append chunks as the shim does: the bytes to the log, then one index line each
        with the chunk's start offset and its time."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        for stamp, data in chunks:
            offset = self.log.stat().st_size if self.log.exists() else 0
            with self.log.open("ab") as log:
                log.write(data)
            with self.index.open("ab") as index:
                index.write(f"{offset} {stamp:.6f}\n".encode())


def add_trial_with_ranks(
    store: Store, run_dirs: Sequence[Path], ranks: int, *, trial_state: str = "SUCCEEDED",
    attempt_state: str = "SUCCEEDED",
) -> int:
    """A trial with one attempt per directory in `run_dirs`, each with `ranks` replica rows
    (none when 0); the last attempt is in `attempt_state`, earlier ones FAILED. Its id."""
    with store.session_scope() as s:
        experiment = add_experiment(s, state="ACTIVE" if trial_state == "RUNNING"
                                    else "COMPLETED")
        trial = add_trial(s, experiment, state=trial_state)
        for number, run_dir in enumerate(run_dirs, start=1):
            last = number == len(run_dirs)
            attempt = add_attempt(s, trial, number=number,
                                  state=attempt_state if last else "FAILED")
            attempt.run_dir = str(run_dir)
            for rank in range(ranks):
                replica = add_replica(s, attempt, rank)
                replica.log_path = str(RankFiles(run_dir, rank).log)
        return trial.id


def add_attempt_with_ranks(store: Store, trial_id: int, run_dir: Path, ranks: int) -> None:
    """The trial's next attempt (a restart), running, with `ranks` replica rows; the
    attempt before it is FAILED."""
    with store.session_scope() as s:
        trial = s.get_one(Trial, trial_id)
        for earlier in trial.attempts:
            earlier.state = "FAILED"
        attempt = add_attempt(s, trial, number=len(trial.attempts) + 1, state="RUNNING")
        attempt.run_dir = str(run_dir)
        for rank in range(ranks):
            add_replica(s, attempt, rank)


def settle(store: Store, trial_id: int, state: str = "SUCCEEDED") -> None:
    """End the trial and its attempts, as the supervisor would after the replicas exit."""
    with store.session_scope() as s:
        trial = s.get_one(Trial, trial_id)
        trial.state = state
        for attempt in trial.attempts:
            attempt.state = "SUCCEEDED" if attempt.number == len(trial.attempts) else "FAILED"
