"""Starting an attempt: the pure launch plan of its replicas, then recording and launching it.

`replica_specs` turns plain facts (`AttemptPlan`) into one `ReplicaSpec` per rank, with
torchrun's environment; it is table-tested without processes. `Launching.start` records
the attempt first (committed, with a queued trial's GPUs), then prepares its directory and
hands the specs to the launcher; a replica that cannot be launched stops the others and
ends the attempt INTERNAL, so the policy retries it.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session

from muster import job_secrets
from muster.atomic import atomic_write_json
from muster.checkpoint_storage.resume import cache_dir, resumable, resume_point
from muster.config import ExperimentConfig
from muster.environments.registry import TrialEnvironment
from muster.errors import ConfigError, GpuError, InjectionError, LaunchError
from muster.home import Home
from muster.jobenv import Distributed, JobEnvironment, build_env
from muster.launch.accounts import Account, RunAs
from muster.launch.base import ProcessIdentity, ReplicaSpec, ReplicaStatus
from muster.launch.small_fs import mount_small_fs
from muster.launch.torchrun import free_port, wants_distributed_env
from muster.rundir import AttemptDir, Hparams, RunDir
from muster.search.history import generation_of
from muster.states import AttemptState, EventReason, Reason, ReplicaPhase, TrialState
from muster.store import (
    Attempt,
    Checkpoint,
    Experiment,
    Replica,
    Trial,
    record_event,
    transition,
)
from muster.store.configs import experiment_config
from muster.supervise import outside_snapshot, verification
from muster.supervise.context import ACTOR, SupervisorContext
from muster.supervise.ending import Ending
from muster.supervise.manifest import empty_data_problem
from muster.supervise.ownership import grant_attempt, grant_trial
from muster.supervise.scans import DataScans, ScanFailed
from muster.supervise.searching import trial_seed
from muster.supervise.warm_start import Source, copy_source, source_of_trial
from muster.supervise.workdir import prepare_workdir
from muster.system_metrics import DEFAULT_INTERVAL_S

__all__ = ["AttemptPlan", "GpuPlan", "Launching", "Prelaunch", "Recorded", "latest_checkpoint",
           "replica_specs", "resumed_from"]

log = logging.getLogger(__name__)

GpuPlan = tuple[tuple[int, ...], ...]  # the GPU indices of each rank, from the scheduler


@dataclass(frozen=True)
class Prelaunch:
    """What must happen before a trial's next attempt is recorded, read in one transaction
    (`Launching.prelaunch`): most launches need none of it."""

    scan: bool  # its data is to be scanned first (`scan_data`)
    checkpoints: bool  # it has some to resume from: one may be in storage alone
    standby: bool  # a warm standby waits to be promoted


class Scan(Enum):
    """Where a trial's data scan stands before its first launch."""

    READY = "ready"  # scanned (or nothing to scan): it may launch
    WAITING = "waiting"  # the scan runs, off the pass: it stays queued
    FAILED = "failed"  # the trial has ended FAILED with the reason
MASTER_ADDR = "127.0.0.1"


@dataclass(frozen=True)
class AttemptPlan:
    """The facts one attempt's launch plan is made of (plain data, no store)."""

    trial_id: int
    trial_uuid: str
    trial_number: int
    number: int  # the attempt's
    dir: AttemptDir
    config: ExperimentConfig
    workdir: Path  # the trial's own copy of the context: every replica's cwd
    master_port: int
    latest_checkpoint: Path | None
    # Rank -> its GPU indices where muster schedules GPUs (a rank without any sees none);
    # None where this server schedules no GPUs at all.
    gpus: Mapping[int, tuple[int, ...]] | None
    seed: int | None
    incarnation: int = 0
    experiment_id: int | None = None  # the trial's experiment (None: plans made by hand)
    standby: bool = False  # a warm standby: it waits in init() for its go file
    secrets: Mapping[str, str] = field(default_factory=dict)  # environment.secrets' values
    # What its replicas run in (their PATH's first directories); None: the interpreter
    # muster runs on, as before environments (plans made by hand in tests).
    environment: TrialEnvironment | None = None
    account: Account | None = None  # the Unix account its jobs run as (`run_as`)
    log_limit: int | None = None  # what each replica's log keeps (`resources.log_limit`)
    # Its experiment's warm start, copied into its run directory at the launch
    # (`warm_start.copy_source`), while it has no checkpoint of its own.
    source: Source | None = None
    # How often each replica's shim samples its resources (the `system/` series).
    system_metrics_interval: float = DEFAULT_INTERVAL_S
    # How far the searcher lets it train (MUSTER_MAX_LENGTH): `searcher.max_length`, or a
    # PBT member's own (`SearcherConfig.length_of`).
    max_length: int | None = None


