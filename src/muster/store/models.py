"""The store's tables. The schema is created and changed only by Alembic migrations
(`muster/store/alembic/versions/`); keep those in step with this module."""

from __future__ import annotations

import math
import time
import uuid
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Dialect,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    UniqueConstraint,
    false,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship
from sqlalchemy.types import TypeDecorator

from muster.downsample import SeriesJson
from muster.rundir import Hparams
from muster.states import (
    ArtifactState,
    AttemptState,
    CheckpointState,
    DrillRunState,
    DrillState,
    ExperimentState,
    GpuState,
    Integration,
    MetricKind,
    MetricSource,
    ModelStage,
    OomSource,
    QuotaLimit,
    QuotaSubject,
    Reason,
    Role,
    StopIntent,
    TokenKind,
    TrialState,
)
from muster.store.columns import EnumText, coerce_words_on_set

# The range of an INTEGER column in every supported database (32 bits in PostgreSQL): ids,
# attempt numbers and ranks. A number the API takes for one of them is bounded by it, so a
# value no row can hold is a 4xx at the door and never an overflow in the driver.
MAX_INTEGER = 2**31 - 1
# The range of a BIGINT column (metric steps): 64 bits, signed.
MIN_BIGINT, MAX_BIGINT = -(2**63), 2**63 - 1


def now() -> float:
    """Wall-clock time as stored: seconds since the epoch (float, UTC)."""
    return time.time()


def new_uuid() -> str:
    """A fresh random UUID as text: unique even for rows created in the same instant."""
    return str(uuid.uuid4())


# Named constraints, so migrations can later alter or drop them by name on every backend
# (SQLite's batch mode cannot drop an unnamed constraint).
NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

# Events name experiments, trials and attempts by id without a foreign key, so an id must
# never be handed out twice; plain SQLite reuses the highest id after a delete.
NO_ID_REUSE = {"sqlite_autoincrement": True}


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


