"""The words muster stores, serves and compares: the states of experiments, trials,
attempts, checkpoints and the rest, the reasons of moves, and the legal moves.

Values are plain strings so the same words appear in the database, the API, the CLI and
the UI; each word has one spelling, here. The transition tables are the whole state
machine; `muster.store.transitions` is the one function that applies them. Every value
muster compares is a member of one of these enums, never a free string; the sets of
states are the enums' methods (`TrialState.active()`), never spelled elsewhere.

Each enum is a `StrEnum`: a member is the `str` it stands for, and `str()`, f-strings and
templates give its value ("RUNNING", not "TrialState.RUNNING"), so a member read from a
column (`muster.store.columns.EnumText`) prints as the word the database holds.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import Enum, StrEnum


class ExperimentState(StrEnum):
    """Where an experiment is (`experiments.state`); EXPERIMENT_MOVES has its moves."""

    ACTIVE = "ACTIVE"
    PAUSED = "PAUSED"
    COMPLETED = "COMPLETED"
    CANCELED = "CANCELED"
    ERROR = "ERROR"

    def is_terminal(self) -> bool:
        return self in _EXPERIMENT_TERMINAL


class TrialState(StrEnum):
    """Where a trial is (`trials.state`); TRIAL_MOVES has its moves."""

    QUEUED = "QUEUED"
    STARTING = "STARTING"
    RUNNING = "RUNNING"
    RESTARTING = "RESTARTING"
    PAUSED = "PAUSED"
    SUCCEEDED = "SUCCEEDED"
    SUSPECT = "SUSPECT"
    FAILED = "FAILED"
    CANCELED = "CANCELED"

    def is_terminal(self) -> bool:
        return self in _TRIAL_TERMINAL

    def is_at_rest(self) -> bool:
        """True once no process will run for the trial again unless a person acts: the
        terminal states and SUSPECT (which waits for a review)."""
        return self in _TRIAL_TERMINAL or self is TrialState.SUSPECT

    def is_active(self) -> bool:
        """True while the trial holds (or is about to hold) running processes, and with them
        its slots and GPUs: STARTING, RUNNING, RESTARTING."""
        return self in _TRIAL_ACTIVE

    def is_waiting(self) -> bool:
        """True while the trial waits for a launch: QUEUED, or RESTARTING between attempts
        (the scheduler's queue holds both)."""
        return self in _TRIAL_WAITING

    def is_unfinished(self) -> bool:
        """True while the trial may still run: active, QUEUED or PAUSED (a search counts
        these against `max_concurrent_trials`)."""
        return self in _TRIAL_UNFINISHED

    @classmethod
    def active(cls) -> frozenset[TrialState]:
        return _TRIAL_ACTIVE

    @classmethod
    def waiting(cls) -> frozenset[TrialState]:
        return _TRIAL_WAITING

    @classmethod
    def unfinished(cls) -> frozenset[TrialState]:
        return _TRIAL_UNFINISHED

    @classmethod
    def terminal(cls) -> frozenset[TrialState]:
        return _TRIAL_TERMINAL


class AttemptState(StrEnum):
    """Where an attempt is (`attempts.state`); ATTEMPT_MOVES has its moves."""

    STARTING = "STARTING"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELED = "CANCELED"

    def is_terminal(self) -> bool:
        return self in _ATTEMPT_TERMINAL

    @classmethod
    def live(cls) -> frozenset[AttemptState]:
        """STARTING and RUNNING: the attempts the supervisor follows."""
        return _ATTEMPT_LIVE


class Reason(StrEnum):
    """Why a replica ended: the classification of `muster.launch.exits.classify_exit`."""

    OK = "OK"
    PERMANENT_ERROR = "PERMANENT_ERROR"
    USER_ERROR = "USER_ERROR"
    TRANSIENT = "TRANSIENT"
    OOM = "OOM"
    STOPPED = "STOPPED"
    INFRA = "INFRA"
    LOST = "LOST"
    STALLED = "STALLED"
    INTERNAL = "INTERNAL"
    # The cluster had no room for the attempt's replica set (a Ray placement group still
    # pending after `failure_policy.capacity_timeout`); nothing was launched.
    CAPACITY = "CAPACITY"

    def is_infra(self) -> bool:
        """The machine, not the code, failed: INFRA, LOST (vanished without an exit record)
        or STALLED (stopped for making no progress); the policy treats all three alike."""
        return self in (Reason.INFRA, Reason.LOST, Reason.STALLED)


class EventReason(StrEnum):
    """Why a move or a decision happened, when it is not how a replica ended (`Reason`):
    the `reason` of events, trials and attempts holds a member of one of the two."""

    CREATED = "created"
    LAUNCHING = "launching"
    STARTED = "started"
    KILL_REQUESTED = "kill requested"
    KILLED = "killed"
    PAUSED = "paused"
    PREEMPTED = "preempted"
    REQUEUED = "requeued"
    ACTIVATED = "activated"
    # A person's controls of one trial (`muster.services.trial_control`), with their actor.
    PAUSE_REQUESTED = "pause requested"
    RESTART_REQUESTED = "restart requested"
    RESTARTED = "restarted"  # stopped as asked, and back to the queue
    EARLY_STOP = "early stop"  # the searcher's decision, and the move it ends in
    VERIFICATION_FAILED = "verification failed"
    STANDBY = "standby"
    RECONCILE = "reconcile"
    PRIORITY_CHANGED = "priority changed"
    GPU_RELEASE_TIMEOUT = "gpu release timeout"
    DISK_LOW = "disk low"
    REVIEW_APPROVED = "review approved"
    NODE_QUARANTINED = "node quarantined"  # the bad-node circuit breaker tripped
    REVIEW_REJECTED = "review rejected"
    TRIALS_FINISHED = "trials finished"
    NO_TRIAL_SUCCEEDED = "no trial succeeded"
    INTERNAL_ERROR = "internal error"  # muster failed on this experiment; the others go on
    SEARCH_STOPPED = "search stopped"  # its first trials all failed alike: no more draws
    METRIC_MISSING = "metric missing"  # no ended trial reported the searcher's metric
    ENVIRONMENT = "environment"  # its environment's build failed, and is tried again
    USER_CREATED = "user created"
    USER_CHANGED = "user changed"  # role, display name, password or Unix account
    USER_DEACTIVATED = "user deactivated"  # its tokens and sessions stop working at once
    USER_ACTIVATED = "user activated"
    TOKEN_CREATED = "token created"
    TOKEN_REVOKED = "token revoked"
    # An admin's quota limits and groups (`muster quota`, `muster group`), with their actor.
    QUOTA_CHANGED = "quota changed"
    GROUP_CHANGED = "group changed"  # created, deleted, or a member added or removed
    NOTIFICATION_ADDED = "notification added"  # a user's subscription (`muster notify add`)
    NOTIFICATION_REMOVED = "notification removed"
    LOGGED_IN = "logged in"  # a password login that opened a web session
    SESSION_ENDED = "session ended"  # by its user or an admin, from the list of sessions
    CHECKPOINT_DELETED = "checkpoint deleted"  # by GC (its reason says why) or with its experiment
    RESTORE_SKIPPED = "restore skipped"  # a checkpoint corrupt in storage, passed over
    WARM_START = "warm start"  # an attempt starts from its experiment's source checkpoint
    CHECKPOINT_UPLOAD_FAILED = "upload failed"  # retried with backoff, unless it cannot help
    # The final attempt's files the config names, copied (or why none were: `muster.artifacts`).
    ARTIFACTS_COLLECTED = "artifacts collected"
    ARTIFACTS_REFUSED = "artifacts refused"
    # The model registry (`muster.services.registry`): each action, with its actor.
    MODEL_CREATED = "model created"
    MODEL_REGISTERED = "model registered"  # a new version, with its lineage
    MODEL_STAGED = "model staged"  # a version's stage changed (and any it displaced)
    MODEL_VERSION_DELETED = "model version deleted"  # its checkpoint is no longer pinned
    MODEL_DELETED = "model deleted"  # a model without versions
    # The server's export of a version to the cluster config's MLflow (`muster.services.
    # mlflow_exports`): the MLflow run and version it made, or why it failed.
    MODEL_EXPORTED = "model exported"
    MODEL_EXPORT_FAILED = "model export failed"
    GC_POLICY_CHANGED = "gc policy changed"  # `muster checkpoint gc --save-...`
    ARCHIVED = "archived"
    UNARCHIVED = "unarchived"
    DELETE_REQUESTED = "delete requested"  # `muster experiment delete`; its files go first
    EXPERIMENT_DELETED = "experiment deleted"  # its files and records are gone
    # The cluster config's `retention:` (`muster.checkpoint_storage.retention`), recorded
    # before the files go: a trial's logs, or its whole run (logs, run directory,
    # unregistered checkpoints, artifacts).
    LOGS_REMOVED = "logs removed"
    RUN_REMOVED = "run files removed"
    RANKS_DIFFER = "ranks differ"  # an attempt's ranks started on different libraries
    # Its validation and checkpoint steps count in different units (warned once per trial).
    STEP_SCALES_DIFFER = "step scales differ"
    # A rank's GPU stayed idle while its CPU was busy (`muster.supervise.gpu_idle`; warned
    # once per trial).
    GPU_IDLE = "gpu idle"
    # A key of the Determined config it was submitted as, and what muster made of it, or
    # why muster does without it (`muster.config.determined`); the latter show as warnings.
    DETERMINED_KEY_MAPPED = "determined key mapped"
    DETERMINED_KEY_IGNORED = "determined key ignored"


class Role(StrEnum):
    """What a muster user may do (`muster.services.access` has the whole table): a viewer
    reads everything; a user also submits experiments and acts on its own; an admin acts on
    everything and manages users."""

    ADMIN = "admin"
    USER = "user"
    VIEWER = "viewer"


class StopIntent(StrEnum):
    """Why muster is stopping a trial's processes: a stop it asked for is not a failure.

    KILL is `Trial.stop_requested` (it wins over the others and ends the trial); the others
    are `Trial.stop_intent`.
    """

    KILL = "kill"
    PAUSE = "pause"  # its experiment is paused: PAUSED, resumed on activate
    PREEMPT = "preempt"  # it makes room for a trial of better priority: back to the queue
    EARLY_STOP = "early_stop"  # the searcher's pruner gave up on it: SUCCEEDED, early_stopped
    # A person's controls of one trial (`muster trial pause | restart`):
    PAUSE_TRIAL = "pause_trial"  # PAUSED until `trial activate`, whatever its experiment does
    RESTART = "restart"  # back to the queue at once, from its latest checkpoint

    @classmethod
    def pausing(cls) -> frozenset[StopIntent]:
        """The stops that end PAUSED (an ordered stop is no failure and uses no budget): a
        paused experiment's, a preemption's, and a person's pause or restart of one trial."""
        return _PAUSING

    @property
    def event_reason(self) -> EventReason:
        """The reason of the move a stop of this kind ends in."""
        return _INTENT_REASONS[self]


class CheckStatus(StrEnum):
    """How one verification check of an exit 0 came out (`verification.checks[].status`).

    Only PASSED checks that inspect results count toward `verified`; NOT_RUN says why in the
    check's detail (e.g. "not run: no planned length") and never counts.
    """

    PASSED = "passed"
    FAILED = "failed"
    WARNING = "warning"  # it passed, and its detail starts with "warning:"
    NOT_RUN = "not_run"


class MetricKind(StrEnum):
    """What a metric report is (`metrics.kind`, a metrics file's `"kind"`): a training step's
    or a validation's, which the run reports; or a sample of its replica's resources (CPU,
    memory, GPU: the `system/` series, `muster.system_metrics`), which the shim takes and
    which is never evidence of training."""

    TRAINING = "training"
    VALIDATION = "validation"
    SYSTEM = "system"


class Integration(StrEnum):
    """What connected a trial's ranks to muster (a trial's `integration`): the harness
    called by the script itself, or one of `muster.integrations` / `muster.compat` on the
    script's behalf."""

    HARNESS = "harness"
    LIGHTNING = "lightning"
    TRANSFORMERS = "transformers"
    ACCELERATE = "accelerate"
    DETERMINED = "determined"


class MetricSource(StrEnum):
    """Where a stored metric report was read: a metrics file (the harness or an integration
    wrote it), a rank's log (`verify.metrics_from_log` and the built-in recognisers), or
    the shim's resource samples."""

    HARNESS = "harness"
    LOG = "log"
    SHIM = "shim"  # a replica's resource samples (`RankFile.SYSTEM`)


class OomSource(StrEnum):
    """Who named a replica's end an out-of-memory kill: its memory cgroup's OOM-kill
    counter, the kernel log's "Killed process" line for one of its processes (no cgroup),
    or muster's RSS watchdog at its `memory_limit`."""

    CGROUP = "cgroup"
    KMSG = "kmsg"
    WATCHDOG = "watchdog"


class DistributedEnv(StrEnum):
    """When a replica gets torchrun's variables (`resources.distributed_env`): `auto` when
    the trial is distributed (several replicas, or a torchrun entrypoint), `always`, `never`.
    One replica without them runs single-process code such as nanoGPT's as written."""

    AUTO = "auto"
    ALWAYS = "always"
    NEVER = "never"


class GpuState(StrEnum):
    """Who may take a GPU: `free`; `allocated` to a trial (across its attempts);
    `releasing` its memory after the trial let it go."""

    FREE = "free"
    ALLOCATED = "allocated"
    RELEASING = "releasing"


class ModelStage(StrEnum):
    """Where a model version stands (`model_versions.stage`, MLflow's and Determined's)."""

    NONE = "none"
    STAGING = "staging"
    PRODUCTION = "production"
    ARCHIVED = "archived"


class ArtifactState(StrEnum):
    """Where a trial's artifact set is (`artifact_sets.state`, `muster.artifacts`)."""

    PENDING = "pending"  # the trial ended; its final attempt's files are yet to be copied
    COLLECTED = "collected"  # copied into the run directory, each file hashed
    EMPTY = "empty"  # no file matched the patterns (or each was left, with why)
    REFUSED = "refused"  # nothing was kept: over artifacts_limit, or unreadable (message)

    def is_settled(self) -> bool:
        return self is not ArtifactState.PENDING


class CheckpointState(StrEnum):
    """Where a checkpoint's files are (`checkpoints.state`, `muster.checkpoint_storage`)."""

    LOCAL = "local"  # in the run directory only
    UPLOADING = "uploading"
    STORED = "stored"  # in checkpoint storage
    UPLOAD_FAILED = "upload_failed"  # still local; the upload gave up
    DELETING = "deleting"  # deletion begun, not yet finished
    DELETED = "deleted"

    def is_terminal(self) -> bool:
        return self is CheckpointState.DELETED

    def is_stored(self) -> bool:
        """True while its files are in checkpoint storage: STORED, or DELETING until the
        deletion ends."""
        return self in _CHECKPOINT_STORED

    def is_gone(self) -> bool:
        """True once its deletion has begun (DELETING) or ended (DELETED): it is never
        resumed from or downloaded again."""
        return self in _CHECKPOINT_GONE

    def keeps_storage(self) -> bool:
        """True while the store wants its objects in storage: UPLOADING (being written) or
        STORED; a sweep leaves them alone, however old."""
        return self in _CHECKPOINT_KEPT

    @classmethod
    def gone(cls) -> frozenset[CheckpointState]:
        return _CHECKPOINT_GONE


class EnvironmentState(StrEnum):
    """Where an experiment's environment build is (`muster.environments.registry`)."""

    READY = "READY"
    BUILDING = "BUILDING"
    FAILED = "FAILED"
    MISSING = "MISSING"  # requested, not built yet


class TokenKind(StrEnum):
    """What a credential is (`tokens.kind`, `muster.services.tokens`)."""

    API = "api"  # `Authorization: Bearer mst_...`
    SESSION = "session"  # the web UI's cookie, `mss_...`

    @property
    def prefix(self) -> str:
        return "mst_" if self is TokenKind.API else "mss_"


class ReplicaPhase(StrEnum):
    """Where a replica's processes are, as its launcher sees them (`ReplicaStatus.phase`)."""

    STARTING = "STARTING"  # shim launched, training process not started yet
    RUNNING = "RUNNING"  # training process alive
    EXITED = "EXITED"  # exit record written
    LOST = "LOST"  # no exit record and no live shim/process with the recorded identity


class EvidenceReason(StrEnum):
    """Why an evidence bundle was asked for (`muster.launch.dumps.request_dump`); the end of
    its id, so the API's bundle ids say it."""

    STALLED = "stalled"  # before muster kills a replica that made no progress
    REQUESTED = "requested"  # `muster trial dump`, the trial page's "Dump stacks"


class SearchOutcome(StrEnum):
    """A stored trial as the searcher sees it (`muster.search.history.PastTrial`)."""

    RUNNING = "running"  # not ended (queued, running, restarting, paused)
    COMPLETE = "complete"  # ended with a value of the metric
    PRUNED = "pruned"  # stopped early by the searcher
    FAILED = "failed"  # failed, suspect, or ended without the metric
    CANCELED = "canceled"  # killed by a person: no result, no failure


class LogSearchDirection(StrEnum):
    """Which way a log search scans from its `from` offset (`muster.services.log_search`)."""

    FORWARD = "forward"  # matches at or after it, first one first
    BACKWARD = "backward"  # matches before it, nearest one first


class LogSearchStop(StrEnum):
    """Why a log search stopped; only END means it is complete."""

    END = "end"  # it reached the end (forward) or the start (backward) of the log
    LIMIT = "limit"  # it found as many matches as were asked for
    TIME = "time"  # it ran out of its time (`SEARCH_SECONDS`)
    BYTES = "bytes"  # it scanned as many bytes as were allowed (`max_bytes`)


class Basis(StrEnum):
    """Why a trial stands for its experiment in an experiment diff (`a_basis`, `b_basis`)."""

    BEST = "best"  # the best SUCCEEDED trial by the searcher's metric
    LATEST = "latest"  # the highest number: no trial has a value of the metric, or no metric


class DiffGroup(StrEnum):
    """What kind of thing a field of a diff says (`muster.diagnostics.diff`), in the order a
    reader should look at them."""

    CODE = "code"
    CONFIG = "config"
    PACKAGES = "packages"
    FRAMEWORKS = "frameworks"
    NUMERICS = "numerics"
    HARDWARE = "hardware"
    PLATFORM = "platform"


def values(members: Iterable[Enum]) -> list[str]:
    """The stored words of `members`, for SQL (`column.in_(values(TrialState.active()))`)."""
    return sorted(str(member.value) for member in members)


_INTENT_REASONS = {
    StopIntent.KILL: EventReason.KILLED,
    StopIntent.PAUSE: EventReason.PAUSED,
    StopIntent.PREEMPT: EventReason.PREEMPTED,
    StopIntent.EARLY_STOP: EventReason.EARLY_STOP,
    StopIntent.PAUSE_TRIAL: EventReason.PAUSED,
    StopIntent.RESTART: EventReason.RESTARTED,
}
_PAUSING = frozenset({StopIntent.PAUSE, StopIntent.PREEMPT, StopIntent.PAUSE_TRIAL,
                      StopIntent.RESTART})
_EXPERIMENT_TERMINAL = frozenset(
    {ExperimentState.COMPLETED, ExperimentState.CANCELED, ExperimentState.ERROR}
)
_TRIAL_TERMINAL = frozenset({TrialState.SUCCEEDED, TrialState.FAILED, TrialState.CANCELED})
_TRIAL_ACTIVE = frozenset({TrialState.STARTING, TrialState.RUNNING, TrialState.RESTARTING})
_TRIAL_WAITING = frozenset({TrialState.QUEUED, TrialState.RESTARTING})
_TRIAL_UNFINISHED = _TRIAL_ACTIVE | {TrialState.QUEUED, TrialState.PAUSED}
_ATTEMPT_TERMINAL = frozenset(
    {AttemptState.SUCCEEDED, AttemptState.FAILED, AttemptState.CANCELED}
)
_ATTEMPT_LIVE = frozenset({AttemptState.STARTING, AttemptState.RUNNING})
_CHECKPOINT_STORED = frozenset({CheckpointState.STORED, CheckpointState.DELETING})
_CHECKPOINT_GONE = frozenset({CheckpointState.DELETING, CheckpointState.DELETED})
_CHECKPOINT_KEPT = frozenset({CheckpointState.UPLOADING, CheckpointState.STORED})

E, T, A = ExperimentState, TrialState, AttemptState

EXPERIMENT_MOVES: dict[ExperimentState, frozenset[ExperimentState]] = {
    E.ACTIVE: frozenset({E.PAUSED, E.COMPLETED, E.CANCELED, E.ERROR}),
    # ERROR: muster failed on it; COMPLETED, CANCELED: every trial of it has ended (killed
    # one by one, or one finished before the pause reached it), as an ACTIVE one ends.
    E.PAUSED: frozenset({E.ACTIVE, E.COMPLETED, E.CANCELED, E.ERROR}),
    E.COMPLETED: frozenset(),
    E.CANCELED: frozenset(),
    E.ERROR: frozenset(),
}

TRIAL_MOVES: dict[TrialState, frozenset[TrialState]] = {
    T.QUEUED: frozenset({T.STARTING, T.PAUSED, T.CANCELED}),
    T.STARTING: frozenset({T.RUNNING, T.RESTARTING, T.PAUSED, T.FAILED, T.CANCELED}),
    T.RUNNING: frozenset(
        {T.RESTARTING, T.PAUSED, T.SUCCEEDED, T.SUSPECT, T.FAILED, T.CANCELED}
    ),
    T.RESTARTING: frozenset({T.STARTING, T.PAUSED, T.FAILED, T.CANCELED}),
    T.PAUSED: frozenset({T.QUEUED, T.CANCELED}),
    # The only way out of SUSPECT is a recorded review (see REVIEW_ONLY_MOVES).
    T.SUSPECT: frozenset({T.SUCCEEDED, T.FAILED}),
    T.SUCCEEDED: frozenset(),
    T.FAILED: frozenset(),
    T.CANCELED: frozenset(),
}

ATTEMPT_MOVES: dict[AttemptState, frozenset[AttemptState]] = {
    A.STARTING: frozenset({A.RUNNING, A.FAILED, A.CANCELED}),
    A.RUNNING: frozenset({A.SUCCEEDED, A.FAILED, A.CANCELED}),
    A.SUCCEEDED: frozenset(),
    A.FAILED: frozenset(),
    A.CANCELED: frozenset(),
}

# Moves that only a person's review may make; the transition function demands a review's
# reason (REVIEW_REASONS) and an actor that is a person, not `system:...`.
REVIEW_ONLY_MOVES: frozenset[tuple[TrialState, TrialState]] = frozenset(
    {(T.SUSPECT, T.SUCCEEDED), (T.SUSPECT, T.FAILED)}
)

REVIEW_REASONS = frozenset({EventReason.REVIEW_APPROVED, EventReason.REVIEW_REJECTED})

del E, T, A


class NotificationKind(StrEnum):
    """What a notification is about (`muster.notifications`): the words of the cluster
    config's and `muster notify add`'s `events`."""

    EXPERIMENT_ENDED = "experiment-ended"  # COMPLETED, ERROR or CANCELED
    TRIAL_SUSPECT = "trial-suspect"  # awaiting review
    TRIAL_FAILED = "trial-failed"
    TRIAL_STALLED = "trial-stalled"  # an attempt ended STALLED
    DISK_GUARD = "disk-guard"  # the disk guard engaged
    NODE_QUARANTINED = "node-quarantined"
    MODEL_REGISTERED = "model-registered"
    MODEL_STAGED = "model-staged"

    @property
    def cluster_wide(self) -> bool:
        """About the server, not about one owner's work: sent to admins' own subscriptions
        (and the cluster config's), never to another user's."""
        return self in (NotificationKind.DISK_GUARD, NotificationKind.NODE_QUARANTINED)


class OutboxState(StrEnum):
    """Where a notification is (`notification_outbox.state`)."""

    PENDING = "pending"  # to be delivered (now, or after its backoff)
    SENDING = "sending"  # claimed by the notifier; a server killed meanwhile sends it again
    DELIVERED = "delivered"  # a receiver took it (a 2xx; Apprise said sent)
    FAILED = "failed"  # every try failed, or it cannot be sent (its target is gone)


class QuotaLimit(StrEnum):
    """What a quota limits (`muster.schedule.quotas`): the cluster config's `quotas` keys,
    `muster quota set`'s options and the `quotas.kind` column."""

    MAX_SLOTS = "max_slots"  # replicas without GPUs running at once
    MAX_GPUS = "max_gpus"  # GPUs held at once
    MAX_RUNNING_TRIALS = "max_running_trials"  # trials holding resources at once
    MAX_QUEUED_TRIALS = "max_queued_trials"  # trials QUEUED at once (a create past it: 429)


class QuotaSubject(StrEnum):
    """Whom a quota holds to it: one user, the members of a group together, or every user
    without a limit of their own (`default`)."""

    USER = "user"
    GROUP = "group"
    DEFAULT = "default"


class UsageBy(StrEnum):
    """What a usage report groups by (`muster usage --by`, `muster.services.usage`)."""

    USER = "user"  # the experiment's owner
    EXPERIMENT = "experiment"
    LABEL = "label"  # an experiment with several labels counts under each


class RetentionItem(StrEnum):
    """What one line of a retention plan removes (`muster gc runs`,
    `muster.checkpoint_storage.retention`)."""

    LOGS = "logs"  # a trial's replica logs (and their indexes), past retention.logs_after
    RUN = "run"  # its run directory (logs included), less the lines below, past runs_after
    CHECKPOINT = "checkpoint"  # one checkpoint not registered: storage, run directory, cache
    ARTIFACTS = "artifacts"  # its artifact set: the run directory's copy and storage's


class DrillFault(StrEnum):
    """A fault a drill injects into a run of the user's own script, from outside it
    (`muster drill --faults`, `muster.drill.faults`); the order is a drill's order."""

    CORRUPT_DATA = "corrupt-data"  # 10% of the data copy's files truncated or garbled
    DROP_DATA = "drop-data"  # 10% of the files hidden mid-run
    KILL_RANK = "kill-rank"  # SIGKILL to one rank's training process
    HANG = "hang"  # SIGSTOP to one rank's process group
    STRAGGLER = "straggler"  # one rank SIGSTOPped and continued at a 50% duty cycle
    DISK_FULL = "disk-full"  # the run on a small file system of its own, filled mid-run
    OOM = "oom"  # the rank's memory cgroup squeezed below its use
    NAN = "nan"  # the next loss the harness reports made NaN
    SERVER_RESTART = "server-restart"  # muster's server SIGKILLed and started again
    NETWORK = "network"  # one Ray node's link cut for 60 s

    @property
    def must_survive(self) -> bool:
        """The run should end as the clean run did (a slow rank, a server restart): muster
        is right when its verdict is the clean run's; every other fault must be named
        (the run not verified, or an attempt's end blamed on it)."""
        return self in (DrillFault.STRAGGLER, DrillFault.SERVER_RESTART)


class DrillState(StrEnum):
    """Where a drill is (`drills.state`)."""

    RUNNING = "RUNNING"  # its runs go one after another
    DONE = "DONE"  # every run ended or was skipped: the report is whole
    CANCELED = "CANCELED"  # stopped by a person; the runs that ended are reported

    def is_terminal(self) -> bool:
        return self is not DrillState.RUNNING


class DrillRunState(StrEnum):
    """Where one run of a drill is (`drill_runs.state`): the clean run, or one fault's."""

    PENDING = "PENDING"  # its experiment not created yet
    RUNNING = "RUNNING"  # its experiment created; the fault not injected yet
    INJECTED = "INJECTED"  # the fault injected (recorded before it was): waiting for the end
    ENDED = "ENDED"  # its experiment ended and was judged
    SKIPPED = "SKIPPED"  # not run here: the reason says why (not root, no Ray, no harness…)

    def is_terminal(self) -> bool:
        return self in (DrillRunState.ENDED, DrillRunState.SKIPPED)