def replica_specs(plan: AttemptPlan, ranks: Iterable[int] | None = None) -> list[ReplicaSpec]:
    """One launch plan per rank (all of them by default), with the torchrun environment
    when the trial is distributed (`wants_distributed_env`): one MASTER_PORT per attempt, so
    a restarted rendezvous never meets the last attempt's stragglers. Pure: each spec holds
    the job's own variables only (`build_env`); the shim puts them over the environment it
    inherited."""
    config = plan.config
    world_size = config.resources.replicas
    distributed = wants_distributed_env(config.resources.distributed_env, world_size,
                                        config.entrypoint)
    specs = []
    for rank in range(world_size) if ranks is None else ranks:
        job = JobEnvironment(
            run_dir=plan.dir.run.path, trial_id=plan.trial_id,
            experiment_id=plan.experiment_id, attempt=plan.number,
            hparams_path=plan.dir.hparams, rank=rank, world_size=world_size,
            incarnation=plan.incarnation,
            distributed=(Distributed.on_one_node(rank, world_size, MASTER_ADDR,
                                                 plan.master_port) if distributed else None),
            latest_checkpoint=plan.latest_checkpoint,
            source_checkpoint=plan.source.copy_in(plan.dir.run) if plan.source else None,
            heartbeat_timeout=config.failure_policy.heartbeat_timeout,
            max_length=(plan.max_length if plan.max_length is not None
                        else config.searcher.max_length), seed=plan.seed,
            deterministic=config.reproducibility.deterministic,
            diagnostics_interval=(config.diagnostics.interval if config.diagnostics.record
                                  else None),
            gpus=visible_gpus(plan.gpus, rank, distributed),
            distributed_debug=config.debug.torch_distributed == "detail",
            flight_recorder=plan.dir.rank(rank).flight_recorder,
            virtual_env=plan.environment.layer if plan.environment is not None else None,
            standby_go=plan.dir.rank(rank).standby_go if plan.standby else None,
            integrations=config.integrations_active, compat=config.compat,
        )
        env = build_env({**config.environment.variables, **plan.secrets}, job)
        specs.append(ReplicaSpec(
            trial_uuid=plan.trial_uuid, attempt=plan.number, rank=rank,
            argv=list(config.entrypoint), env=env, cwd=plan.workdir,
            attempt_dir=plan.dir.path, stop_grace=config.failure_policy.stop_grace,
            memory_limit=config.resources.memory_limit, log_limit=plan.log_limit,
            path=plan.environment.path if plan.environment is not None else None,
            account=plan.account, distributed=distributed,
            gpus=tuple(plan.gpus.get(rank, ())) if plan.gpus is not None else None,
            system_metrics_interval=plan.system_metrics_interval,
        ))
    return specs


def visible_gpus(gpus: Mapping[int, tuple[int, ...]] | None, rank: int, distributed: bool
                 ) -> tuple[int, ...] | None:
    """The GPUs rank `rank`'s process sees (CUDA_VISIBLE_DEVICES); None: muster schedules no
    GPUs here and passes the server's setting on.

    A replica sees its own GPUs; the ranks of a distributed trial (torchrun's variables, one
    node) see every rank's, in rank order, as torchrun's workers do: so the idiom of
    torchrun scripts, `torch.cuda.set_device(LOCAL_RANK)` or `cuda:{LOCAL_RANK}` (nanoGPT,
    pytorch/examples, Lightning's and Accelerate's device choice, Determined's
    `torch.device(local_rank)`), is the rank's own GPU with one GPU per replica, where with
    only its own GPU visible every rank but 0 would ask for a device it cannot see."""
    if gpus is None:
        return None
    if not distributed:
        return tuple(gpus.get(rank, ()))
    return tuple(index for r in sorted(gpus) for index in gpus[r])


