"""The shapes muster's HTTP API serves, declared once: services build them, routes return
them, `muster.client.Client` hands them out, the CLI and the pages read them.

Standard library only (and `muster.states`), so the CLI and the SDK a training script
imports stay fast and free of pydantic; `muster.server.api` derives the pydantic model of
each shape for the door (response validation, `/openapi.json`). A shape here is exactly a
JSON object on the wire: every key is always present (null where the comment says so), and
field names are a fixed contract (docs "JSON contract"): extend, never rename. Free JSON
(hyperparameters, metrics, config blobs, snapshots) is `JsonObject`, `Hparams` or `Config`.
"""

from __future__ import annotations

from typing import Any, Literal, TypedDict

from muster.states import (
    ArtifactState,
    AttemptState,
    Basis,
    CheckpointState,
    DiffGroup,
    DrillRunState,
    DrillState,
    EnvironmentState,
    ExperimentState,
    GpuState,
    Integration,
    LogSearchDirection,
    LogSearchStop,
    MetricKind,
    MetricSource,
    ModelStage,
    OomSource,
    QuotaLimit,
    QuotaSubject,
    RetentionItem,
    Role,
    TrialState,
    UsageBy,
)

# Metric values: numbers, or "NaN", "Infinity", "-Infinity" (strict JSON has no other way).
Number = float | int | str
# Free JSON by design: what a user's code, config or environment chose (a manifest, a
# verification's check details, a snapshot's parts), passed through as it was recorded.
# Every shape muster itself decides is a TypedDict; these are the objects it does not.
JsonObject = dict[str, Any]
Hparams = dict[str, Any]  # a trial's hyperparameters, nested as the search space names them
Config = dict[str, Any]  # an experiment's stored config, normalized (`muster.config`)


class Error(TypedDict):
    """Every error: its kind (the `MusterError` class, or the HTTP phrase) and a sentence
    that says what happened and what to do."""

    error: str
    message: str


class SupervisorHealth(TypedDict):
    """How the supervisor's passes are going (the orchestrator's `PassHealth`)."""

    failures_in_a_row: int
    last_error: str | None
    last_error_at: float | None
    last_pass_at: float | None
    passes: int  # passes that succeeded since the server started
    interval: float  # seconds between passes that nothing woke
    wakeups: bool  # whether files and processes wake passes (inotify, pidfds)


class Health(TypedDict):
    status: Literal["ok"]
    version: str
    pid: int  # `muster up` checks that the server answering is the one it started
    degraded: bool  # the last supervisor pass failed: the server serves, the queue waits
    last_supervisor_error: str | None
    last_supervisor_error_at: float | None
    supervisor: SupervisorHealth


class Event(TypedDict):
    at: float
    entity: str
    entity_id: int
    from_state: str | None
    to_state: str | None
    reason: str
    actor: str
    message: str | None
    attempt: int | None  # an attempt's number in its trial, for an attempt's event


class OomView(TypedDict):
    """Who named a replica's end an OOM kill, and the memory_limit it had (None: none)."""

    source: OomSource
    limit_bytes: int | None


class ReplicaView(TypedDict):
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
    log_lost_bytes: int | None
    # Its latest evidence bundle (`evidence/<id>`, in its attempt's directory: a stall's, or
    # `muster trial dump`'s) and where its main thread was then, one line per rank.
    evidence: str | None
    stack_summary: str | None
    started_at: float | None
    ended_at: float | None


class DumpRankView(TypedDict):
    """One rank's part of an evidence bundle a dump asked for."""

    rank: int
    complete: bool  # its summary.json was written in time
    line: str  # "rank 1 waits in all_reduce at train.py:88", or why there is none
    tool: str | None  # "py-spy" | "faulthandler" | None (no stack could be read)
    errors: list[str]


class DumpResult(TypedDict):
    """`POST /trials/{id}/dump`: the bundle, and what each running rank's part says."""

    bundle: str  # its id, `<UTC yyyymmddThhmmssZ>-requested`
    attempt: int
    path: str  # its directory on the server: `<attempt dir>/evidence/<bundle>`
    ranks: list[DumpRankView]


