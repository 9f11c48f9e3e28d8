"""`det.get_cluster_info()`: the trial as Determined describes it, from what muster hands it.

On the platform (MUSTER_RUN_DIR set) a trial is a Determined "TRIAL" task; anywhere else
there is no cluster and the answer is None, as off a Determined cluster. What a muster trial
cannot know (a master to talk to, its experiment's config) raises `NotImplementedError`
rather than a made-up value.
"""

from __future__ import annotations

import functools
import socket
from typing import TYPE_CHECKING, Any

from muster.jobenv import JobEnvironment

from . import _run
from ._unprovided import unprovided
from .core._storage_ids import StorageIds

if TYPE_CHECKING:
    from muster.harness.run import Run

TRIAL = "TRIAL"
_NO_MASTER = "a muster trial talks to no master: it reports through files muster reads"


class TrialInfo:
    """The trial: its id, seed, hyperparameters, and the part of its config muster hands it.

    Attributes:
        trial_id: muster's trial id (MUSTER_TRIAL_ID); None where a person started the
            process by hand without one.
        experiment_id: muster's experiment id (MUSTER_EXPERIMENT_ID); None where a person
            started the process by hand without one.
        trial_seed: the trial's seed (MUSTER_SEED); None when the config sets no
            `reproducibility.experiment_seed`.
        hparams: the trial's hyperparameters (the MUSTER_HPARAMS file).
    """

    def __init__(self, *, trial_id: int | None, experiment_id: int | None,
                 trial_seed: int | None, hparams: dict[str, Any], config: dict[str, Any]) -> None:
        self.trial_id = trial_id
        self.experiment_id = experiment_id
        self.trial_seed = trial_seed
        self.hparams = hparams
        # Determined's whole experiment config; here only what muster hands the trial: the
        # searcher's max_length (MUSTER_MAX_LENGTH), under "searcher", when the config sets one.
        self._config = config


class ClusterInfo:
    """What `det.get_cluster_info()` returns on the platform: one rank of a muster trial."""

    task_type = TRIAL

    def __init__(self, run: Run, job: JobEnvironment, storage: StorageIds,
                 agent_id: str) -> None:
        self._job = job
        self._storage = storage
        self.agent_id = agent_id  # the host the rank runs on
        self.slot_ids: list[int] = list(job.gpus or ())  # CUDA indices of the rank's GPUs
        self.task_id = run.run_dir.name  # the trial's uuid, its run directory's name
        self.allocation_id = f"{self.task_id}.{run.attempt}"  # one per attempt
        searcher = {} if run.max_length is None else {"max_length": run.max_length}
        self._trial = TrialInfo(trial_id=run.trial_id, experiment_id=job.experiment_id,
                                trial_seed=run.seed, hparams=run.hparams,
                                config={"searcher": searcher})

    @property
    def trial(self) -> TrialInfo:
        return self._trial

    @functools.cached_property
    def latest_checkpoint(self) -> str | None:
        """The storage id of the checkpoint to resume from (MUSTER_LATEST_CHECKPOINT, or the
        latest intact one in the trial's checkpoints, else the experiment's warm start:
        `searcher.source_trial_id`, `source_checkpoint_uuid`); None before the first."""
        return self._storage.latest()

    @property
    def container_rank(self) -> int:
        """The node's number among the trial's nodes (GROUP_RANK; 0 on one node)."""
        distributed = self._job.distributed
        return (distributed.group_rank or 0) if distributed is not None else 0

    @property
    def container_addrs(self) -> list[str]:
        """The address of each node, by node: rank 0's (MASTER_ADDR) on one node."""
        distributed = self._job.distributed
        if distributed is None:
            return ["127.0.0.1"]
        if self._spans_nodes():
            raise unprovided("ClusterInfo.container_addrs", "muster tells each rank the "
                             "address of rank 0 (MASTER_ADDR), not every node's")
        return [distributed.master_addr or "127.0.0.1"]

    @property
    def container_slot_counts(self) -> list[int]:
        """Processes per node: every rank on one node."""
        if self._spans_nodes():
            raise unprovided("ClusterInfo.container_slot_counts",
                             "muster tells a rank how many ranks its own node runs "
                             "(LOCAL_WORLD_SIZE), not every node's")
        distributed = self._job.distributed
        return [distributed.world_size if distributed is not None else 1]

    @property
    def user_data(self) -> dict[str, Any]:
        raise unprovided("ClusterInfo.user_data", "muster does not hand a trial its "
                         "config's data section; pass such values as hyperparameters "
                         "(info.trial.hparams) or environment.variables")

    @property
    def gpu_uuids(self) -> list[str]:
        raise unprovided("ClusterInfo.gpu_uuids", "muster hands a rank its GPUs as CUDA "
                         "indices (CUDA_VISIBLE_DEVICES, info.slot_ids), not UUIDs")

    @property
    def master_url(self) -> str:
        raise unprovided("ClusterInfo.master_url", _NO_MASTER)

    @property
    def cluster_id(self) -> str:
        raise unprovided("ClusterInfo.cluster_id", _NO_MASTER)

    @property
    def session_token(self) -> str:
        raise unprovided("ClusterInfo.session_token", _NO_MASTER)

    @property
    def master_cert_name(self) -> str | None:
        raise unprovided("ClusterInfo.master_cert_name", _NO_MASTER)

    @property
    def master_cert_file(self) -> str | None:
        raise unprovided("ClusterInfo.master_cert_file", _NO_MASTER)

    def _spans_nodes(self) -> bool:
        distributed = self._job.distributed
        return (distributed is not None and distributed.local_world_size is not None
                and distributed.local_world_size < distributed.world_size)


@functools.cache
def get_cluster_info() -> ClusterInfo | None:
    """The trial this process is a rank of, or None when muster did not start it.

    Raises:
        ValueError: a variable muster sets is malformed, or the hparams file is unreadable.
    """
    if not _run.on_platform():
        return None
    return ClusterInfo(_run.this_run(), _run.this_job(), _run.storage_ids(),
                       socket.gethostname())
