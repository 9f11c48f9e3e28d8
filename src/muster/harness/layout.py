"""Where the harness writes in the run directory (the layout is docs/run-directory.md)."""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

CHECKPOINTS_DIR = "checkpoints"


class RankFiles(NamedTuple):
    """The files one rank of one attempt writes, and the trial's checkpoint directory."""

    run_dir: Path
    attempt: int
    rank: int

    @property
    def attempt_dir(self) -> Path:
        return self.run_dir / f"attempt-{self.attempt}"

    def _named(self, suffix: str) -> Path:
        return self.attempt_dir / f"rank-{self.rank}{suffix}"

    @property
    def metrics(self) -> Path:
        return self._named(".metrics.jsonl")

    @property
    def heartbeat(self) -> Path:
        return self._named(".heartbeat.json")

    @property
    def samples(self) -> Path:
        return self._named(".samples.json")

    @property
    def stop_ack(self) -> Path:
        return self._named(".stop-ack.json")

    @property
    def checkpoints(self) -> Path:
        return self.run_dir / CHECKPOINTS_DIR
