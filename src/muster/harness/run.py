"""Which run this training process belongs to: the platform's job environment
(`muster.jobenv`), or a local run (docs/run-directory.md)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

from muster.jobenv import HPARAMS, PLATFORM_IDENTITY, RUN_DIR, JobEnvironment
from muster.rundir import LOCAL_RUN_DIR, Hparams

HEARTBEAT_INTERVAL_S = 10.0
HEARTBEAT_TIMEOUT_FRACTION = 1 / 3


class Run(NamedTuple):
    """Who this training process is and where its files go."""

    run_dir: Path
    trial_id: int | None
    attempt: int
    rank: int
    world_size: int
    hparams: Hparams
    latest_checkpoint: Path | None
    heartbeat_timeout: float | None
    max_length: int | None  # the searcher's max_length (MUSTER_MAX_LENGTH)
    seed: int | None  # the trial's seed (MUSTER_SEED), from experiment_seed
    deterministic: bool  # reproducibility.deterministic (MUSTER_DETERMINISTIC=1)
    # Optimizer steps between the diagnostics' samples (MUSTER_DIAGNOSTICS); None: off.
    diagnostics_interval: int | None
    # A warm start's checkpoint (MUSTER_SOURCE_CHECKPOINT): restore()'s while the trial
    # has no checkpoint of its own.
    source_checkpoint: Path | None = None

    def heartbeat_interval(self) -> float:
        """10 s, or a third of the heartbeat timeout when that is shorter."""
        if self.heartbeat_timeout is None:
            return HEARTBEAT_INTERVAL_S
        return min(HEARTBEAT_INTERVAL_S, self.heartbeat_timeout * HEARTBEAT_TIMEOUT_FRACTION)


def read_run(
    environ: Mapping[str, str], cwd: Path, local_hparams: Mapping[str, Any] | None = None
) -> Run:
    """The run as `environ` describes it; without MUSTER_RUN_DIR, a local run in `cwd`.

    On the platform the trial's hyperparameters come from the MUSTER_HPARAMS file alone, so
    what the run used is what muster recorded; `local_hparams` serve only a local run.

    Raises:
        ValueError: a variable muster sets is malformed, or the hparams file is unreadable.
    """
    if environ.get(RUN_DIR):
        job = JobEnvironment.from_environ(environ)
        hparams = _read_hparams(job.hparams_path)
    else:
        # A run without muster: the variables a person may set (RANK, MUSTER_SEED...) count,
        # what only the platform knows of a run does not.
        own = {name: value for name, value in environ.items() if name not in PLATFORM_IDENTITY}
        job = JobEnvironment.from_environ({**own, RUN_DIR: str(cwd / LOCAL_RUN_DIR)})
        hparams = dict(local_hparams or {})
    rank, world_size = job.process_rank()
    return Run(run_dir=job.run_dir, trial_id=job.trial_id, attempt=job.attempt, rank=rank,
               world_size=world_size, hparams=hparams, latest_checkpoint=job.latest_checkpoint,
               heartbeat_timeout=job.heartbeat_timeout, max_length=job.max_length,
               seed=job.seed, deterministic=job.deterministic,
               diagnostics_interval=job.diagnostics_interval,
               source_checkpoint=job.source_checkpoint)


def _read_hparams(path: Path | None) -> Hparams:
    if path is None:
        return {}
    try:
        hparams = json.loads(path.read_bytes())
    except (OSError, ValueError) as exc:
        raise ValueError(
            f"could not read the hyperparameters in {HPARAMS}={path}: {exc}"
        ) from exc
    if not isinstance(hparams, dict):
        raise ValueError(
            f"{HPARAMS}={path} must hold a JSON object, got {type(hparams).__name__}"
        )
    return hparams
