"""The HTTP API's shapes: one pydantic model per response (and request) body.

The routes declare these as their response models, so `/openapi.json` documents every
response, and a view that drifts from its model is a 500 in the tests rather than a silent
change. Field names are a fixed contract (README "JSON contract"): extend, never rename.
Every model forbids keys it does not name, so a field added to a view and forgotten here
fails loudly instead of vanishing from the response.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from muster.priority import MAX_PRIORITY, MIN_PRIORITY
from muster.services.snapshots import Basis

# Metric values: numbers, or "NaN", "Infinity", "-Infinity" (strict JSON has no other way).
Number = float | int | str


class _Shape(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Error(_Shape):
    """Every error: its kind (the `MusterError` class, or the HTTP phrase) and a sentence
    that says what happened and what to do."""

    error: str
    message: str


class SupervisorHealth(_Shape):
    """How the supervisor's passes are going (the orchestrator's `PassHealth`)."""

    failures_in_a_row: int
    last_error: str | None
    last_error_at: float | None
    last_pass_at: float | None
    passes: int  # passes that succeeded since the server started
    interval: float  # seconds between passes that nothing woke
    wakeups: bool  # whether files and processes wake passes (inotify, pidfds)


class Health(_Shape):
    status: Literal["ok"]
    version: str
    pid: int  # `muster up` checks that the server answering is the one it started
    degraded: bool  # the last supervisor pass failed: the server serves, the queue waits
    last_supervisor_error: str | None
    last_supervisor_error_at: float | None
    supervisor: SupervisorHealth


class Event(_Shape):
    at: float
    entity: str
    entity_id: int
    from_state: str | None
    to_state: str | None
    reason: str
    actor: str
    message: str | None
    attempt: int | None  # an attempt's number in its trial, for an attempt's event


class OomView(_Shape):
    """Who named a replica's end an OOM kill, and the memory_limit it had (None: none)."""

    source: str  # "cgroup", "kmsg" or "watchdog"
    limit_bytes: int | None


class ReplicaView(_Shape):
    rank: int
    incarnation: int  # 0, or n after n restarts in place
    host: str  # the server's host name, where it was decided
    node: str  # where it runs: the Ray node id, or locally the host name
    pid: int | None
    exit_code: int | None
    signal: str | None  # a name such as "SIGKILL"
    reason: str | None
    message: str | None
    log_path: str
    log_tail: str | None
    max_rss_bytes: int | None
    peak_rss_bytes: int | None  # the whole process group's peak memory (cgroup or sampled)
    oom: OomView | None  # set when it ran out of memory
    # Output its log could not take (a full disk, an I/O error): a marker line in the log
    # says where, and the trial is not verified (check log_complete). Null until it ended.
    log_lost_bytes: int | None = None
    # Its latest evidence bundle (`evidence/<id>`, in its attempt's directory: a stall's, or
    # `muster trial dump`'s) and where its main thread was then, one line per rank.
    evidence: str | None = None
    stack_summary: str | None = None
    started_at: float | None
    ended_at: float | None


class DumpRankView(_Shape):
    """One rank's part of an evidence bundle a dump asked for."""

    rank: int
    complete: bool  # its summary.json was written in time
    line: str  # "rank 1 waits in all_reduce at train.py:88", or why there is none
    tool: str | None  # "py-spy" | "faulthandler" | None (no stack could be read)
    errors: list[str]


class DumpResult(_Shape):
    """`POST /trials/{id}/dump`: the bundle, and what each running rank's part says."""

    bundle: str  # its id, `<UTC yyyymmddThhmmssZ>-requested`
    attempt: int
    path: str  # its directory on the server: `<attempt dir>/evidence/<bundle>`
    ranks: list[DumpRankView]


class AttemptView(_Shape):
    number: int
    state: str
    standby: bool  # a warm standby not (yet) promoted
    reason: str | None
    message: str | None
    run_dir: str
    started_at: float | None
    ended_at: float | None
    replicas: list[ReplicaView]