class AttemptView(TypedDict):
    number: int
    state: AttemptState
    standby: bool  # a warm standby not (yet) promoted
    reason: str | None
    message: str | None
    run_dir: str
    started_at: float | None
    ended_at: float | None
    replicas: list[ReplicaView]


class EarlyStop(TypedDict):
    """Where the searcher stopped a trial early."""

    rung: int
    step: int  # the validation report's step
    value: Number
    time: int | None  # the searcher.time_metric value it was judged at; null without one


class TrialEnvironmentView(TypedDict):
    """What a trial runs in: the hash of its built environment (None: the base interpreter
    under the trial's own layer) and what that held when the trial first launched."""

    hash: str | None
    python: str | None  # environment.python, None: the interpreter muster runs on
    freeze: list[str] | None


class TrialProgress(TypedDict):
    """How far a RUNNING trial has come, in its planned length's unit, and when it will end
    at its recent rate (`muster.services.progress`). `planned`, `fraction` and
    `eta_seconds` are null without a planned length; `rate_per_s` and `eta_seconds` with
    fewer than two progress points: the ETA is unknown, never guessed."""

    done: int | float  # steps or records done; epochs to two places
    planned: int | None
    unit: str  # steps | batches | epochs | records, or searcher.time_metric's name
    fraction: float | None  # done / planned, at most 1
    rate_per_s: float | None
    eta_seconds: float | None  # after `as_of`, at `rate_per_s`
    # verify.expected_length | ctx.plan() | searcher.max_length | the <name> integration
    planned_by: str | None
    measured_by: str  # harness | log (metrics), heartbeat, samples
    as_of: float | None  # the time of the latest progress point


class RunningTrialProgress(TypedDict):
    trial_id: int
    number: int
    progress: TrialProgress


class WarmStartView(TypedDict):
    """The checkpoint an experiment's trials start from (`searcher.source_trial_id`,
    `source_checkpoint_uuid` or `source_model`), as it was resolved when the experiment was
    submitted: a model's stage moved later does not change it."""

    named: str  # the config's key and value: "source_model: digits@production"
    checkpoint_uuid: str
    checkpoint: str  # its name: `step-<step>-<hex>`
    step: int
    trial_id: int  # the trial that saved it
    experiment_id: int
    model: str | None  # the registered model, for `source_model`
    version: int | None  # and its version


class TrialLineage(TypedDict):
    """Where a trial of population-based training (`searcher.name: pbt`) comes from: its
    generation and, after the first, the trial of the generation before whose checkpoint it
    started from, and why."""

    generation: int  # from 0
    # "continue": its parent did well, and it goes on from the parent's checkpoint with the
    # same hyperparameters; "exploit": it replaces a member that did poorly, copying a
    # better one's checkpoint and changing its hyperparameters (`changed`); null in
    # generation 0, which starts afresh.
    action: Literal["continue", "exploit"] | None
    parent_trial_id: int | None
    parent_number: int | None
    replaces_trial_id: int | None  # exploit: the member it replaces
    # The parent's checkpoint it started from, as it was when the trial was drawn.
    checkpoint_uuid: str | None
    checkpoint: str | None  # its name
    step: int | None
    # Each hyperparameter it changed (exploit): [the parent's value, its own].
    changed: dict[str, list[Any]]


class TrialDetail(TypedDict):
    id: int
    uuid: str
    experiment_id: int
    state: TrialState
    reason: str | None
    message: str | None
    restarts: int
    hparams: Hparams
    created_at: float
    started_at: float | None
    ended_at: float | None
    attempts: list[AttemptView]
    manifest: JsonObject | None
    verification: JsonObject | None
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
    snapshot: JsonObject | None
    progress: TrialProgress | None  # while RUNNING, once it reported progress
    # What connected its latest attempt's rank 0 to muster: the script's own harness, or a
    # framework's integration; null while none checked in (a plain script never does).
    integration: Integration | None
    # Its experiment's warm start: the checkpoint its first attempt started from, while it
    # had none of its own; null for a trial that started afresh.
    source: WarmStartView | None
    # Population-based training: its generation and parent; null for any other searcher.
    lineage: TrialLineage | None