def latest_checkpoint(run_dir: RunDir, home: Home) -> Path | None:
    """The checkpoint a new attempt resumes from (`MUSTER_LATEST_CHECKPOINT`): the latest
    intact one in the run directory or fetched back from storage (`checkpoint_storage.resume`)."""
    return resume_point(run_dir.checkpoints, cache_dir(home, run_dir.path.name))


def resumed_from(latest: Path | None) -> str | None:
    """What `Attempt.resumed_from` records of the checkpoint an attempt resumes from: its
    name, which is its `checkpoints.name` whether it is in the run directory or was fetched
    back into the cache."""
    return latest.name if latest is not None else None


@dataclass
class Launching:
    """Records and launches attempts (and single replicas, for a restart in place)."""

    ctx: SupervisorContext
    ending: Ending
    scans: DataScans = field(default_factory=DataScans)

    def plan(self, s: Session, trial: Trial, number: int, port: int, *,
             incarnation: int = 0, standby: bool = False) -> AttemptPlan:
        """The facts of attempt `number` of `trial`, read in the caller's transaction."""
        config = experiment_config(trial.experiment)
        run_dir = self.ctx.home.run_dir(trial.uuid)
        gpus = self.ctx.placement.pool.of_trial(s, trial.id)
        # With GPUs to schedule, a replica sees exactly its own (none, without any).
        scheduled = bool(gpus) or bool(self.ctx.placement.inventory.gpus())
        account = job_account(self.ctx.run_as, trial.experiment)
        latest = latest_checkpoint(run_dir, self.ctx.home)
        return AttemptPlan(
            trial_id=trial.id, trial_uuid=trial.uuid, trial_number=trial.number,
            experiment_id=trial.experiment_id, number=number, dir=run_dir.attempt(number),
            config=config,
            workdir=run_dir.workdir, master_port=port,
            latest_checkpoint=latest,
            source=self.warm_start_of(s, trial) if latest is None else None,
            gpus=gpus if scheduled else None,
            seed=trial_seed(trial.experiment, config, trial.number),
            incarnation=incarnation, standby=standby,
            secrets=job_secrets.resolve(config, self.ctx.home, trial.experiment.uuid),
            environment=self.ctx.envs.for_trial(config, trial.experiment.environment_key,
                                                run_dir.env, account),
            account=account, log_limit=config.resources.log_limit_bytes(self.ctx.log_limit),
            system_metrics_interval=self.ctx.system_metrics_interval,
            max_length=config.searcher.length_of(generation_of(trial.search_state)))

    def specs(self, plan: AttemptPlan, ranks: Iterable[int] | None = None) -> list[ReplicaSpec]:
        return replica_specs(plan, ranks)

    @staticmethod
    def warm_start_of(s: Session, trial: Trial) -> Source | None:
        """The checkpoint the trial's next attempt starts from when it has none of its own
        (not even one only storage holds): its own source (a PBT parent's), else its
        experiment's warm start, if any."""
        if trial.source_checkpoint_id is None and trial.experiment.source_checkpoint_id is None:
            return None
        if s.scalar(select(Checkpoint.id).where(*resumable(trial.id)).limit(1)) is not None:
            return None
        return source_of_trial(s, trial)

    def prelaunch(self, trial_id: int) -> Prelaunch:
        with self.ctx.store.session_scope() as s:
            trial = s.get_one(Trial, trial_id)
            data = context_of(trial).data
            checkpoints = s.scalar(select(Checkpoint.id).where(*resumable(trial_id)).limit(1))
            return Prelaunch(
                scan=data is not None and trial.manifest is None and not trial.stop_requested,
                checkpoints=checkpoints is not None,
                standby=any(a.standby for a in trial.attempts))

    def scan_data(self, trial_id: int) -> Scan:
        """Scan the trial's data directory once, before its first launch, in a child
        process (`muster.supervise.scans`): WAITING while it runs (the trial says so in its
        queue reason), FAILED when it failed (the trial has then ended FAILED with why)."""
        with self.ctx.store.session_scope() as s:
            trial = s.get_one(Trial, trial_id)
            data, path = experiment_config(trial.experiment).data, context_of(trial).data
            if data is None or path is None or trial.manifest is not None or trial.stop_requested:
                return Scan.READY
        found = self.scans.poll(trial_id, path, data.manifest.extensions, data.manifest.labels)
        if isinstance(found, ScanFailed):
            self._fail_before_launch(trial_id, f"the data manifest scan failed: {found.why}")
            return Scan.FAILED
        with self.ctx.store.session_scope() as s:
            trial = s.get_one(Trial, trial_id)
            if found is None:
                if trial.state == TrialState.QUEUED:
                    trial.queue_reason = (f"scanning its data in {path} "
                                          f"({self.scans.seconds(trial_id):.0f} s so far)")
                return Scan.WAITING
            trial.manifest = found.to_json()
        if found.file_count == 0 and not data.allow_empty:  # emptied since the submission
            self._fail_before_launch(trial_id, empty_data_problem(
                repr(str(path)), data.manifest.extensions))
            return Scan.FAILED
        return Scan.READY

    def drop_stale_scans(self) -> None:
        """Stop the scans of trials that no longer wait in the queue (killed, paused)."""
        scanning = self.scans.running()
        if not scanning:
            return
        with self.ctx.store.session_scope() as s:
            waiting = set(s.scalars(select(Trial.id).where(
                Trial.id.in_(scanning), Trial.state == TrialState.QUEUED,
                Trial.stop_requested.is_(False))))
        self.scans.forget_all_but(waiting)

    def start(self, trial_id: int, gpus: GpuPlan = ()) -> None:
        """Record a new attempt of a QUEUED or RESTARTING trial (committed first, with the
        GPUs a queued trial is given), then prepare its directory and launch its replicas;
        if one cannot be launched, the ones already launched are stopped."""
        try:
            recorded = self._record_attempt(trial_id, gpus)
        except (ConfigError, LaunchError) as exc:  # a secret that cannot be read now, an
            # interpreter that is gone, a job account that is gone (rolled back)
            self._fail_before_launch(trial_id, f"cannot launch: {exc}")
            return
        if recorded is not None:
            self.launch(recorded)

    def launch(self, recorded: Recorded) -> None:
        """Launch the replicas of an attempt recorded and committed (`Recorded`): its
        working directory, environment layer and attempt directory first; if a replica
        cannot be launched, the ones already launched are stopped and the attempt ends."""
        attempt_id, trial_id = recorded.attempt_id, recorded.trial_id
        specs, environment = recorded.specs, recorded.environment
        account = specs[0].account
        try:
            if recorded.run_fs_bytes is not None:
                _mount_run_fs(AttemptDir(specs[0].attempt_dir).run.path, recorded.run_fs_bytes)
            prepare_workdir(recorded.context.snapshot, specs[0].cwd, recorded.context.data,
                            link_all=account is not None)
            if environment is not None:
                self.ctx.envs.prepare(environment)
            if recorded.source is not None:
                self._copy_source(recorded, recorded.source)
            if account is not None:
                grant_trial(AttemptDir(specs[0].attempt_dir).run, account)
            prepare_attempt_dir(AttemptDir(specs[0].attempt_dir), recorded.hparams, account)
            launched = self.ctx.launcher.submit_all(specs)
        except LaunchError as exc:
            rank = exc.rank if exc.rank is not None else specs[0].rank
            log.error("launch of trial %s attempt %s rank %s failed: %s", trial_id,
                      specs[0].attempt, rank, exc)
            # Every rank, the failed one too: a shim may have started without its launch
            # being recorded (a fork server that died before it answered); the stop marker
            # stops it as soon as it looks. (A rank never started just gets the marker.)
            for spec in specs:
                self.ctx.launcher.cancel(specs[0].attempt_dir, spec.rank)
            statuses = [ReplicaStatus(rank=spec.rank, phase=ReplicaPhase.LOST) for spec in specs]
            self.ending.finish(attempt_id, trial_id, statuses,
                               launch_error=(rank, str(exc)))
            return
        self.note_shims(attempt_id, launched)
        outside_snapshot.record_soon(specs[0], environment, recorded.context.snapshot)

    def _copy_source(self, recorded: Recorded, source: Source) -> None:
        """Copy the warm start's checkpoint in (`warm_start.copy_source`), and say so.

        Raises:
            LaunchError: it cannot be had.
        """
        run_dir = AttemptDir(recorded.specs[0].attempt_dir).run
        copy_source(source, source.copy_in(run_dir), self.ctx.home)
        with self.ctx.store.session_scope() as s:
            attempt = s.get_one(Attempt, recorded.attempt_id)
            record_event(s, entity="attempt", entity_id=attempt.id,
                         reason=EventReason.WARM_START, actor=ACTOR,
                         experiment_id=attempt.trial.experiment_id, trial_id=attempt.trial_id,
                         message=f"attempt {attempt.number} starts from the warm start, "
                                 f"{source.shown}: the trial has no checkpoint of its own yet")

    def note_shims(self, attempt_id: int, shims: Mapping[int, ProcessIdentity]) -> None:
        """Record the identities of the shims the launcher started, by rank."""
        with self.ctx.store.session_scope() as s:
            attempt = s.get_one(Attempt, attempt_id)
            for replica in attempt.replicas:
                shim = shims.get(replica.rank)
                if shim is not None and replica.shim_pid is None:
                    replica.shim_pid, replica.shim_start_ticks = shim.pid, shim.start_ticks
                    replica.node = self.ctx.placement.node_of(Path(attempt.run_dir),
                                                              replica.rank)

    def new_attempt(self, s: Session, trial: Trial, *, standby: bool = False,
                    port: int | None = None) -> Attempt:
        """Add the trial's next attempt and its replicas to the caller's transaction (its
        rendezvous on `port`, a free one by default)."""
        number = len(trial.attempts) + 1
        world_size = experiment_config(trial.experiment).resources.replicas
        attempt_dir = self.ctx.home.run_dir(trial.uuid).attempt(number)
        attempt = Attempt(trial=trial, number=number, state=AttemptState.STARTING,
                          run_dir=str(attempt_dir.path), standby=standby,
                          master_port=free_port() if port is None else port)
        s.add_all([attempt, *(Replica(attempt=attempt, rank=rank, host=self.ctx.host,
                                      log_path=str(attempt_dir.rank(rank).log))
                              for rank in range(world_size))])
        note_outputs_before(attempt)
        s.flush()
        return attempt

    def _record_attempt(self, trial_id: int, gpus: GpuPlan) -> Recorded | None:
        """Record the attempt and its replicas (and a queued trial's GPUs), committed; None
        when the trial no longer waits (or was killed, or its GPU plan is stale)."""
        with self.ctx.store.session_scope() as s:
            trial = s.get_one(Trial, trial_id)
            if not trial.state.is_waiting():
                return None
            if trial.stop_requested:
                transition(s, trial, TrialState.CANCELED, reason=EventReason.KILLED,
                           actor=ACTOR)
                return None
            if gpus and trial.state == TrialState.QUEUED:
                try:
                    self.ctx.placement.pool.allocate(s, trial.id, gpus)
                except GpuError as exc:  # a stale plan: it waits for the next pass
                    log.warning("%s", exc)
                    return None
            return self.record(s, trial)

    def record(self, s: Session, trial: Trial, why: str | None = None) -> Recorded:
        """Add the trial's next attempt and its replicas to the caller's transaction and move
        the trial to STARTING (`why`, if given, ends the event's message); returns what its
        launch needs once that is committed. A trial's first attempt records its
        environment's hash and freeze.

        Raises:
            ConfigError, LaunchError: a secret, an interpreter or a job account that cannot
                be had now; raised before anything is added to the transaction.
        """
        port = free_port()
        plan = self.plan(s, trial, len(trial.attempts) + 1, port)  # (raises before writing)
        trial.queue_reason = None  # it waits no more
        attempt = self.new_attempt(s, trial, port=port)
        attempt.resumed_from = resumed_from(plan.latest_checkpoint)
        world_size = len(attempt.replicas)
        transition(s, trial, TrialState.STARTING, reason=EventReason.LAUNCHING,
                   actor=ACTOR, message=f"starting attempt {attempt.number}"
                   + (f" ({world_size} replicas)" if world_size > 1 else "")
                   + (f"; {why}" if why else ""))
        if attempt.number == 1 and plan.environment is not None:
            trial.environment_key = plan.environment.key
            trial.environment_freeze = plan.environment.freeze()
        return Recorded(attempt.id, trial.id, self.specs(plan), dict(trial.hparams),
                        context_of(trial), plan.environment, plan.source,
                        trial.experiment.drill_fs_bytes)

    def _fail_before_launch(self, trial_id: int, message: str,
                            reason: Reason = Reason.PERMANENT_ERROR) -> None:
        with self.ctx.store.session_scope() as s:
            trial = s.get_one(Trial, trial_id)
            if trial.state == TrialState.QUEUED:
                transition(s, trial, TrialState.STARTING, reason=EventReason.LAUNCHING,
                           actor=ACTOR)
            transition(s, trial, TrialState.FAILED, reason=reason, actor=ACTOR,
                       message=message)