class EarlyStop(_Shape):
    """Where the searcher stopped a trial early."""

    rung: int
    step: int
    value: Number


class TrialEnvironmentView(_Shape):
    """What a trial runs in: the hash of its built environment (None: the base interpreter
    under the trial's own layer) and what that held when the trial first launched."""

    hash: str | None
    python: str | None  # environment.python, None: the interpreter muster runs on
    freeze: list[str] | None


class TrialProgress(_Shape):
    """How far a RUNNING trial has come, in its planned length's unit, and when it will end
    at its recent rate (`muster.services.progress`). `planned`, `fraction` and
    `eta_seconds` are null without a planned length; `rate_per_s` and `eta_seconds` with
    fewer than two progress points: the ETA is unknown, never guessed."""

    done: int | float  # steps or records done; epochs to two places
    planned: int | None
    unit: str  # steps | batches | epochs | records
    fraction: float | None  # done / planned, at most 1
    rate_per_s: float | None
    eta_seconds: float | None  # after `as_of`, at `rate_per_s`
    planned_by: str | None  # verify.expected_length | ctx.plan() | searcher.max_length
    measured_by: str  # harness | log (metrics), heartbeat, samples
    as_of: float | None  # the time of the latest progress point


class RunningTrialProgress(_Shape):
    trial_id: int
    number: int
    progress: TrialProgress


class TrialDetail(_Shape):
    id: int
    uuid: str
    experiment_id: int
    state: str
    reason: str | None
    message: str | None
    restarts: int
    hparams: dict[str, Any]
    created_at: float
    started_at: float | None
    ended_at: float | None
    attempts: list[AttemptView]
    manifest: dict[str, Any] | None
    verification: dict[str, Any] | None
    # True only when its exit 0 was verified; null while it has not ended.
    verified: bool | None
    verdict: str  # one line, as the CLI and the UI print it (`muster.verdicts`)
    early_stopped: bool
    queue_reason: str | None
    priority: int
    number: int  # its place in the search, from 0
    early_stop: EarlyStop | None
    # The best finite value of the searcher's metric over rank 0's validation reports.
    best_validation: dict[str, float]
    environment: TrialEnvironmentView
    # The trial part of its reproducibility snapshot (`muster.diagnostics`: code, config,
    # hparams, seed, environment, data) in the reads (`GET /trials/{id}`,
    # `/experiments/{id}`, `/experiments/{id}/best`); null in the answers to actions.
    snapshot: dict[str, Any] | None
    progress: TrialProgress | None = None  # while RUNNING, once it reported progress


class TrialDescription(TrialDetail):
    """A trial with its events: `GET /trials/{id}`."""

    events: list[Event]


class TrialSummary(_Shape):
    """One row of an experiment's trial list."""

    id: int
    number: int
    state: str
    hparams: dict[str, Any]
    early_stopped: bool
    best_validation: dict[str, float]
    restarts: int
    started_at: float | None
    ended_at: float | None
    verified: bool | None  # its exit 0 was verified; null while it has not ended
    verdict: str  # one line, as the CLI and the UI print it (`muster.verdicts`)
    early_stop: EarlyStop | None = None  # where the searcher stopped it
    progress: TrialProgress | None = None  # while RUNNING, once it reported progress


class CurveView(_Shape):
    """One trial's learning curve: steps and values, downsampled (min/max buckets)."""

    trial_id: int
    number: int
    state: str
    hparams: dict[str, Any]
    early_stop: EarlyStop | None  # where the searcher stopped it
    reports: int  # finite values the curve stands for
    steps: list[int]
    values: list[float]


class ExperimentCurves(_Shape):
    experiment_id: int
    metric: str
    kind: str
    smaller_is_better: bool | None  # None for a metric other than the searcher's
    points_per_trial: int
    trials: list[CurveView]