class ResourceReading(TypedDict):
    """One resource of a replica: its latest sample and its highest (the peak)."""

    latest: float  # the latest sample's value
    peak: float  # the highest value sampled, over the trial's attempts


class ReplicaResources(TypedDict):
    """One replica's resources, from its `system/` series (`muster.system_metrics`): the
    latest sample and the peak over the trial's attempts; null for what was never sampled
    (the GPUs of a replica without them, or without NVML)."""

    rank: int
    samples: int  # how many were taken (over the trial's attempts)
    sampled_at: float | None  # the time of the latest sample
    cpu_percent: ResourceReading | None  # per cent of one core: 400 is four cores busy
    rss_bytes: ResourceReading | None  # the process group's resident memory
    gpu_util_percent: ResourceReading | None  # the mean over its GPUs
    gpu_memory_bytes: ResourceReading | None  # summed over its GPUs


class TrialDescription(TrialDetail):
    """A trial with its events and its replicas' resources: `GET /trials/{id}`."""

    events: list[Event]
    resources: list[ReplicaResources]  # by rank


class TrialSummary(TypedDict):
    """One row of an experiment's trial list."""

    id: int
    number: int
    state: TrialState
    hparams: Hparams
    early_stopped: bool
    best_validation: dict[str, float]
    restarts: int
    started_at: float | None
    ended_at: float | None
    verified: bool | None  # its exit 0 was verified; null while it has not ended
    verdict: str  # one line, as the CLI and the UI print it (`muster.verdicts`)
    early_stop: EarlyStop | None  # where the searcher stopped it
    progress: TrialProgress | None  # while RUNNING, once it reported progress


class CurveView(TypedDict):
    """One trial's learning curve: steps and values, downsampled (min/max buckets)."""

    trial_id: int
    number: int
    state: TrialState
    hparams: Hparams
    early_stop: EarlyStop | None  # where the searcher stopped it
    reports: int  # finite values the curve stands for
    steps: list[int]
    values: list[float]


class ExperimentCurves(TypedDict):
    experiment_id: int
    metric: str
    kind: str
    smaller_is_better: bool | None  # None for a metric other than the searcher's
    points_per_trial: int
    trials: list[CurveView]


class SeriesView(TypedDict):
    """One metric of a trial as a curve (rank 0), downsampled (min/max buckets)."""

    kind: str
    name: str
    reports: int  # reports that named it, NaN and ±inf included
    lowest: float | None  # finite values only
    highest: float | None
    last_step: int | None
    steps: list[int]
    values: list[float]


class TrialSeries(TypedDict):
    trial_id: int
    series: list[SeriesView]


class ParamImportance(TypedDict):
    name: str  # the key path, e.g. "optimizer.lr"
    importance: float  # its share; the shares of an answer sum to 1


class Importance(TypedDict):
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


class BestSoFar(TypedDict):
    trial_id: int
    number: int
    hparams: Hparams
    metric: str
    value: float
    early_stopped: bool


class SearchProgress(TypedDict):
    searcher: str
    metric: str | None
    smaller_is_better: bool
    max_trials: int
    max_concurrent_trials: int
    max_length: int | None  # the training each trial gets, in max_length_unit
    max_length_unit: str  # steps (report_validation's), batches, epochs or records
    # the validation metric whose value max_length counts instead of steps, or null
    time_metric: str | None
    ended: int  # SUCCEEDED, FAILED, CANCELED and SUSPECT
    running: int  # STARTING, RUNNING and RESTARTING
    queued: int  # QUEUED and PAUSED
    remaining: int  # still to be made
    best: BestSoFar | None  # by `metric` (a multi-objective search's first objective)
    # What the search compares trials by: `searcher.metrics` (several: a multi-objective
    # search, whose results are its Pareto front, `GET /experiments/{id}/front`), or the
    # one metric; empty when none.
    objectives: list[Objective]


class Objective(TypedDict):
    name: str  # a validation metric
    smaller_is_better: bool


class FrontPoint(TypedDict):
    trial_id: int
    number: int
    hparams: Hparams
    values: dict[str, float]  # each objective's value in the last report that held it
    on_front: bool  # no other trial is at least as good on every objective and better on one


