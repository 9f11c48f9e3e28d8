"""The muster run this process belongs to, read once from its environment (`muster.jobenv`):
what `get_cluster_info()` and `det.core.init()` both stand on."""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import TYPE_CHECKING

from muster.jobenv import RUN_DIR, JobEnvironment
from muster.rundir import RunDir

from .core._storage_ids import StorageIds

if TYPE_CHECKING:
    from muster.harness.run import Run


def on_platform() -> bool:
    """Whether muster started this process (else a local run writes into ./muster-run/)."""
    return bool(os.environ.get(RUN_DIR))


@functools.cache
def this_run() -> Run:
    """The run the environment describes (`muster.harness.run.read_run`).

    Raises:
        ValueError: a variable muster sets is malformed, or the hparams file is unreadable.
    """
    from muster.harness.run import read_run  # the harness, only once a script asks

    return read_run(os.environ, Path.cwd())


@functools.cache
def this_job() -> JobEnvironment:
    """Every variable muster handed this process; only on the platform (`on_platform`).

    Raises:
        ValueError: MUSTER_RUN_DIR is not set, or a variable is malformed.
    """
    return JobEnvironment.from_environ(os.environ)


@functools.cache
def storage_ids() -> StorageIds:
    """The run's checkpoints by storage id, shared so each is verified once per process."""
    run = this_run()
    return StorageIds(RunDir(run.run_dir).checkpoints, run.latest_checkpoint, run.trial_id,
                      run.source_checkpoint)