class SeriesView(_Shape):
    """One metric of a trial as a curve (rank 0), downsampled (min/max buckets)."""

    kind: str
    name: str
    reports: int  # reports that named it, NaN and ±inf included
    lowest: float | None  # finite values only
    highest: float | None
    last_step: int | None
    steps: list[int]
    values: list[float]


class TrialSeries(_Shape):
    trial_id: int
    series: list[SeriesView]


class ParamImportance(_Shape):
    name: str  # the key path, e.g. "optimizer.lr"
    importance: float  # its share; the shares of an answer sum to 1


class Importance(_Shape):
    """How much each hyperparameter the search varied mattered for the searcher's metric:
    `GET /experiments/{id}/importance`."""

    experiment_id: int
    evaluator: str  # Optuna's evaluator, by class name: PedAnovaImportanceEvaluator
    metric: str
    smaller_is_better: bool
    ended_trials: int  # SUCCEEDED, FAILED, CANCELED and SUSPECT, when this was computed
    trials_used: int  # the SUCCEEDED ones with a finite value of the metric
    importances: list[ParamImportance]  # the largest share first
    message: str | None  # what to keep in mind when reading it (few trials, ties)


class BestSoFar(_Shape):
    trial_id: int
    number: int
    hparams: dict[str, Any]
    metric: str
    value: float
    early_stopped: bool


class SearchProgress(_Shape):
    searcher: str
    metric: str | None
    smaller_is_better: bool
    max_trials: int
    max_concurrent_trials: int
    max_length: int | None  # the training each trial gets, in max_length_unit
    max_length_unit: str  # steps (report_validation's), batches, epochs or records
    ended: int  # SUCCEEDED, FAILED, CANCELED and SUSPECT
    running: int  # STARTING, RUNNING and RESTARTING
    queued: int  # QUEUED and PAUSED
    remaining: int  # still to be made
    best: BestSoFar | None


class Progress(_Shape):
    ended: int  # SUCCEEDED, FAILED, CANCELED, SUSPECT
    running: int  # STARTING, RUNNING, RESTARTING
    queued: int  # QUEUED, PAUSED
    total: int  # every trial it will make (1, a grid's size, max_trials)


class VerdictCounts(_Shape):
    """An experiment's trials by verdict."""

    verified: int  # SUCCEEDED, and their exit 0 verified
    not_verified: int  # SUCCEEDED without that (nothing inspected; approved on review)
    suspect: int  # SUSPECT: exit 0, a check failed, a person must decide


class ExperimentSummary(_Shape):
    id: int
    uuid: str
    name: str
    description: str
    labels: list[str]
    state: str
    message: str | None
    created_at: float
    ended_at: float | None
    trial_states: list[str]
    priority: int  # what its new trials get
    archived: bool  # hidden from the default lists (`muster experiment archive`)
    owner: str | None  # the user who submitted it (None only for older experiments)
    progress: Progress  # its trials by stage, of all it will make
    awaiting_review: int  # SUSPECT trials: exit 0, a check failed, a person must decide
    unverified: int  # SUCCEEDED trials whose exit 0 was not verified (verdicts.not_verified)
    verdicts: VerdictCounts
    best: BestSoFar | None  # the search's best trial so far (its searcher's metric)
    # Its RUNNING trials that reported progress, by number.
    trial_progress: list[RunningTrialProgress] = []


class ExperimentDetail(ExperimentSummary):
    config: dict[str, Any]
    config_yaml: str  # the config as it was submitted (secrets are never in it)
    trials: list[TrialDetail]
    search: SearchProgress
    warnings: list[str]  # e.g. no ended trial reported the searcher's metric


class MetricReport(_Shape):
    kind: Literal["training", "validation"]
    step: int
    time: float
    attempt: int
    rank: int
    metrics: dict[str, Number]
    # Where muster read it: "harness" (a metrics file) or "log" (recognised in the rank's
    # log: `verify.metrics_from_log` or a built-in recogniser).
    source: Literal["harness", "log"] = "harness"


