"""What the harness learns from the environment muster sets (docs/run-directory.md)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

from muster.harness.diagnostics import DEFAULT_INTERVAL, interval_from
from muster.rundir import LOCAL_RUN_DIR

HEARTBEAT_INTERVAL_S = 10.0
HEARTBEAT_TIMEOUT_FRACTION = 1 / 3


class RunEnvironment(NamedTuple):
    """Who this training process is and where its files go."""

    run_dir: Path
    trial_id: int | None
    attempt: int
    rank: int
    world_size: int
    hparams: dict[str, Any]
    latest_checkpoint: Path | None
    heartbeat_timeout: float | None
    max_length: int | None = None  # the searcher's max_length (MUSTER_MAX_LENGTH)
    seed: int | None = None  # the trial's seed (MUSTER_SEED), from experiment_seed
    deterministic: bool = False  # reproducibility.deterministic (MUSTER_DETERMINISTIC=1)
    # Optimizer steps between the diagnostics' samples (MUSTER_DIAGNOSTICS); None: off.
    diagnostics_interval: int | None = DEFAULT_INTERVAL

    def heartbeat_interval(self) -> float:
        """10 s, or a third of the heartbeat timeout when that is shorter."""
        if self.heartbeat_timeout is None:
            return HEARTBEAT_INTERVAL_S
        return min(HEARTBEAT_INTERVAL_S, self.heartbeat_timeout * HEARTBEAT_TIMEOUT_FRACTION)


def read_environment(
    environ: Mapping[str, str], cwd: Path, local_hparams: Mapping[str, Any] | None = None
) -> RunEnvironment:
    """The run as `environ` describes it; without MUSTER_RUN_DIR, a local run in `cwd`.

    On the platform the trial's hyperparameters come from the MUSTER_HPARAMS file alone, so
    what the run used is what muster recorded; `local_hparams` serve only a local run.

    Raises:
        ValueError: a variable muster sets is malformed, or the hparams file is unreadable.
    """
    rank, world_size = _rank_and_world_size(environ)
    run_dir_var = environ.get("MUSTER_RUN_DIR")
    if not run_dir_var:
        return RunEnvironment(
            run_dir=cwd / LOCAL_RUN_DIR, trial_id=None, attempt=1, rank=rank,
            world_size=world_size, hparams=dict(local_hparams or {}), latest_checkpoint=None,
            heartbeat_timeout=_timeout_var(environ),
            max_length=_int_var(environ, "MUSTER_MAX_LENGTH", minimum=1),
            seed=_int_var(environ, "MUSTER_SEED", minimum=0),
            deterministic=environ.get("MUSTER_DETERMINISTIC") == "1",
            diagnostics_interval=interval_from(environ),
        )
    latest = environ.get("MUSTER_LATEST_CHECKPOINT")
    return RunEnvironment(
        run_dir=Path(run_dir_var),
        trial_id=_int_var(environ, "MUSTER_TRIAL_ID", minimum=0),
        attempt=_int_var(environ, "MUSTER_ATTEMPT", minimum=1) or 1,
        rank=rank,
        world_size=world_size,
        hparams=_read_hparams(environ.get("MUSTER_HPARAMS")),
        latest_checkpoint=Path(latest) if latest else None,
        heartbeat_timeout=_timeout_var(environ),
        max_length=_int_var(environ, "MUSTER_MAX_LENGTH", minimum=1),
        seed=_int_var(environ, "MUSTER_SEED", minimum=0),
        deterministic=environ.get("MUSTER_DETERMINISTIC") == "1",
        diagnostics_interval=interval_from(environ),
    )


def _rank_and_world_size(environ: Mapping[str, str]) -> tuple[int, int]:
    """torchrun's RANK and WORLD_SIZE where either is set (muster's on a distributed trial,
    or those of the processes a torchrun entrypoint starts, which inherit muster's own);
    else MUSTER_RANK and MUSTER_WORLD_SIZE, which every replica has
    (`resources.distributed_env` may leave torchrun's out); else rank 0 of 1."""
    prefix = "" if environ.get("RANK") or environ.get("WORLD_SIZE") else "MUSTER_"
    rank = _int_var(environ, f"{prefix}RANK", minimum=0) or 0
    world_size = _int_var(environ, f"{prefix}WORLD_SIZE", minimum=1) or 1
    if rank >= world_size:
        raise ValueError(f"{prefix}RANK={rank} must be smaller than "
                         f"{prefix}WORLD_SIZE={world_size}")
    return rank, world_size


def _int_var(environ: Mapping[str, str], name: str, minimum: int) -> int | None:
    """The integer in `name`, or None when it is unset or empty."""
    raw = environ.get(name)
    if not raw:
        return None
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{name} must be an integer, got {raw!r}") from None
    if value < minimum:
        raise ValueError(f"{name} must be at least {minimum}, got {value}")
    return value


def _timeout_var(environ: Mapping[str, str]) -> float | None:
    raw = environ.get("MUSTER_HEARTBEAT_TIMEOUT")
    if not raw:
        return None
    try:
        seconds = float(raw.removesuffix("s"))
    except ValueError:
        raise ValueError(
            f"MUSTER_HEARTBEAT_TIMEOUT must be a number of seconds like '300', got {raw!r}"
        ) from None
    if not seconds > 0:
        raise ValueError(f"MUSTER_HEARTBEAT_TIMEOUT must be positive, got {raw!r}")
    return seconds


def _read_hparams(path: str | None) -> dict[str, Any]:
    if not path:
        return {}
    try:
        hparams = json.loads(Path(path).read_bytes())
    except (OSError, ValueError) as exc:
        raise ValueError(
            f"could not read the hyperparameters in MUSTER_HPARAMS={path}: {exc}"
        ) from exc
    if not isinstance(hparams, dict):
        raise ValueError(
            f"MUSTER_HPARAMS={path} must hold a JSON object, got {type(hparams).__name__}"
        )
    return hparams