class ParetoFront(TypedDict):
    """A search's trials by its objectives (`GET /experiments/{id}/front`): the SUCCEEDED
    trials that reported a finite value of each, those on the Pareto front first (by the
    first objective, best first), then the others (dominated) in the same order."""

    experiment_id: int
    objectives: list[Objective]
    points: list[FrontPoint]
    front: int  # how many of `points` are on the front (the first ones)
    without_values: int  # SUCCEEDED trials left out: an objective missing, NaN or infinite


class Progress(TypedDict):
    ended: int  # SUCCEEDED, FAILED, CANCELED, SUSPECT
    running: int  # STARTING, RUNNING, RESTARTING
    queued: int  # QUEUED, PAUSED
    total: int  # every trial it will make (1, a grid's size, max_trials)


class VerdictCounts(TypedDict):
    """An experiment's trials by verdict."""

    verified: int  # SUCCEEDED, and their exit 0 verified
    not_verified: int  # SUCCEEDED without that (nothing inspected; approved on review)
    suspect: int  # SUSPECT: exit 0, a check failed, a person must decide


class ExperimentSummary(TypedDict):
    id: int
    uuid: str
    name: str
    description: str
    labels: list[str]
    state: ExperimentState
    message: str | None
    created_at: float
    ended_at: float | None
    trial_states: list[TrialState]
    priority: int  # what its new trials get
    archived: bool  # hidden from the default lists (`muster experiment archive`)
    owner: str | None  # the user who submitted it (None only for older experiments)
    progress: Progress  # its trials by stage, of all it will make
    awaiting_review: int  # SUSPECT trials: exit 0, a check failed, a person must decide
    unverified: int  # SUCCEEDED trials whose exit 0 was not verified (verdicts.not_verified)
    verdicts: VerdictCounts
    best: BestSoFar | None  # the search's best trial so far (its searcher's metric)
    # Its RUNNING trials that reported progress, by number.
    trial_progress: list[RunningTrialProgress]


class ExperimentDetail(ExperimentSummary):
    config: Config
    config_yaml: str  # the config as it was submitted (secrets are never in it)
    # A page of its trials, by id: the first 1,000 unless asked (`offset` and `limit`, at
    # most 1,000, on `GET /experiments/{id}`; `muster experiment describe --trials-offset`).
    # Every other field counts all of them.
    trials: list[TrialDetail]
    trials_total: int  # its trials, all of them (also the answer's X-Total-Count)
    trials_offset: int  # where `trials` starts
    trials_next_offset: int | None  # the offset of the next page; null: `trials` ends the list
    search: SearchProgress
    warnings: list[str]  # e.g. no ended trial reported the searcher's metric
    source: WarmStartView | None  # the checkpoint its trials start from; null: afresh


class MetricReport(TypedDict):
    kind: MetricKind
    step: int
    time: float
    attempt: int
    rank: int
    metrics: dict[str, Number]
    # Where muster read it: "harness" (a metrics file) or "log" (recognised in the rank's
    # log: `verify.metrics_from_log` or a built-in recogniser).
    source: MetricSource


class ArtifactFile(TypedDict):
    path: str  # relative to the trial's working directory
    size: int  # bytes
    sha256: str


class ArtifactSetView(TypedDict):
    """The files a trial's final attempt left that its config names (`artifacts`,
    `verify.outputs`), as the server copied them when the trial ended."""

    trial_id: int
    attempt: int  # the final attempt, whose files these are
    state: ArtifactState  # pending (being copied), collected, empty, refused
    files: list[ArtifactFile]  # by path
    size: int  # bytes, every file's
    skipped: list[str]  # "<path>: <why it was not taken>" (links, stale files...), the first 20
    skipped_count: int
    message: str | None  # why nothing was kept (refused)
    collected_at: float | None
    # Its copy in checkpoint storage, as a checkpoint's state: local, uploading, stored,
    # upload_failed (error says why; retried), deleted (with its experiment).
    storage_state: CheckpointState
    storage_url: str | None  # where it is stored (`stored` only)
    error: str | None  # why its last upload failed