class CheckpointView(_Shape):
    id: int
    uuid: str  # its name in storage: `<storage>/<uuid>/`
    trial_id: int
    name: str
    path: str  # in the trial's run directory (gone once `deleted`)
    step: int
    state: Literal["local", "uploading", "stored", "upload_failed", "deleting", "deleted"]
    size: int  # bytes, every file
    storage_url: str | None  # where it is stored (`stored` and `deleting` only)
    # The searcher's metric of the last validation rank 0 reported in its attempt before it
    # was saved (None: none before it), and that validation's own step, whatever its unit.
    metric: Number | None
    metric_step: int | None
    kept_because: str | None  # why the last garbage collection kept it
    deleted_because: str | None
    error: str | None  # why its last upload failed
    stored_at: float | None
    attempt: int | None
    rank: int | None
    created_at: float | None
    size_bytes: int
    file_count: int
    metadata: Any  # what the training code passed as save(metadata=...)
    intact: bool
    problem: str | None


class TrialSnapshot(_Shape):
    """`muster.diagnostics`: the trial part, each rank's part (by rank, as text), and the
    outside part of its latest attempt that has one (what the server saw from outside the
    process at its launch: the interpreter, the layer's packages, the code's tree hash)."""

    trial: dict[str, Any]
    ranks: dict[str, dict[str, Any]]
    outside: dict[str, Any] | None = None


class SnapshotDifference(_Shape):
    group: Literal["code", "config", "packages", "frameworks", "numerics", "hardware",
                   "platform"]
    field: str
    a: Any
    b: Any
    rank: int | None  # None for a trial-level field


class TrialDiff(_Shape):
    differences: list[SnapshotDifference]  # most result-relevant first
    lines: list[str]  # each as `muster trial diff` prints it: "cuda: 11.7.1 vs 11.7.0"


class DiagnosticFinding(_Shape):
    check: str  # "diagnostics.sampler_overlap", as in verification.checks
    found: bool  # the check found a problem (whether that fails it depends on `mode`)
    detail: str
    mode: Literal["suspect", "warn", "off"]


class TrialDiagnostics(_Shape):
    """The coded-bias diagnostics of the trial's latest attempt (docs/diagnostics.md)."""

    attempt: int | None
    ranks: list[int]  # the ranks that recorded
    findings: list[DiagnosticFinding]
    # grad_norm_spread: [[update, std/mean of the ranks' local gradient norms]];
    # sampler_overlap: [[pass, largest share of the same samples two ranks drew]]
    series: dict[str, list[list[float]]]


class ExperimentDiff(TrialDiff):
    """Two experiments compared through one trial each: its best by the searcher's metric
    (`best`), else its latest (`latest`)."""

    a_trial: int
    a_basis: Basis
    b_trial: int
    b_basis: Basis


class GcRequest(BaseModel):
    """`POST /experiments/{id}/checkpoints/gc`: counts left out keep their value."""

    model_config = ConfigDict(strict=True)

    dry_run: bool = False
    save_trial_latest: int | None = Field(default=None, ge=0, le=1000)
    save_trial_best: int | None = Field(default=None, ge=0, le=1000)
    save_experiment_best: int | None = Field(default=None, ge=0, le=1000)


class GcPolicy(_Shape):
    save_trial_latest: int
    save_trial_best: int
    save_experiment_best: int


class GcDecision(_Shape):
    id: int
    trial_id: int
    name: str
    step: int
    state: str
    keep: bool
    reasons: list[str]


class GcPlan(_Shape):
    experiment_id: int
    dry_run: bool
    policy: GcPolicy
    checkpoints: list[GcDecision]


class DeleteAccepted(_Shape):
    experiment_id: int
    deleting: bool
    message: str


class Archived(_Shape):
    experiment_id: int
    archived: bool


class Job(_Shape):
    trial_id: int
    experiment_id: int
    experiment_name: str
    owner: str | None
    state: str
    priority: int
    replicas: int
    gpus_per_replica: int
    gpu_type: str | None
    gpus: list[int]
    queue_reason: str | None
    progress: TrialProgress | None = None  # while RUNNING, once it reported progress