@dataclass(frozen=True)
class Context:
    """Where a trial's working directory is copied from."""

    snapshot: Path  # the experiment's context, as submitted
    data: Path | None  # the data path, when it is inside the context (linked, not copied)


@dataclass(frozen=True)
class Recorded:
    """An attempt recorded (committed) and not launched yet: what `Launching.launch` needs."""

    attempt_id: int
    trial_id: int
    specs: list[ReplicaSpec]  # by rank
    hparams: Hparams
    context: Context
    environment: TrialEnvironment | None
    source: Source | None = None  # the warm start to copy in first
    # A disk-full drill's run: its run directory is a file system of this size of its own,
    # mounted before the first launch (`muster.drill.inject.mount_small_fs`).
    run_fs_bytes: int | None = None


def _mount_run_fs(run_dir: Path, size: int) -> None:
    """A disk-full drill's small file system at the run directory, once.

    Raises:
        LaunchError: it cannot be mounted.
    """
    if os.path.ismount(run_dir):
        return  # an earlier attempt's
    try:
        mount_small_fs(run_dir, size)
    except InjectionError as exc:
        raise LaunchError(f"the drill's small file system: {exc}") from exc


def context_of(trial: Trial) -> Context:
    snapshot = Path(trial.experiment.context_dir)
    data = experiment_config(trial.experiment).data
    return Context(snapshot, snapshot / Path(data.path).expanduser() if data else None)