class AcceptedUnverified(TypedDict):
    """Who registered a trial that was not verified, and why."""

    reason: str
    by: str
    at: float


class ModelVersionView(TypedDict):
    """One version of a registered model: a trial's checkpoint, with its lineage."""

    model: str
    version: int  # 1, 2, ...
    stage: ModelStage  # none | staging | production | archived
    trial_id: int
    experiment_id: int
    checkpoint_uuid: str
    verified: bool  # the trial's verdict when it was registered
    accepted_unverified: AcceptedUnverified | None  # set exactly when not verified
    metrics: JsonObject  # rank 0's validation at (or before) the checkpoint's step
    # code tree sha256, config sha256, environment key, data fingerprint
    snapshot: JsonObject
    # trial, experiment, owner, hparams, checkpoint, verification, verdict, metrics, snapshot
    lineage: JsonObject
    registered_by: str
    registered_at: float


class RegisteredModelView(TypedDict):
    name: str
    description: str
    labels: list[str]
    created_at: float
    versions: list[ModelVersionView]  # the newest MAX_NESTED (100), oldest first
    # all of them; `versions` holds the newest MAX_NESTED (`GET /models/{name}/versions`
    # pages through every one)
    versions_total: int


class MlflowExport(TypedDict):
    """A model version handed to MLflow (`muster model export`, or the server's export to
    the cluster config's `mlflow.tracking_uri`): the MLflow run made of it, and the version
    registered in MLflow's registry that links to that run."""

    model: str  # muster's model
    version: int  # muster's version of it
    tracking_uri: str  # the MLflow tracking server
    experiment_id: str  # MLflow's experiment, named after the muster experiment
    run_id: str  # MLflow's run: params, metric series, tags, checkpoint/ and artifacts/
    run_url: str  # the run's page in the MLflow UI
    registered_model: str  # the model's name in MLflow's registry
    model_version: int  # MLflow's version number (MLflow counts its own)
    model_version_url: str  # the version's page in the MLflow UI


class CheckpointView(TypedDict):
    id: int
    uuid: str  # its name in storage: `<storage>/<uuid>/`
    trial_id: int
    name: str
    path: str  # in the trial's run directory (gone once `deleted`)
    step: int
    state: CheckpointState
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


class TrialSnapshot(TypedDict):
    """`muster.diagnostics`: the trial part, each rank's part (by rank, as text), and the
    outside part of its latest attempt that has one (what the server saw from outside the
    process at its launch: the interpreter, the layer's packages, the code's tree hash)."""

    trial: JsonObject
    ranks: dict[str, JsonObject]
    outside: JsonObject | None


class SnapshotDifference(TypedDict):
    group: DiffGroup
    field: str
    a: Any
    b: Any
    rank: int | None  # None for a trial-level field


class TrialDiff(TypedDict):
    differences: list[SnapshotDifference]  # most result-relevant first
    lines: list[str]  # each as `muster trial diff` prints it: "cuda: 11.7.1 vs 11.7.0"


class DiagnosticFinding(TypedDict):
    check: str  # "diagnostics.sampler_overlap", as in verification.checks
    found: bool  # the check found a problem (whether that fails it depends on `mode`)
    detail: str
    mode: Literal["suspect", "warn", "off"]


class TrialDiagnostics(TypedDict):
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


class GcPolicy(TypedDict):
    save_trial_latest: int
    save_trial_best: int
    save_experiment_best: int


class GcDecision(TypedDict):
    id: int
    trial_id: int
    name: str
    step: int
    state: CheckpointState
    keep: bool
    reasons: list[str]


class GcPlan(TypedDict):
    experiment_id: int
    dry_run: bool
    policy: GcPolicy
    checkpoints: list[GcDecision]


class DeleteAccepted(TypedDict):
    experiment_id: int
    deleting: bool
    message: str


class Archived(TypedDict):
    experiment_id: int
    archived: bool


class RetentionRules(TypedDict):
    """The cluster config's `retention`, as it says it (`"90d"`; null: never)."""

    logs_after: str | None
    runs_after: str | None
    keep_registered: bool
    keep_labels: list[str]