class GpuView(_Shape):
    index: int
    name: str
    type: str
    memory_total_bytes: int
    memory_used_bytes: int | None  # read live; None with `memory_error`
    memory_error: str | None
    state: str  # free | allocated | releasing
    trial_id: int | None


class FilesystemView(_Shape):
    paths: list[str]
    free_bytes: int
    total_bytes: int


class NodeReplicaView(_Shape):
    """A replica running on a node."""

    trial_id: int
    attempt: int
    rank: int


class NodeView(_Shape):
    """A machine trials run on (with the local launcher: the server's own)."""

    id: str  # the host name (a Ray node's id on Ray)
    address: str
    alive: bool
    cpus: int
    gpus: int
    cpus_free: float | None  # None: not known (a dead node)
    gpus_free: float | None
    hostname: str | None
    quarantined: bool  # the bad-node circuit breaker took it out of the pool
    quarantine_reason: str | None
    replicas: list[NodeReplicaView]  # the replicas of live attempts running there


class NodeReleaseView(_Shape):
    id: str
    released: bool  # True: it was quarantined and is back in the pool


class ClusterStatus(_Shape):
    slots: int
    slots_in_use: int
    queued: int
    queue_length: int
    suspect: int
    trial_counts: dict[str, int]
    gpus: list[GpuView]
    gpu_note: str
    gpu_source: str
    filesystems: list[FilesystemView]
    runs_dir: str
    free_disk_bytes: int
    min_free_disk_bytes: int
    disk_ok: bool
    disk_message: str
    environments: EnvironmentsDisk
    runtime_base: RuntimeBaseView
    nodes: list[NodeView]


class EnvironmentView(_Shape):
    """One environment: `GET /environments`, `muster env list --json`."""

    hash: str
    python: str
    inherit: bool
    packages: list[str]
    setup: list[list[str]]
    state: str  # READY, BUILDING, FAILED, MISSING (requested, not built yet)
    size_bytes: int | None
    built_at: float | None
    last_used: float | None
    message: str | None  # why its build failed
    trials: list[int]  # the trials that need it or ran in it


class PruneRequest(BaseModel):
    older_than: Annotated[str, Field(max_length=32, pattern=r"^[0-9a-z. ]+$",
                                     description="a duration: 7d, 12h, 30m, 0s")] = "7d"


class PruneResultView(_Shape):
    removed: list[str]
    kept_in_use: list[str]
    freed_bytes: int


class EnvironmentsDisk(_Shape):
    count: int
    bytes: int


class BasePackageView(_Shape):
    name: str  # normalized (PEP 503)
    version: str


class RuntimeBaseView(_Shape):
    """What trials without an environment block import (`muster cluster status`)."""

    source: str  # computed (from muster's installation) | configured (base_environment)
    path: str  # the published base, or the configured interpreter or venv
    python: str | None  # its version; None when it cannot be used (`error`)
    packages: list[BasePackageView]  # training packages first
    error: str | None
    message: str  # one line: "computed, 22 packages (torch 2.13.0, ..., +19), python 3.11.7"


class PriorityRequest(BaseModel):
    priority: Annotated[int, Field(ge=MIN_PRIORITY, le=MAX_PRIORITY,
                                   description="1 to 99; lower runs first")]


MAX_NOTE_CHARS = 10_000
_NO_NUL = r"^[^\x00]*$"  # text a database column can hold (PostgreSQL refuses NUL)


class ReviewRequest(BaseModel):
    decision: Literal["approve", "reject"]
    note: Annotated[str, Field(min_length=1, max_length=MAX_NOTE_CHARS, pattern=_NO_NUL,
                               description="why; recorded with the decision")]
    reviewer: Annotated[str | None, Field(
        max_length=200, pattern=_NO_NUL,
        description="ignored: the review is recorded as the authenticated user's (kept so "
                    "that older clients still work)")] = None