def prepare_attempt_dir(attempt_dir: AttemptDir, hparams: Hparams,
                        account: Account | None = None) -> None:
    """Create the attempt directory and its hparams file, after the attempt is recorded;
    under `run_as`, give the directory to the job's `account` (`supervise/ownership.py`).

    A failure here (a full disk, a home that is not writable) is a failure to launch: the
    attempt ends INTERNAL and the policy retries it, rather than every pass failing anew.
    """
    try:
        attempt_dir.path.mkdir(parents=True, exist_ok=True)
        atomic_write_json(attempt_dir.hparams, hparams)
    except OSError as exc:
        raise LaunchError(
            f"Could not prepare the attempt directory {attempt_dir.path}: {exc}"
        ) from exc
    if account is not None:
        grant_attempt(attempt_dir, account)


def job_account(run_as: RunAs | None, experiment: Experiment) -> Account | None:
    """The Unix account the experiment's jobs run as; None: the server's own user.

    Raises:
        AccountError: `run_as` names an account that is missing, or root.
    """
    if run_as is None:
        return None
    owner = experiment.owner
    return run_as.account_for(owner.name if owner else None,
                              owner.unix_user if owner else None)


def note_outputs_before(attempt: Attempt) -> None:
    """Record `verify.outputs` as the attempt finds them (`Attempt.outputs_before`), so
    that verification counts only the files this attempt creates or changes."""
    outputs = experiment_config(attempt.trial.experiment).verify.outputs
    if outputs:
        workdir = AttemptDir(Path(attempt.run_dir)).run.workdir
        attempt.outputs_before = verification.outputs_as_found(workdir, outputs)