class RetentionLine(TypedDict):
    """One thing a retention sweep removes (`muster gc runs`): a trial's logs, its run
    directory (less its checkpoints and artifacts, on lines of their own), one of its
    checkpoints, or its artifact set."""

    experiment_id: int
    experiment_name: str
    trial_id: int
    what: RetentionItem
    name: str | None  # the checkpoint's name, or the artifact set's attempt ("attempt 1")
    bytes: int
    files: int
    at_least: bool  # the walk stopped at 100,000 files: bytes and files are at least these
    ended_at: float  # when its experiment ended
    rule: str  # the rule it is past: "retention.runs_after 180d"


class RetentionKept(TypedDict):
    """Something past a rule that stays, and why; a whole experiment when `trial_id` is
    null (it carries one of `keep_labels`)."""

    experiment_id: int
    experiment_name: str
    trial_id: int | None
    why: str


class RetentionPlan(TypedDict):
    """`POST /retention/runs`: what the cluster config's `retention` removes now, with
    sizes; unless `dry_run`, the storage worker removes it at once, recording each
    trial's removal as an event first. `enabled` is false (and the plan empty) when the
    cluster config has no `retention` with an age."""

    enabled: bool
    dry_run: bool
    rules: RetentionRules | None
    lines: list[RetentionLine]
    total_bytes: int  # of the lines
    # False: the plan stopped at its first 1,000 lines; more are past the rules (a sweep
    # removes them all, and the next plan shows what is left).
    complete: bool
    kept: list[RetentionKept]  # the first 1,000
    more_kept: int
    message: str


class LogMatch(TypedDict):
    """One match of a log search: where it is in the rank's log (the byte offsets that
    `GET /trials/{id}/logs?rank=R&offset=N` reads) and its line, decoded for display."""

    offset: int  # the match's first byte in the log
    end: int  # the byte after its last (= offset for an empty match, as `^` makes)
    line_offset: int  # where its line starts
    before: str  # the line before the match, decoded (invalid bytes as U+FFFD)
    text: str  # what matched, decoded
    after: str  # the line after the match, without its newline, decoded
    cut: bool  # the line passes 4 KiB: before, text and after keep what fits around the match


class LogSearchResult(TypedDict):
    """One page of a search of one rank's log (`GET /trials/{id}/logs/search`). Not
    `complete`: pass `next_from` back as `from`, with the same direction, to go on."""

    attempt: int  # 0: the trial has not started an attempt (nothing to search)
    rank: int
    ranks: list[int]  # the attempt's ranks: search each with rank=R
    direction: LogSearchDirection
    matches: list[LogMatch]  # nearest first: by offset forward, by falling offset backward
    complete: bool  # the scan reached the log's end (forward) or start (backward)
    stopped: LogSearchStop  # end; or limit, time, bytes: go on from next_from
    next_from: int  # where to go on: forward, matches at or after it; backward, before it
    scanned_from: int  # the bytes this page looked at: [scanned_from, scanned_to)
    scanned_to: int
    size: int  # the log's size when the search began; bytes written later are not searched


class Job(TypedDict):
    trial_id: int
    experiment_id: int
    experiment_name: str
    owner: str | None
    state: TrialState
    priority: int
    replicas: int
    gpus_per_replica: int
    gpu_type: str | None
    gpus: list[int]
    queue_reason: str | None
    progress: TrialProgress | None  # while RUNNING, once it reported progress


class GpuView(TypedDict):
    index: int
    name: str
    type: str
    memory_total_bytes: int
    memory_used_bytes: int | None  # read live; None with `memory_error`
    memory_error: str | None
    state: GpuState
    trial_id: int | None


class FilesystemView(TypedDict):
    paths: list[str]
    free_bytes: int
    total_bytes: int


class NodeReplicaView(TypedDict):
    """A replica running on a node."""

    trial_id: int
    attempt: int
    rank: int


class NodeView(TypedDict):
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


class NodeReleaseView(TypedDict):
    id: str
    released: bool  # True: it was quarantined and is back in the pool


class ClusterStatus(TypedDict):
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
    quotas: list[QuotaView]  # `GET /quotas`: each quota, and what its users hold now