# How JSON columns hold the floats JSON has no words for. PostgreSQL's json type refuses the
# bare tokens NaN and Infinity that Python's json module writes, and a NaN loss is exactly
# what verification must be able to see, so they are stored as these strings instead.
NON_FINITE_WORDS = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def encode_non_finite(value: Any) -> Any:
    """`value` with every NaN/±inf float, at any depth, replaced by "NaN"/"Infinity"/"-Infinity".

    Also what the API does before answering: strict JSON has no other way to say them.
    """
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, dict):
        if all(type(item) is int or (type(item) is float and math.isfinite(item))
               for item in value.values()):
            return value  # the usual metrics dict: nothing to encode, nothing to copy
        return {key: encode_non_finite(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [encode_non_finite(item) for item in value]
    return value


def decode_non_finite(value: Any) -> Any:
    """The inverse of `encode_non_finite`: the three words become floats again, at any depth."""
    if isinstance(value, str):
        return NON_FINITE_WORDS.get(value, value)
    if isinstance(value, dict):
        return {key: decode_non_finite(item) for key, item in value.items()}
    if isinstance(value, list):
        return [decode_non_finite(item) for item in value]
    return value


SERIES_NAME_LENGTH = 200  # a longer metric name has no `MetricSeries`


class NonFiniteJSON(TypeDecorator[Any]):
    """A JSON column that keeps NaN and ±Infinity on every backend (see `NON_FINITE_WORDS`).

    The one place where they are encoded for the database and decoded when read. A string
    that is exactly "NaN", "Infinity" or "-Infinity" reads back as the float, so columns of
    this type are for numbers-and-structure data (metrics, checkpoint metadata, verdicts).
    """

    impl = JSON(none_as_null=True)  # None is SQL NULL, so `IS NULL` finds it
    cache_ok = True

    def process_bind_param(self, value: Any, dialect: Dialect) -> Any:
        return None if value is None else encode_non_finite(value)

    def process_result_value(self, value: Any, dialect: Dialect) -> Any:
        return None if value is None else decode_non_finite(value)


class User(Base):
    """A person (or a service account) who uses muster, and what they may do (`role`, a
    `muster.states.Role`). Never deleted: events and experiments name them."""

    __tablename__ = "users"
    __table_args__ = NO_ID_REUSE

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(32), unique=True)
    display_name: Mapped[str] = mapped_column(String(200), default="")
    role: Mapped[Role] = mapped_column(EnumText(Role, 16))
    active: Mapped[bool] = mapped_column(default=True)
    # An argon2id hash (the web UI's login); None: this user signs in with tokens only.
    password_hash: Mapped[str | None] = mapped_column(Text, nullable=True)
    # The Unix account its jobs run as under the cluster config's `run_as: owner`; None:
    # the account named like the user.
    unix_user: Mapped[str | None] = mapped_column(String(32), nullable=True)
    created_at: Mapped[float] = mapped_column(Float, default=now)
    updated_at: Mapped[float] = mapped_column(Float, default=now)
    last_seen_at: Mapped[float | None] = mapped_column(Float, nullable=True)

    tokens: Mapped[list[ApiToken]] = relationship(back_populates="user",
                                                  order_by="ApiToken.created_at")


class ApiToken(Base):
    """A credential of a user: an API token (`kind` api) or a web session (`kind` session).
    Only the SHA-256 of the secret is kept: the database holds no usable token."""

    __tablename__ = "tokens"

    id: Mapped[str] = mapped_column(String(16), primary_key=True)  # public, random hex
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id"), index=True)
    kind: Mapped[TokenKind] = mapped_column(EnumText(TokenKind, 16))
    name: Mapped[str] = mapped_column(String(100), default="")
    secret_hash: Mapped[str] = mapped_column(String(64), unique=True)  # sha256, hex
    created_at: Mapped[float] = mapped_column(Float, default=now)
    expires_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    last_used_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    revoked_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    # A web session's: the API token it was opened with (it ends with that token), None for
    # a password login; and the client's address then (migration 0015).
    opened_with: Mapped[str | None] = mapped_column(String(16), nullable=True, index=True)
    address: Mapped[str | None] = mapped_column(String(64), nullable=True)

    user: Mapped[User] = relationship(back_populates="tokens")


class Experiment(Base):
    __tablename__ = "experiments"
    # The list's default filter (not archived, not being deleted) and order, from one index
    # (migration 0014): it counts and pages 10,000s of experiments without reading a row.
    # The searches still drawing trials are found among the active experiments by
    # `max_trials` (over 1, or 1 with no trial yet: an index lookup each) in one index, not
    # by reading every active experiment's row.
    __table_args__ = (Index("ix_experiments_listed", "archived", "delete_requested_at", "id"),
                      Index("ix_experiments_state_max_trials", "state", "max_trials"),
                      NO_ID_REUSE)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    uuid: Mapped[str] = mapped_column(String(36), unique=True, default=new_uuid)
    name: Mapped[str] = mapped_column(String(200))
    description: Mapped[str] = mapped_column(Text, default="")
    labels: Mapped[list[str]] = mapped_column(JSON, default=list)
    config: Mapped[dict[str, Any]] = mapped_column(JSON)  # normalized, validated config
    config_yaml: Mapped[str] = mapped_column(Text)  # what the user submitted, verbatim
    context_dir: Mapped[str] = mapped_column(Text)
    state: Mapped[ExperimentState] = mapped_column(EnumText(ExperimentState, 20))
    stop_requested: Mapped[bool] = mapped_column(default=False)
    created_at: Mapped[float] = mapped_column(Float, default=now)
    updated_at: Mapped[float] = mapped_column(Float, default=now)
    ended_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    message: Mapped[str | None] = mapped_column(Text, nullable=True)
    # The priority its new trials get (resources.priority, or `muster job set-priority`).
    priority: Mapped[int] = mapped_column(Integer, default=42, server_default="42")
    # How many trials it runs in all: 1, a grid's size, or the searcher's max_trials.
    max_trials: Mapped[int] = mapped_column(Integer, default=1, server_default="1")
    # The hash of the environment muster builds for its trials (`muster.environments`);
    # None: they run on the base interpreter, each under its own layer.
    environment_key: Mapped[str | None] = mapped_column(String(16), nullable=True)
    # Who submitted it: they (and admins) may act on it. None only for experiments made
    # before users existed and not yet given to the first admin.
    owner_id: Mapped[int | None] = mapped_column(ForeignKey("users.id"), nullable=True,
                                                 index=True)
    # Hidden from the default lists (`muster experiment archive`), kept whole.
    archived: Mapped[bool] = mapped_column(default=False, server_default=false())
    # The checkpoint GC counts set after submission (`muster checkpoint gc --save-...`);
    # None: the config's (`checkpoint_storage.save_*`), else the cluster's, else 1/1/0.
    gc_policy: Mapped[dict[str, int] | None] = mapped_column(JSON, nullable=True)
    # `muster experiment delete`: the storage worker removes its files, then its rows.
    delete_requested_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    # A warm start (`searcher.source_*`), resolved when it was submitted: the checkpoint its
    # trials start from, held against GC and deletes while it runs (no foreign key: that
    # checkpoint's experiment may be deleted once this one has ended), and what it was, as
    # `api.WarmStartView` shows it (`muster.services.warm_starts`).
    source_checkpoint_id: Mapped[int | None] = mapped_column(Integer, nullable=True,
                                                             index=True)
    source: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    # A run of a drill (`muster.drill`, migration 0028): the drill, which run ("clean" or a
    # `DrillFault`), and for disk-full the size of the file system its trials' run
    # directories get (mounted before their first launch). Set by the server, never by a
    # config.
    drill_id: Mapped[int | None] = mapped_column(Integer, nullable=True, index=True)
    drill_fault: Mapped[str | None] = mapped_column(String(32), nullable=True)
    drill_fs_bytes: Mapped[int | None] = mapped_column(BigInteger, nullable=True)

    trials: Mapped[list[Trial]] = relationship(
        back_populates="experiment", order_by="Trial.id", cascade="all, delete-orphan"
    )
    owner: Mapped[User | None] = relationship()

    @property
    def owner_name(self) -> str | None:
        return self.owner.name if self.owner is not None else None


class Trial(Base):
    __tablename__ = "trials"
    # A restarted searcher can never draw a trial number twice. The queue, in its order,
    # comes from one index alone (`ix_trials_queue`, migration 0014; it serves lookups by
    # state too), and whether an experiment has trials left to run from another.
    __table_args__ = (Index("ux_trials_experiment_number", "experiment_id", "number",
                            unique=True),
                      Index("ix_trials_queue", "state", "priority", "id", "stop_requested"),
                      Index("ix_trials_experiment_state", "experiment_id", "state"),
                      NO_ID_REUSE)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    uuid: Mapped[str] = mapped_column(String(36), unique=True, default=new_uuid)
    experiment_id: Mapped[int] = mapped_column(ForeignKey("experiments.id"))
    state: Mapped[TrialState] = mapped_column(EnumText(TrialState, 20))
    hparams: Mapped[Hparams] = mapped_column(JSON, default=dict)
    stop_requested: Mapped[bool] = mapped_column(default=False)
    # Budgets consumed so far (see muster.supervise.policy).
    replica_restarts: Mapped[int] = mapped_column(Integer, default=0)
    trial_retries: Mapped[int] = mapped_column(Integer, default=0)
    internal_retries: Mapped[int] = mapped_column(Integer, default=0)
    user_error_retries: Mapped[int] = mapped_column(Integer, default=0)
    # Waits for cluster room that ran past `capacity_timeout` (CAPACITY), Ray only.
    capacity_waits: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    reason: Mapped[str | None] = mapped_column(String(32), nullable=True)
    message: Mapped[str | None] = mapped_column(Text, nullable=True)
    created_at: Mapped[float] = mapped_column(Float, default=now)
    updated_at: Mapped[float] = mapped_column(Float, default=now)
    started_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    ended_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    # The data manifest the trial was checked against, and the verification verdict.
    manifest: Mapped[dict[str, Any] | None] = mapped_column(NonFiniteJSON, nullable=True)
    verification: Mapped[dict[str, Any] | None] = mapped_column(NonFiniteJSON, nullable=True)
    early_stopped: Mapped[bool] = mapped_column(default=False, server_default=false())
    # What connected its latest attempt's rank 0 to muster (`states.Integration`); None
    # while none checked in (a plain script never does).
    integration: Mapped[Integration | None] = mapped_column(EnumText(Integration, 16),
                                                            nullable=True)
    # Why the trial waits: for free slots while QUEUED, for check-ins while STARTING.
    queue_reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    # Its place in the queue: 1-99, lower first; FIFO (by id) within one priority.
    priority: Mapped[int] = mapped_column(Integer, default=42, server_default="42", index=True)
    # Set while muster stops the trial to pause it, to make room for a trial of better
    # priority, or because the searcher gave up on it (a `StopIntent` other than KILL, which
    # is `stop_requested`): its end is then not a failure and uses no budget.
    stop_intent: Mapped[StopIntent | None] = mapped_column(EnumText(StopIntent, 16),
                                                           nullable=True)
    # Its place in the experiment's search, from 0: what seeds its draw (`muster.search`).
    number: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # The searcher's notes on the trial (Optuna's system attributes: the rungs it reached,
    # its grid point; the last validation step judged; where it was stopped early).
    search_state: Mapped[dict[str, Any] | None] = mapped_column(NonFiniteJSON, nullable=True)
    # The environment it first launched in, and what that held (`pip freeze`): part of
    # its record, whatever becomes of the build.
    environment_key: Mapped[str | None] = mapped_column(String(16), nullable=True, index=True)
    environment_freeze: Mapped[str | None] = mapped_column(Text, nullable=True)
    # A metric of this trial has no `MetricSeries` (too many names, or one too long): what
    # is read from the series is read from its reports instead (`muster.store.series`).
    series_partial: Mapped[bool] = mapped_column(default=False, server_default=false())
    # When the cluster config's `retention` removed its logs, and its whole run (run
    # directory, checkpoints not registered, artifacts): set with the event that records
    # it, before a file goes (`muster.checkpoint_storage.retention`, migration 0027).
    logs_removed_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    files_removed_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    # The checkpoint it starts from while it has none of its own, when that is not its
    # experiment's warm start: a PBT member's parent's (`muster.search.pbt`, migration
    # 0029), held against GC until the trial is at rest (`checkpoint_storage.pins`).
    source_checkpoint_id: Mapped[int | None] = mapped_column(Integer, nullable=True,
                                                             index=True)

    experiment: Mapped[Experiment] = relationship(back_populates="trials")
    attempts: Mapped[list[Attempt]] = relationship(
        back_populates="trial", order_by="Attempt.number", cascade="all, delete-orphan"
    )

    @property
    def intent(self) -> StopIntent | None:
        """Why muster is stopping the trial's processes, if it is (a kill wins)."""
        return Trial.intent_of(self.stop_requested, self.stop_intent)

    @staticmethod
    def intent_of(stop_requested: bool, stop_intent: StopIntent | None) -> StopIntent | None:
        """`intent` from the two columns, for a reader that selected them alone."""
        return StopIntent.KILL if stop_requested else stop_intent


class Attempt(Base):
    __tablename__ = "attempts"
    __table_args__ = (UniqueConstraint("trial_id", "number"), NO_ID_REUSE)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    trial_id: Mapped[int] = mapped_column(ForeignKey("trials.id"), index=True)
    number: Mapped[int] = mapped_column(Integer)  # from 1
    state: Mapped[AttemptState] = mapped_column(EnumText(AttemptState, 20), index=True)
    run_dir: Mapped[str] = mapped_column(Text)
    master_port: Mapped[int | None] = mapped_column(Integer, nullable=True)  # MASTER_PORT
    # a warm standby: launched ahead, waiting in init(), not active until promoted
    standby: Mapped[bool] = mapped_column(default=False, server_default=false())
    reason: Mapped[str | None] = mapped_column(String(32), nullable=True)
    message: Mapped[str | None] = mapped_column(Text, nullable=True)
    created_at: Mapped[float] = mapped_column(Float, default=now)
    updated_at: Mapped[float] = mapped_column(Float, default=now)
    started_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    ended_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    # `verify.outputs` as the attempt launched: {path: [inode, size, mtime_ns, ctime_ns] |
    # None}; verification counts only files this attempt created or changed
    outputs_before: Mapped[dict[str, list[int] | None] | None] = mapped_column(JSON,
                                                                             nullable=True)
    # The checkpoint of its trial it was given to resume from (`MUSTER_LATEST_CHECKPOINT`,
    # its `checkpoints.name`); None: it started afresh, or from a warm start. Usage counts
    # the work an earlier attempt did up to that checkpoint as kept (migration 0026).
    resumed_from: Mapped[str | None] = mapped_column(String(255), nullable=True)

    trial: Mapped[Trial] = relationship(back_populates="attempts")
    replicas: Mapped[list[Replica]] = relationship(
        back_populates="attempt", order_by="Replica.rank", cascade="all, delete-orphan"
    )


class Replica(Base):
    """One process of an attempt (rank r), and how it ended (invariant 7)."""

    __tablename__ = "replicas"
    __table_args__ = (UniqueConstraint("attempt_id", "rank", "incarnation"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    attempt_id: Mapped[int] = mapped_column(ForeignKey("attempts.id"), index=True)
    rank: Mapped[int] = mapped_column(Integer)
    # 0 for the first launch of this rank in the attempt; +1 per restart in place
    incarnation: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    host: Mapped[str] = mapped_column(String(255))
    # Where it runs: the Ray node id, or locally the host name; None until launched.
    node: Mapped[str | None] = mapped_column(String(128), nullable=True)
    log_path: Mapped[str] = mapped_column(Text)
    shim_pid: Mapped[int | None] = mapped_column(Integer, nullable=True)
    shim_start_ticks: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    pid: Mapped[int | None] = mapped_column(Integer, nullable=True)
    start_ticks: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    exit_code: Mapped[int | None] = mapped_column(Integer, nullable=True)
    signal: Mapped[str | None] = mapped_column(String(16), nullable=True)
    reason: Mapped[Reason | None] = mapped_column(EnumText(Reason, 32), nullable=True)
    message: Mapped[str | None] = mapped_column(Text, nullable=True)
    log_tail: Mapped[str | None] = mapped_column(Text, nullable=True)
    max_rss_bytes: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    # The peak resident memory of the whole process group (cgroup peak, or sampled).
    peak_rss_bytes: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    # Who named the end an OOM kill; None: not an OOM kill.
    oom_source: Mapped[OomSource | None] = mapped_column(EnumText(OomSource, 16), nullable=True)
    oom_limit_bytes: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    # Output the shim could not write to the log (disk full, EIO); None: not known.
    log_lost_bytes: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    # A stalled replica's evidence bundle (relative to the attempt's directory) and the
    # one line its main thread's stack gives ("waits in all_reduce at train.py:88").
    evidence: Mapped[str | None] = mapped_column(Text, nullable=True)
    stack_summary: Mapped[str | None] = mapped_column(Text, nullable=True)
    # A STALLED replica's: when its stall began (its last progress or sign of life), from
    # its stall marker; usage counts from there to its end as stalled (migration 0026).
    stalled_since: Mapped[float | None] = mapped_column(Float, nullable=True)
    started_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    ended_at: Mapped[float | None] = mapped_column(Float, nullable=True)

    attempt: Mapped[Attempt] = relationship(back_populates="replicas")


class GpuDevice(Base):
    """One GPU of the inventory and who holds it. A row holds at most one trial's replica at
    a time, so a GPU cannot be booked twice; a released GPU is `releasing` until its used
    memory falls below `gpu_release.max_used_fraction` (or the timeout passes)."""

    __tablename__ = "gpus"

    index: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    name: Mapped[str] = mapped_column(String(200))
    type: Mapped[str] = mapped_column(String(64))
    memory_total: Mapped[int] = mapped_column(BigInteger)
    state: Mapped[GpuState] = mapped_column(EnumText(GpuState, 16), default=GpuState.FREE)
    trial_id: Mapped[int | None] = mapped_column(ForeignKey("trials.id"), nullable=True,
                                                 index=True)
    rank: Mapped[int | None] = mapped_column(Integer, nullable=True)
    since: Mapped[float] = mapped_column(Float, default=now)  # the last change of state
    present: Mapped[bool] = mapped_column(default=True)  # in the inventory the server opened


class ClusterNode(Base):
    """A node of the cluster as the bad-node circuit breaker sees it: the infra failures
    (INFRA, LOST, STALLED) of replicas there since the last clean end, and whether it is
    quarantined (no new replica is placed on it until an admin releases it)."""

    __tablename__ = "cluster_nodes"

    id: Mapped[str] = mapped_column(String(128), primary_key=True)  # Ray's node id
    # The trials whose replicas failed there in a row, oldest first (distinct ids).
    failed_trials: Mapped[list[int]] = mapped_column(JSON, default=list)
    quarantined_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    quarantine_reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    updated_at: Mapped[float] = mapped_column(Float, default=now)


class Event(Base):
    """Append-only log of every state transition and every supervisor decision."""

    __tablename__ = "events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    at: Mapped[float] = mapped_column(Float, default=now, index=True)
    entity: Mapped[str] = mapped_column(String(16))  # experiment | trial | attempt
    entity_id: Mapped[int] = mapped_column(Integer)
    experiment_id: Mapped[int | None] = mapped_column(Integer, nullable=True, index=True)
    trial_id: Mapped[int | None] = mapped_column(Integer, nullable=True, index=True)
    from_state: Mapped[str | None] = mapped_column(String(20), nullable=True)
    to_state: Mapped[str | None] = mapped_column(String(20), nullable=True)
    reason: Mapped[str] = mapped_column(String(64))
    # A user's name, or `system:...` (`muster.store.actors`); before users existed: "user",
    # "supervisor", "review:<name>".
    actor: Mapped[str] = mapped_column(String(64), index=True)
    message: Mapped[str | None] = mapped_column(Text, nullable=True)


class Metric(Base):
    """One line of a replica's metrics file (`muster.metrics_lines`): one report."""

    __tablename__ = "metrics"
    # The index's leading column also serves the foreign key's lookups.
    __table_args__ = (Index("ix_metrics_trial_id_kind_step", "trial_id", "kind", "step"),)

    id: Mapped[int] = mapped_column(
        BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True
    )
    trial_id: Mapped[int] = mapped_column(ForeignKey("trials.id", ondelete="CASCADE"))
    attempt: Mapped[int] = mapped_column(Integer)
    rank: Mapped[int] = mapped_column(Integer)
    kind: Mapped[MetricKind] = mapped_column(EnumText(MetricKind, 16))
    step: Mapped[int] = mapped_column(BigInteger)
    time: Mapped[float] = mapped_column(Float)
    values: Mapped[dict[str, int | float]] = mapped_column(NonFiniteJSON)  # name → value
    # "harness" (a metrics file) or "log" (read from the rank's log).
    source: Mapped[MetricSource] = mapped_column(EnumText(MetricSource, 8),
                                                 default=MetricSource.HARNESS,
                                                 server_default=MetricSource.HARNESS.value)


class MetricSeries(Base):
    """One metric of one kind of a trial's rank-0 reports, kept small as it grows: how many
    reports name it, its lowest and highest finite value, and its curve as min/max buckets
    (`muster.downsample.Series`). Written with the reports (`muster.store.series`), so a
    trial's best value and its curve cost one row, however many reports it made."""

    __tablename__ = "metric_series"
    __table_args__ = (UniqueConstraint("trial_id", "kind", "name"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    trial_id: Mapped[int] = mapped_column(ForeignKey("trials.id", ondelete="CASCADE"))
    kind: Mapped[MetricKind] = mapped_column(EnumText(MetricKind, 16))
    name: Mapped[str] = mapped_column(String(SERIES_NAME_LENGTH))
    reports: Mapped[int] = mapped_column(BigInteger, default=0)  # NaN and ±inf included
    lowest: Mapped[float | None] = mapped_column(Float, nullable=True)  # finite values only
    highest: Mapped[float | None] = mapped_column(Float, nullable=True)
    last_step: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    curve: Mapped[SeriesJson] = mapped_column(JSON, default=dict)
    # The curve in at most `downsample.COARSE_BUCKETS` buckets (`Series.coarse`), written
    # with it: an experiment's learning curves of many trials read these (migration 0030;
    # null in rows from before it and for resource series, whose `curve` is read instead).
    coarse: Mapped[SeriesJson | None] = mapped_column(JSON, nullable=True)


class IngestCursor(Base):
    """How far one file of a trial's run directory has been read into the store.

    Advanced in the same transaction as the rows read, so every line is stored exactly once
    however often the server stops and starts (see `muster.supervise.ingest`).
    """

    __tablename__ = "ingest_cursors"
    __table_args__ = (UniqueConstraint("trial_id", "attempt", "rank", "file_kind"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    trial_id: Mapped[int] = mapped_column(ForeignKey("trials.id", ondelete="CASCADE"))
    attempt: Mapped[int] = mapped_column(Integer)
    rank: Mapped[int] = mapped_column(Integer)
    file_kind: Mapped[str] = mapped_column(String(16))  # "metrics", "system" or "log"
    byte_offset: Mapped[int] = mapped_column(BigInteger, default=0)
    # A rank log's only (`muster.supervise.log_metrics`): the newlines before `byte_offset`
    # and the metric lines recognised there, so line numbers and running steps go on.
    lines: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    reports: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    updated_at: Mapped[float] = mapped_column(Float, default=now)


class Checkpoint(Base):
    """A checkpoint directory of a trial, as found and verified when it was registered, and
    where it is in storage (`muster.checkpoint_storage`, its `state`)."""

    __tablename__ = "checkpoints"
    __table_args__ = (UniqueConstraint("trial_id", "name"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    trial_id: Mapped[int] = mapped_column(
        ForeignKey("trials.id", ondelete="CASCADE"), index=True
    )
    # Its name in storage: `<uuid>/` holds its files and, written last, its metadata.json.
    uuid: Mapped[str] = mapped_column(String(36), unique=True, default=new_uuid)
    name: Mapped[str] = mapped_column(String(255))  # the directory's name
    path: Mapped[str] = mapped_column(Text)
    step: Mapped[int] = mapped_column(BigInteger)
    # From metadata.json; unknown (null) when that file is missing or unreadable.
    attempt: Mapped[int | None] = mapped_column(Integer, nullable=True)
    rank: Mapped[int | None] = mapped_column(Integer, nullable=True)
    created_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    file_count: Mapped[int] = mapped_column(Integer)
    # `metadata` is taken by SQLAlchemy's declarative base; the column keeps the plain name.
    user_metadata: Mapped[Any] = mapped_column(
        "metadata", NonFiniteJSON, default=dict
    )
    intact: Mapped[bool] = mapped_column()
    problem: Mapped[str | None] = mapped_column(Text, nullable=True)
    registered_at: Mapped[float] = mapped_column(Float, default=now)
    state: Mapped[CheckpointState] = mapped_column(
        EnumText(CheckpointState, 16), default=CheckpointState.LOCAL,
        server_default=CheckpointState.LOCAL.value, index=True)
    # The storage it goes to (`checkpoint_storage.location.Location.to_json`, no secrets): fixed
    # when its upload begins, so a changed default never sends a deletion elsewhere.
    storage: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    stored_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    upload_tries: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    next_try_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)  # the last upload's
    # Why the last GC kept it, or why it is being deleted (the planner's reasons).
    gc_reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    deleted_at: Mapped[float | None] = mapped_column(Float, nullable=True)



class ArtifactSet(Base):
    """The files a trial's final attempt left that its config names (`artifacts`,
    `verify.outputs`): made `pending` in the transaction that ends the trial, copied by the
    storage worker (`muster.artifacts.collect`) into `path` with their sha256."""

    __tablename__ = "artifact_sets"
    __table_args__ = (UniqueConstraint("trial_id", "attempt"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    trial_id: Mapped[int] = mapped_column(ForeignKey("trials.id", ondelete="CASCADE"),
                                          index=True)
    attempt: Mapped[int] = mapped_column(Integer)  # the final attempt's number
    since: Mapped[float] = mapped_column(Float)  # its start: older files are stale
    state: Mapped[ArtifactState] = mapped_column(
        EnumText(ArtifactState, 16), default=ArtifactState.PENDING, index=True)
    path: Mapped[str | None] = mapped_column(Text, nullable=True)  # the set's directory
    # relative POSIX path -> {"sha256": hex, "size": bytes}
    files: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    size_bytes: Mapped[int] = mapped_column(BigInteger, default=0)
    file_count: Mapped[int] = mapped_column(Integer, default=0)
    skipped: Mapped[list[str]] = mapped_column(JSON, default=list)  # "<path>: <why>", first 20
    skipped_count: Mapped[int] = mapped_column(Integer, default=0)
    message: Mapped[str | None] = mapped_column(Text, nullable=True)  # why REFUSED
    created_at: Mapped[float] = mapped_column(Float, default=now)
    collected_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    # A collected set in checkpoint storage, as a checkpoint is: `<uuid>/` with its files and,
    # written last, its metadata.json; where it goes is fixed when its upload begins.
    uuid: Mapped[str] = mapped_column(String(36), unique=True, default=new_uuid)
    storage_state: Mapped[CheckpointState] = mapped_column(
        EnumText(CheckpointState, 16), default=CheckpointState.LOCAL, index=True)
    storage: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    stored_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    upload_tries: Mapped[int] = mapped_column(Integer, default=0)
    next_try_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)  # the last upload's


class RegisteredModel(Base):
    """A named model of the registry (`muster.services.registry`): its versions are trials'
    checkpoints, each with its lineage."""

    __tablename__ = "models"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(128), unique=True)
    description: Mapped[str] = mapped_column(Text, default="")
    labels: Mapped[list[str]] = mapped_column(JSON, default=list)
    owner_id: Mapped[int | None] = mapped_column(ForeignKey("users.id"), nullable=True)
    created_at: Mapped[float] = mapped_column(Float, default=now)
    versions: Mapped[list[ModelVersion]] = relationship(
        back_populates="model", order_by="ModelVersion.version", cascade="all, delete-orphan")


class ModelVersion(Base):
    """One registered checkpoint of a trial: v1, v2... of its model, with what it came
    from (`lineage`: trial, experiment, owner, the checkpoint's files and sha256s, the
    trial's verification, its snapshot's key, its metrics there) and, for a trial that was
    not verified, who accepted that and why (`accepted_unverified`)."""

    __tablename__ = "model_versions"
    __table_args__ = (UniqueConstraint("model_id", "version"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    model_id: Mapped[int] = mapped_column(ForeignKey("models.id", ondelete="CASCADE"),
                                          index=True)
    version: Mapped[int] = mapped_column(Integer)
    stage: Mapped[ModelStage] = mapped_column(EnumText(ModelStage, 16), default=ModelStage.NONE)
    # The registry holds what it names: an experiment with a registered checkpoint is not
    # deleted (its trial and checkpoint rows stay), and GC keeps the checkpoint.
    trial_id: Mapped[int] = mapped_column(ForeignKey("trials.id"), index=True)
    experiment_id: Mapped[int] = mapped_column(Integer)
    checkpoint_id: Mapped[int] = mapped_column(ForeignKey("checkpoints.id"), index=True)
    checkpoint_uuid: Mapped[str] = mapped_column(String(36))
    verified: Mapped[bool] = mapped_column()
    accepted_unverified: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    lineage: Mapped[dict[str, Any]] = mapped_column(NonFiniteJSON, default=dict)
    registered_by: Mapped[str] = mapped_column(String(64))
    registered_at: Mapped[float] = mapped_column(Float, default=now)
    model: Mapped[RegisteredModel] = relationship(back_populates="versions")


class IdempotencyKey(Base):
    """A create's `Idempotency-Key` (`muster.services.idempotency`): recorded in the
    transaction that records the experiments it created, so a second POST with the same key
    is answered with them instead of creating more. Pruned after `KEEP_S` (24 h)."""

    __tablename__ = "idempotency_keys"
    __table_args__ = (UniqueConstraint("user_id", "key"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id"))
    key: Mapped[str] = mapped_column(String(128))
    # The sha256 of what was asked (configs, context, git state, secrets' names), hex.
    request_sha256: Mapped[str] = mapped_column(String(64))
    experiment_ids: Mapped[list[int]] = mapped_column(JSON, default=list)
    created_at: Mapped[float] = mapped_column(Float, default=now, index=True)



class NotificationSubscription(Base):
    """A user's own notification target (`muster notify add`): where to send which events
    of their experiments (`muster.notifications`). The cluster config's `notifications` are
    not stored: they are read from the config at each event."""

    __tablename__ = "notification_subscriptions"
    __table_args__ = NO_ID_REUSE

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id"), index=True)
    # The URL as given (a secret of its owner's: shown redacted, `muster.notifications`).
    url: Mapped[str] = mapped_column(Text)
    events: Mapped[list[str]] = mapped_column(JSON, default=list)
    # The signing key of muster's own webhook (`muster.webhooks`), made by the server and
    # shown once; None for an Apprise URL.
    secret: Mapped[str | None] = mapped_column(String(64), nullable=True)
    created_at: Mapped[float] = mapped_column(Float, default=now)


class NotificationOutbox(Base):
    """One notification to deliver: an event for one target, written in the transaction
    that appends the event (so it is never lost nor sent for an event rolled back), and
    delivered at least once by the notifier (`muster.notifications`), with `key` as the
    receiver's idempotency key."""

    __tablename__ = "notification_outbox"
    __table_args__ = (UniqueConstraint("event_id", "target"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    event_id: Mapped[int] = mapped_column(Integer, index=True)
    # "config:<sha256 of the entry, 12 hex>" or "user:<subscription id>".
    target: Mapped[str] = mapped_column(String(64))
    kind: Mapped[str] = mapped_column(String(32))  # a `NotificationKind`
    payload: Mapped[dict[str, Any]] = mapped_column(NonFiniteJSON, default=dict)
    state: Mapped[str] = mapped_column(String(16), default="pending", index=True)
    tries: Mapped[int] = mapped_column(Integer, default=0)
    next_at: Mapped[float] = mapped_column(Float, default=now, index=True)
    last_error: Mapped[str | None] = mapped_column(Text, nullable=True)
    created_at: Mapped[float] = mapped_column(Float, default=now)
    delivered_at: Mapped[float | None] = mapped_column(Float, nullable=True)


class NotificationDelivery(Base):
    """The delivery log: one row per try of an outbox row, what the receiver said."""

    __tablename__ = "notification_deliveries"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    outbox_id: Mapped[int] = mapped_column(
        ForeignKey("notification_outbox.id", ondelete="CASCADE"), index=True)
    at: Mapped[float] = mapped_column(Float, default=now)
    ok: Mapped[bool] = mapped_column()
    status: Mapped[int | None] = mapped_column(Integer, nullable=True)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    elapsed_s: Mapped[float] = mapped_column(Float, default=0.0)



class Group(Base):
    """A named set of users that admins manage (`muster group`): a quota of a group holds
    its members together (`muster.schedule.quotas`)."""

    __tablename__ = "groups"
    __table_args__ = NO_ID_REUSE

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(32), unique=True)
    description: Mapped[str] = mapped_column(String(200), default="")
    created_at: Mapped[float] = mapped_column(Float, default=now)


class GroupMember(Base):
    """A user's membership of a group."""

    __tablename__ = "group_members"

    group_id: Mapped[int] = mapped_column(ForeignKey("groups.id", ondelete="CASCADE"),
                                          primary_key=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id"), primary_key=True, index=True)
    added_at: Mapped[float] = mapped_column(Float, default=now)


class Quota(Base):
    """One limit an admin set at runtime (`muster quota set`) for a user, a group or every
    user without one (`subject_id` 0): it wins over the cluster config's `quotas` for that
    subject and limit (`muster.schedule.quotas`). `value` None: no limit."""

    __tablename__ = "quotas"
    __table_args__ = (UniqueConstraint("subject", "subject_id", "kind"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    subject: Mapped[QuotaSubject] = mapped_column(EnumText(QuotaSubject, 8))
    subject_id: Mapped[int] = mapped_column(Integer)  # a user's or a group's id; 0: default
    kind: Mapped[QuotaLimit] = mapped_column(EnumText(QuotaLimit, 32))
    value: Mapped[int | None] = mapped_column(Integer, nullable=True)
    set_by: Mapped[str] = mapped_column(String(32))
    set_at: Mapped[float] = mapped_column(Float, default=now)


coerce_words_on_set(Base)  # a state set as a word reads back as its member at once


class Drill(Base):
    """A drill (`muster drill`): the user's experiment run once clean and once per fault,
    each run an experiment of its own (`DrillRun`), with the report of what muster said."""

    __tablename__ = "drills"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(200))  # the drilled experiment's name
    owner_id: Mapped[int | None] = mapped_column(ForeignKey("users.id"), nullable=True,
                                                 index=True)
    state: Mapped[DrillState] = mapped_column(EnumText(DrillState, 16), index=True)
    # How the drill was asked for: faults, scale, data path, when to inject, the experiment
    # it was made from (`muster.drill.plan.DrillOptions`, as JSON).
    options: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    config_yaml: Mapped[str] = mapped_column(Text)  # the drilled config, as submitted
    # The experiment it was asked for on ("Run a drill"; `--experiment`), none for an upload.
    source_experiment_id: Mapped[int | None] = mapped_column(Integer, nullable=True,
                                                             index=True)
    created_at: Mapped[float] = mapped_column(Float, default=now)
    ended_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    message: Mapped[str | None] = mapped_column(Text, nullable=True)

    runs: Mapped[list[DrillRun]] = relationship(
        back_populates="drill", order_by="DrillRun.position", cascade="all, delete-orphan")
    owner: Mapped[User | None] = relationship()


class DrillRun(Base):
    """One run of a drill: the clean run (`fault` None) or one fault's, in order."""

    __tablename__ = "drill_runs"
    __table_args__ = (UniqueConstraint("drill_id", "position"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    drill_id: Mapped[int] = mapped_column(ForeignKey("drills.id", ondelete="CASCADE"),
                                          index=True)
    position: Mapped[int] = mapped_column(Integer)
    fault: Mapped[str | None] = mapped_column(String(32), nullable=True)  # a `DrillFault`
    state: Mapped[DrillRunState] = mapped_column(EnumText(DrillRunState, 16))
    # Its experiment (no foreign key: the experiment may be deleted, the report stays).
    experiment_id: Mapped[int | None] = mapped_column(Integer, nullable=True, index=True)
    started_at: Mapped[float | None] = mapped_column(Float, nullable=True)  # trial RUNNING
    injected_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    injection: Mapped[str | None] = mapped_column(Text, nullable=True)  # what was done
    # The judged outcome (`muster.drill.judge.Outcome`, as JSON); None until ENDED.
    outcome: Mapped[dict[str, Any] | None] = mapped_column(NonFiniteJSON, nullable=True)
    skip_reason: Mapped[str | None] = mapped_column(Text, nullable=True)

    drill: Mapped[Drill] = relationship(back_populates="runs")