# -- users, tokens, sessions, the audit trail ---------------------------------------------

_USER_NAME = r"^[a-z_][a-z0-9_.-]{0,31}$"
_UNIX_NAME = r"^([a-z_][a-z0-9_-]{0,30}\$?)?$"
_PASSWORD = Field(min_length=1, max_length=1024, description="8 to 1024 characters")
UserName = Annotated[str, Field(min_length=1, max_length=32, pattern=_USER_NAME,
                                description="a-z, 0-9, '_', '.', '-'; at most 32")]


class UserView(_Shape):
    name: str
    display_name: str
    role: Literal["admin", "user", "viewer"]
    active: bool
    has_password: bool  # can log in to the web UI
    unix_user: str | None  # its jobs' account under `run_as: owner` (None: its name)
    created_at: float
    last_seen_at: float | None


class NewUser(UserView):
    token: str  # its first API token: shown this once
    token_id: str


class UserCreateRequest(BaseModel):
    name: UserName
    role: Literal["admin", "user", "viewer"] = "user"
    display_name: Annotated[str, Field(max_length=200, pattern=_NO_NUL)] = ""
    password: Annotated[str | None, _PASSWORD] = None
    unix_user: Annotated[str | None, Field(max_length=32, pattern=_UNIX_NAME)] = None


class UserEditRequest(BaseModel):
    display_name: Annotated[str | None, Field(max_length=200, pattern=_NO_NUL)] = None
    role: Literal["admin", "user", "viewer"] | None = None
    password: Annotated[str | None, _PASSWORD] = None
    current_password: Annotated[str | None, Field(
        max_length=1024, description="your current password, to change your own")] = None
    unix_user: Annotated[str | None, Field(max_length=32, pattern=_UNIX_NAME, description=(
        "the Unix account its jobs run as under `run_as: owner`; \"\" for its name"))] = None


class TokenView(_Shape):
    id: str
    name: str
    user: str
    created_at: float
    expires_at: float | None
    last_used_at: float | None
    expired: bool


class NewToken(TokenView):
    token: str  # shown this once


class TokenCreateRequest(BaseModel):
    name: Annotated[str, Field(min_length=1, max_length=100, pattern=_NO_NUL)] = "api token"
    expires: Annotated[str | None, Field(
        max_length=32, pattern=r"^[0-9a-z. ]+$",
        description="a duration such as 30d or 12h (at most 3650d); none: never")] = None
    user: Annotated[str | None, Field(
        min_length=1, max_length=32, pattern=_USER_NAME,
        description="an admin makes a token for this user (a service account)")] = None


class LoginRequest(BaseModel):
    """A user's name and password, or an API token of theirs."""

    name: Annotated[str | None, Field(min_length=1, max_length=32)] = None
    password: Annotated[str | None, Field(min_length=1, max_length=1024)] = None
    token: Annotated[str | None, Field(min_length=1, max_length=200)] = None


class Whoami(UserView):
    via: Literal["token", "session"]
    token_id: str | None
    csrf_token: str | None  # a web session's: send it as X-CSRF-Token on unsafe requests


class LoginView(Whoami):
    expires_at: float  # when the web session ends


class AuditEvent(_Shape):
    id: int
    at: float
    actor: str  # a user's name, or system:supervisor, system:searcher, ...
    kind: str  # what happened: the event's reason ("killed", "review approved", ...)
    message: str | None
    entity: str  # experiment, trial, attempt or user
    entity_id: int
    experiment_id: int | None
    trial_id: int | None
    from_state: str | None
    to_state: str | None


class SessionView(_Shape):
    """A web session (`GET /sessions`)."""

    id: str
    user: str
    created_at: float
    expires_at: float | None
    last_used_at: float | None
    address: str | None  # the client's, when it was opened
    opened_with: str | None  # the API token's id it was opened with; None: a password
    opened_with_name: str | None  # that token's name
    current: bool  # the session this request came with
    ended: bool