class EnvironmentView(TypedDict):
    """One environment: `GET /environments`, `muster env list --json`."""

    hash: str
    python: str
    inherit: bool
    packages: list[str]
    setup: list[list[str]]
    state: EnvironmentState  # MISSING: requested, not built yet
    size_bytes: int | None
    built_at: float | None
    last_used: float | None
    message: str | None  # why its build failed
    # the trials that need it or ran in it: the newest MAX_NESTED (100), ascending
    trials: list[int]
    trials_total: int  # all of them; `trials` holds the newest MAX_NESTED


class PruneResultView(TypedDict):
    removed: list[str]
    kept_in_use: list[str]
    freed_bytes: int


class EnvironmentsDisk(TypedDict):
    count: int
    bytes: int


class BasePackageView(TypedDict):
    name: str  # normalized (PEP 503)
    version: str


class RuntimeBaseView(TypedDict):
    """What trials without an environment block import (`muster cluster status`)."""

    source: str  # computed (from muster's installation) | configured (base_environment)
    path: str  # the published base, or the configured interpreter or venv
    python: str | None  # its version; None when it cannot be used (`error`)
    packages: list[BasePackageView]  # training packages first
    error: str | None
    message: str  # one line: "computed, 22 packages (torch 2.13.0, ..., +19), python 3.11.7"


class UserView(TypedDict):
    name: str
    display_name: str
    role: Role
    active: bool
    has_password: bool  # can log in to the web UI
    unix_user: str | None  # its jobs' account under `run_as: owner` (None: its name)
    created_at: float
    last_seen_at: float | None


class NewUser(UserView):
    token: str  # its first API token: shown this once
    token_id: str


class TokenView(TypedDict):
    id: str
    name: str
    user: str
    created_at: float
    expires_at: float | None
    last_used_at: float | None
    expired: bool


class NewToken(TokenView):
    token: str  # shown this once


class NotificationSubscriptionView(TypedDict):
    """A user's own notification target (`muster notify add`)."""

    id: int
    user: str
    url: str  # shown redacted: its scheme and host, never its path or tokens
    events: list[str]  # `NotificationKind` words
    signed: bool  # muster's signed webhook (its signing key was shown when it was added)
    created_at: float


class NewNotificationSubscription(NotificationSubscriptionView):
    secret: str | None  # the webhook's signing key (hex), shown this once; null for Apprise


class NotificationView(TypedDict):
    """One notification of the outbox and how its delivery went (`muster notify log`)."""

    id: int
    event_id: int
    kind: str  # a `NotificationKind` word
    target: str  # "config:<digest>" (the cluster config's) or "user:<subscription id>"
    url: str  # the target's, redacted; "" once the target is gone
    state: str  # pending, sending, delivered or failed
    tries: int
    last_error: str | None
    created_at: float
    delivered_at: float | None
    title: str | None  # once rendered (its first try)


class Whoami(UserView):
    via: Literal["token", "session"]
    token_id: str | None
    csrf_token: str | None  # a web session's: send it as X-CSRF-Token on unsafe requests


class LoginView(Whoami):
    expires_at: float  # when the web session ends


class AuditEvent(TypedDict):
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


class SessionView(TypedDict):
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



class UsageRow(TypedDict):
    """One group of a usage report (`GET /usage`, `muster usage`): hours inside the report's
    window, split as `muster.services.usage` defines them. The splits are slot-hours (a slot:
    one replica's place), but for `queued_hours` (trial-hours waiting, holding no slot)."""

    key: str  # the owner's name, the experiment's id, or the label; "(none)": none of them
    name: str  # what the key names: the experiment's name by experiment, else the key
    slot_hours: float  # productive + lost + stalled + idle + running
    gpu_hours: float  # the same time, times the GPUs held instead of the replicas
    productive_hours: float  # attempts that SUCCEEDED; others' work up to a checkpoint resumed
    lost_hours: float  # work after the last resumed checkpoint of an attempt that ended
    stalled_hours: float  # from a STALLED replica's last sign of life to its end
    idle_hours: float  # slots held while no attempt ran (trial STARTING or RESTARTING)
    running_hours: float  # attempts still running: not decided yet
    queued_hours: float
    goodput: float | None  # productive / (slot_hours - running_hours); None: no such time
    trials: int  # trials with time in the window
    attempts: int  # attempts that ran in the window


class UsageReport(TypedDict):
    """`GET /usage`: one row per group (the most slot-hours first) and the total."""

    by: UsageBy
    since: float  # the window's start (Unix time)
    until: float  # its end: when the report was made
    owner: str | None  # whose experiments it counts; None: everyone's
    rows: list[UsageRow]
    more_rows: int  # groups past the report's limit, not listed
    total: UsageRow  # key "total": each trial once (by label, rows may overlap)


class QuotaUsage(TypedDict):
    """What a quota's users hold now (a group's: its members' together)."""

    slots: int  # replicas without GPUs of their trials that hold resources
    gpus: int
    running_trials: int  # STARTING, RUNNING or RESTARTING
    queued_trials: int


class QuotaLimitView(TypedDict):
    limit: QuotaLimit
    value: int | None  # None: no limit (named so, lifting a more general one)
    # set by an admin | cluster config | default, set by an admin | default, cluster config
    source: str


class QuotaView(TypedDict):
    """A quota (`muster quota list`): one user's own, one group's, or the default."""

    subject: QuotaSubject
    name: str | None  # the user's or the group's; None for the default
    limits: list[QuotaLimitView]  # the limits that apply, from wherever each comes
    in_use: QuotaUsage | None  # None for the default (it is each user's own)
    members: list[str]  # a group's; [] otherwise
    known: bool  # False: the cluster config names a user or group this server lacks
    summary: str  # one line: "2 of 8 GPUs, 1 of 4 running trials in use"


class UserQuotas(TypedDict):
    """What one user is held to (`muster quota show`): their own quota, then each of their
    groups'."""

    user: str
    groups: list[str]
    quotas: list[QuotaView]
    summary: str  # one line over all of them, "" when nothing limits them


class GroupView(TypedDict):
    """A group of users (`muster group list`)."""

    name: str
    description: str
    members: list[str]
    created_at: float


class DrillCleanRun(TypedDict):
    """A drill's clean run: how it ended (each fault's run is judged beside it)."""

    state: str | None  # its trial's state; null until it ended
    verified: bool | None
    verdict: str | None
    seconds: float | None  # from RUNNING to its end
    experiment_id: int | None


# One fault of a drill (`muster drill --json`'s `faults[]`): when it was injected, what
# muster said (the trial's state, the class and message of the end that named it), whether
# that caught it, how long that took, and what to change when it did not. `caught` is null
# for a fault that was skipped or not injected (`skipped` or `message` says why).
DrillFaultReport = TypedDict("DrillFaultReport", {
    "name": str,
    "injected_at": float | None,
    "state": str | None,
    "class": str | None,
    "message": str | None,
    "caught": bool | None,
    "detect_seconds": float | None,
    "advice": str | None,
    "expected": str,  # "named" (muster must name it) or "survive" (end as the clean run did)
    "run_state": DrillRunState,
    "experiment_id": int | None,
    "injection": str | None,  # what was done, as the drill did it
    "verdict": str | None,
    "skipped": str | None,  # why this fault was not run here
})


class DrillView(TypedDict):
    """A drill (`muster drill`, `GET /drills/{id}`): the contract's `experiment_ids`,
    `clean` and `faults`, and where it stands."""

    id: int
    name: str
    owner: str | None
    state: DrillState
    created_at: float
    ended_at: float | None
    scale: float
    at: float
    scaled: list[str]  # what the drill shortened: "--epochs 15 → 2"
    experiment_ids: list[int]  # the clean run's first, then each fault's run's
    clean: DrillCleanRun
    faults: list[DrillFaultReport]
    summary: str | None  # "8 of 10 faults caught; `corrupt-data` passed unnoticed: …"
    source_experiment: int | None  # the experiment it was asked for on (the UI's button)


class DrillSummary(TypedDict):
    """One row of `GET /drills`."""

    id: int
    name: str
    owner: str | None
    state: DrillState
    created_at: float
    summary: str | None
