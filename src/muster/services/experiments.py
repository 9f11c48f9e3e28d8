"""Experiment and trial services: what the routes call, and what tests call directly."""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager as ContextManager
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple, Protocol, TypedDict

from sqlalchemy import select
from sqlalchemy.orm import Session, selectinload

from muster import api, git_state, job_secrets
from muster.config import ExperimentConfig
from muster.config.determined import SlotKind, Translation
from muster.config.loading import read_experiment_config
from muster.config.problems import config_error
from muster.config.quotas import QuotasConfig
from muster.config.schema import SearcherConfig
from muster.environments.layout import EnvHome
from muster.environments.registry import keep_request
from muster.environments.request import RequestError, build_request
from muster.environments.runtime_base import RuntimeBase
from muster.environments.sources import package_source_problems
from muster.errors import (
    Conflict,
    Forbidden,
    InvalidRequest,
    NotFound,
    PayloadTooLarge,
    QuotaExceeded,
)
from muster.git_state import GitState
from muster.home import Home
from muster.launch.accounts import Account, RunAs
from muster.priority import MIN_PRIORITY
from muster.schedule.quota_book import lock_and_refuse_queued, read_book
from muster.services import idempotency, listing, progress, views
from muster.services.access import Action, Principal, authorize, check_priority_floor
from muster.services.allowances import Allowances, allowance_problems
from muster.services.resources import replica_resources
from muster.services.submission import ClusterCapacity, check_submission
from muster.services.uploads import extract_context
from muster.services.validation import best_validation
from muster.states import EventReason, ExperimentState, StopIntent, TrialState
from muster.store import (
    Attempt,
    Event,
    Experiment,
    Store,
    Trial,
    User,
    record_event,
    transition,
)
from muster.store.configs import experiment_searcher
from muster.words import count

# A review's decision: the state it moves a SUSPECT trial to, and the event's reason.
REVIEW_DECISIONS = {
    "approve": (TrialState.SUCCEEDED, EventReason.REVIEW_APPROVED),
    "reject": (TrialState.FAILED, EventReason.REVIEW_REJECTED),
}
# The events an experiment shows as warnings: the supervisor's, and the keys of the
# Determined config it was submitted as that muster does without.
WARNING_REASONS = (EventReason.METRIC_MISSING, EventReason.SEARCH_STOPPED,
                   EventReason.DETERMINED_KEY_IGNORED)
# The files and directories a create's snapshots may hold together (configs x context).
MAX_ENTRIES_PER_CREATE = 200_000
# What a describe shows as a trial's `snapshot`: the trial part of its reproducibility
# snapshot (`snapshots.TrialParts`, handed in by the caller: that module reads trials
# through this one, and only reads, not actions, pay for reading the home).
TrialPartOf = Callable[[Trial], api.JsonObject]

DESCRIBE_TRIALS = 1_000  # trials in one page of an experiment's description: the default


@dataclass(frozen=True)
class TrialWindow:
    """Which of an experiment's trials its description holds whole: `limit` (at most
    `DESCRIBE_TRIALS`) from `offset`, by id."""

    offset: int = 0
    limit: int = DESCRIBE_TRIALS


FIRST_TRIALS = TrialWindow()


class ExperimentHeader(TypedDict):
    """What a trial's page says of its experiment (`experiment_header`)."""

    id: int
    name: str
    state: ExperimentState
    owner: str | None


class TrialProgressPoll(TypedDict):
    """What a trial's page polls while the trial runs (`trial_progress`)."""

    id: int
    state: TrialState
    progress: api.TrialProgress | None


# Records, in a create's transaction, the first attempt of a trial created in it when it
# may start at once (what `Submission.admitting` yields: the supervisor's `admitting_new`).
AdmitNew = Callable[[Session, Trial], None]


class WarmStart(NamedTuple):
    """A config's warm start (`searcher.source_*`) resolved to the checkpoint its trials
    start from: what the experiment records (`Experiment.source_checkpoint_id`, `.source`)."""

    checkpoint_id: int
    view: api.WarmStartView


# Resolves a config's warm start in the create's transaction, or refuses it (ConfigError,
# with the key path): `muster.services.warm_starts.resolve_source`, which reads the model
# registry, a layer above this module, so it is handed in with the submission.
SourceResolver = Callable[[Session, SearcherConfig, str], WarmStart | None]


class Submission(Protocol):
    """What a create needs of the server (`muster.server.platform.Platform`), or of a store
    and a home alone (`PlainSubmission`)."""

    @property
    def store(self) -> Store: ...

    @property
    def home(self) -> Home: ...

    @property
    def allowances(self) -> Allowances:
        """What a non-admin's config may make the server act on (`services.allowances`)."""

    @property
    def priority_floor(self) -> int:
        """The best priority a non-admin may give."""

    @property
    def run_as(self) -> RunAs | None:
        """Whom jobs run as; None: the server's user."""

    @property
    def runtime(self) -> RuntimeBase:
        """What an environment that inherits (without `environment.python`) is based on:
        the server's base of trials (it knows the cluster config's `base_environment`)."""

    def capacity(self) -> ClusterCapacity | None:
        """What a trial's demand is compared with (`services.submission`); None: nothing."""

    def admitting(self, priority: int) -> ContextManager[AdmitNew | None]:
        """Admission at submission for trials of `priority` at best: yields a function to
        call with each new trial in the create's transaction, or None (they wait for the
        pass); the caller wakes the passes after the create."""

    @property
    def sources(self) -> SourceResolver | None:
        """What resolves a config's warm start; None: a warm start is refused."""

    @property
    def quotas(self) -> QuotasConfig:
        """The cluster config's quotas (`max_queued_trials` refuses a create)."""


def slot_kind(submission: Submission) -> SlotKind:
    """What a Determined config's slots are on this server: GPUs where it schedules any,
    else processes (`muster.config.determined.translate`)."""
    capacity = submission.capacity()
    return "gpu" if capacity is not None and any(capacity.gpus.values()) else "cpu"


@dataclass(frozen=True)
class NewExperiments:
    """What a create is asked for: one experiment per config (a batch: several, sharing one
    context), from an uploaded context (`archive`), another experiment's snapshot
    (`context_from`: run again, its git state too) or none; the values of the configs'
    `submit` secrets; the uploaded context's git state (`muster.git_state`); the request's
    idempotency key (`muster.services.idempotency`), recorded with the experiments."""

    configs: Sequence[str]
    archive: Path | None = None
    secrets: Mapping[str, str] | None = None
    context_from: int | None = None
    git: GitState | None = None
    claim: idempotency.Claim | None = None
    # A drill's run (`muster.drill`): which drill and run the experiments are, set by the
    # server alone; and what the drill changes in the snapshot before it is recorded (the
    # corrupt-data fault's damaged copy of the data).
    drill: DrillMark | None = None
    alter_context: Callable[[Path], None] | None = None


@dataclass(frozen=True)
class DrillMark:
    """An experiment that is one run of a drill (`experiments.drill_*`)."""

    drill_id: int
    run: str  # "clean" or a `DrillFault`
    fs_bytes: int | None = None  # disk-full: its trials' run directories' file system


@dataclass(frozen=True)
class PlainSubmission:
    """A submission to a store and a home alone (tests, benchmarks): no capacity to check,
    the default allow-lists, no `run_as`, the runtime base computed for the home, and no
    admission at submission unless `admit` (a supervisor's `admitting_new`)."""

    store: Store
    home: Home
    admit: Callable[[int], ContextManager[AdmitNew | None]] | None = None
    allowances: Allowances = field(default_factory=Allowances)
    priority_floor: int = MIN_PRIORITY
    run_as: RunAs | None = None
    sources: SourceResolver | None = None  # `warm_starts.resolve_source` for warm starts
    quotas: QuotasConfig = field(default_factory=QuotasConfig)

    @property
    def runtime(self) -> RuntimeBase:
        return RuntimeBase(EnvHome(self.home.envs_dir), shared=self.run_as is not None)

    def capacity(self) -> None:
        return None

    def admitting(self, priority: int) -> ContextManager[AdmitNew | None]:
        return nullcontext() if self.admit is None else self.admit(priority)


def create_experiment(store: Store, home: Home, owner: Principal, config_text: str,
                      archive: Path | None = None, *, secrets: Mapping[str, str] | None = None,
                      context_from: int | None = None, git: GitState | None = None,
                      sources: SourceResolver | None = None) -> int:
    """`create_experiments` of one config, submitted to `store` and `home` alone
    (`PlainSubmission`, with `sources` to resolve a warm start); returns the experiment's
    id."""
    new = NewExperiments([config_text], archive, secrets, context_from, git)
    return create_experiments(PlainSubmission(store, home, sources=sources), owner, new)[0]


@dataclass(frozen=True)
class Created:
    """What a create answers with: its experiments' ids, in the order of the configs, and
    whether an earlier create with the same idempotency key made them (`replayed`)."""

    ids: list[int]
    replayed: bool = False


def create_once(submission: Submission, owner: Principal, new: NewExperiments) -> Created:
    """`create_experiments`, unless `new.claim`'s key was used already: then the experiments
    that create made, also when it wins a race with this one (`idempotency.KeyTaken`).

    Raises:
        Conflict: the key was used for another request, or the create that holds it has
            not committed yet (retry with the same key).
    """
    claim = new.claim
    known = None if claim is None else idempotency.answer_for(submission.store, claim)
    if known is not None:
        return Created(known, replayed=True)
    try:
        return Created(create_experiments(submission, owner, new))
    except idempotency.KeyTaken:
        known = None if claim is None else idempotency.answer_for(submission.store, claim)
        if known is None:
            raise
        return Created(known, replayed=True)


def create_experiments(submission: Submission, owner: Principal, new: NewExperiments
                       ) -> list[int]:
    """Validate the configs and the submitted secrets (`environment.secrets`), snapshot
    the context, check what can be checked now (`muster.services.submission`, against the
    submission's capacity), keep the secrets (0600, never in the database), and record the
    experiments, owned by `owner`, with their trials. Every config is validated before
    anything is written, the context is unpacked once (the others get hard-linked copies
    of it: a snapshot is never written to), and every experiment and trial is recorded in
    one transaction: all of them or none. Returns their ids, in the order of the configs.
    A trial that may start at once (`Submission.admitting`, given the best priority of the
    configs) gets its first attempt recorded in that transaction too. A non-admin may ask
    for no priority better than the submission's `priority_floor`, nor make the server act
    on what its `allowances` do not list; under `run_as: owner` the owner's Unix account
    must exist. With a `claim`, its key is recorded in that transaction too. Each
    experiment queues a trial (a single one its trial, a search its first draw): a create
    that would take `owner` or one of their groups past a `max_queued_trials` quota is
    refused, counted in that transaction under a lock (`muster.schedule.quota_book`).

    Raises:
        KeyTaken: (`muster.services.idempotency`) a create with the claim's key was
            recorded first: nothing was created; its experiments are the answer.
        NotFound: `context_from` names no experiment.
        Forbidden: `owner` may not submit, asks for a priority reserved for admins, or a
            config names a secret source, a storage place, an interpreter or a data path
            outside what the allow-lists let `owner` name, one line per key.
        ConfigError: (422) a config is invalid (its problem names it: `config 3 of 10`),
            or its jobs have no account to run as.
        QuotaExceeded: (429) it would queue more trials than a quota of `owner`'s allows;
            the message names the quota.
    """
    authorize(owner, Action.SUBMIT)
    configs = []
    home, allowed = submission.home, submission.allowances
    for number, text in enumerate(new.configs, 1):
        source = ("the uploaded config" if len(new.configs) == 1
                  else f"the uploaded config {number} of {len(new.configs)}")
        loaded = read_experiment_config(text, source=source, slots=slot_kind(submission))
        config = loaded.config
        check_priority_floor(owner, config.resources.priority, submission.priority_floor,
                             where="resources.priority")
        refused = allowance_problems(config, owner, allowed, home.root)
        if refused:
            raise Forbidden("\n".join([f"{source}: {owner.role} {owner.name} may not "
                                       "make the server act on:", *refused]))
        problems = (job_secrets.check_submitted(config, new.secrets or {})
                    + job_secrets.check_server(config, os.environ, home.root))
        if problems:
            raise config_error(source, problems)
        _check_warm_start(submission, config, source)  # before the snapshot is made
        configs.append((source, text, loaded.translation, config))
    with submission.store.session_scope() as s:  # before any work; the insert checks again
        _check_queued(s, submission.quotas, owner, len(configs))
    run_as = submission.run_as
    account = _check_account(submission.store, run_as, owner) if run_as is not None else None
    capacity, runtime = submission.capacity(), submission.runtime
    made: list[_Prepared] = []
    try:
        for source, text, translation, config in configs:
            exp_uuid = str(uuid.uuid4())
            context = home.context_dir(exp_uuid)
            made.append(_Prepared(exp_uuid, text, config, context, translation, source))
            if made[0].context is not context:
                context.parent.mkdir(parents=True, exist_ok=True)
                shutil.copytree(made[0].context, context, symlinks=True,
                                copy_function=_link_or_copy)
                git_state.copy(home, made[0].uuid, exp_uuid)
            elif new.archive is not None:
                extract_context(new.archive, context)
            elif new.context_from is not None:
                source_uuid = _copy_snapshot(submission.store, new.context_from, context, owner)
                git_state.copy(home, source_uuid, exp_uuid)
            else:
                context.mkdir(parents=True)
            if new.git is not None and made[0].context is context:
                git_state.save(home, exp_uuid, new.git)
            if new.alter_context is not None:
                new.alter_context(context)
            if made[0].context is context and len(configs) > 1:
                _check_copies(len(configs), context)
            check_submission(config, context, capacity, source)
            made[-1].environment = _keep_environment(home, config, context, source, owner,
                                                     account, allowed, runtime)
            if new.secrets:
                job_secrets.save_submitted(home, exp_uuid, new.secrets)
        return _insert_experiments(submission, owner, made, new.claim, new.drill)
    except BaseException:
        for prepared in made:
            shutil.rmtree(prepared.context.parent, ignore_errors=True)
            job_secrets.delete_submitted(home, prepared.uuid)
        raise


@dataclass
class _Prepared:
    """An experiment of a create, its context snapshot made, not yet recorded."""

    uuid: str
    text: str
    config: ExperimentConfig
    context: Path
    translation: Translation | None  # the Determined config `text` was, read as muster's
    source: str  # which of the create's configs it is, as its problems name it
    environment: str | None = None


def _copy_snapshot(store: Store, experiment_id: int, context: Path, owner: Principal) -> str:
    """Experiment `experiment_id`'s context snapshot, for a new experiment of `owner`'s (its
    own, or any for an admin: a job must not read another owner's code): hard links where
    the file system allows (a snapshot is never written to), else copies. Returns the
    experiment's uuid.

    Raises:
        Forbidden: the experiment is another owner's, and `owner` is no admin.
    """
    with store.session_scope() as s:
        experiment = experiment_or_404(s, experiment_id)
        source, source_uuid = Path(experiment.context_dir), experiment.uuid
        whose = experiment.owner_name
    if whose != owner.name and not owner.is_admin:
        raise Forbidden(f"experiment {experiment_id} belongs to {whose or 'no one'}; a run "
                        "again (context_from) reuses only your own experiments' contexts "
                        "(an admin's: anyone's); upload the context instead")
    if not source.is_dir():
        raise Conflict(f"experiment {experiment_id}'s context snapshot is gone ({source}); "
                       "upload the context again")
    context.parent.mkdir(parents=True, exist_ok=True)
    try:
        shutil.copytree(source, context, symlinks=True, copy_function=_link_or_copy)
    except (OSError, shutil.Error) as exc:
        raise Conflict(f"experiment {experiment_id}'s context snapshot could not be reused "
                       f"({exc}); upload the context again") from exc
    return source_uuid


def _check_copies(configs: int, context: Path) -> None:
    """Refuse a batch whose snapshots, one per config, would hold more than
    MAX_ENTRIES_PER_CREATE files and directories together (checked once the first is made,
    before any copy: each copy costs an inode per directory and an entry per file).

    Raises:
        PayloadTooLarge: past the limit; the message says how many configs would fit.
    """
    entries = sum(len(dirs) + len(files) for _, dirs, files in os.walk(context))
    if configs * entries > MAX_ENTRIES_PER_CREATE:
        raise PayloadTooLarge(
            f"{configs} configs sharing a context of {entries:,} files and directories would "
            f"make {configs * entries:,} of them on the server (a snapshot per experiment), "
            f"over the limit of {MAX_ENTRIES_PER_CREATE:,} per request; send at most "
            f"{MAX_ENTRIES_PER_CREATE // entries} configs per request with this context, or "
            "keep data sets and environments out of it and read them by path")


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def _check_account(store: Store, run_as: RunAs, owner: Principal) -> Account:
    """The account `owner`'s jobs run as (it must exist)."""
    with store.session_scope() as s:
        unix_user = s.get_one(User, owner.user_id).unix_user
    return run_as.account_for(owner.name, unix_user)


def _keep_environment(home: Home, config: ExperimentConfig, context: Path, source: str,
                      owner: Principal, account: Account | None,
                      allowed: Allowances, runtime: RuntimeBase) -> str | None:
    """The hash of the environment the experiment's trials need built (by `account`, the
    one they run as under `run_as`; its request kept for the build; based on `runtime`
    unless `environment.python` names a base), or None. The base interpreter (asked as
    `account`), the requirements file and, for a user who is not an admin, the places the
    requirement lines fetch from (`environments.sources`) are checked now, with their key
    paths."""
    try:
        if not owner.is_admin:
            problems = package_source_problems(config, context, allowed.package_sources)
            if problems:
                raise config_error(source, problems)
        request = build_request(config, context, account, runtime=runtime)
    except RequestError as exc:
        raise config_error(source, [str(exc)]) from exc
    return None if request is None else keep_request(EnvHome(home.envs_dir), request)


def _insert_experiments(submission: Submission, owner: Principal, made: Sequence[_Prepared],
                        claim: idempotency.Claim | None, drill: DrillMark | None = None
                        ) -> list[int]:
    """The experiments, each with its trial unless a searcher draws its trials (the
    orchestrator does, from its next pass on), in one transaction; the trials that may
    start at once (`admitting`) are admitted in it too, and the `claim`'s key recorded
    (first: a create that lost the race to it stops before inserting anything). The
    owner's queued trials are counted against their quotas in it, under a lock."""
    # The admission's lock is held until the transaction has committed (the inner `with`).
    best = min(prepared.config.resources.priority for prepared in made)
    with submission.admitting(best) as admit, submission.store.session_scope() as s:
        key = None if claim is None else idempotency.record(s, claim)
        _check_queued(s, submission.quotas, owner, len(made))
        inserted = [_insert_experiment(s, owner, prepared, submission.sources, drill)
                    for prepared in made]
        if admit is not None:  # in the queue's order, as the pass would
            trials = [trial for _, trial in inserted if trial is not None]
            for trial in sorted(trials, key=lambda t: (t.priority, t.id)):
                admit(s, trial)
        ids = [experiment_id for experiment_id, _ in inserted]
        if key is not None:
            key.experiment_ids = ids
        return ids


def _check_queued(s: Session, quotas: QuotasConfig, owner: Principal, adding: int) -> None:
    """Raise QuotaExceeded when `adding` more queued trials would pass a `max_queued_trials`
    of `owner`'s (their own quota's, or a group's); the rows stay locked until `s` ends."""
    refused = lock_and_refuse_queued(s, read_book(s, quotas), owner.user_id, adding)
    if refused is not None:
        raise QuotaExceeded(refused)


def _insert_experiment(s: Session, owner: Principal, prepared: _Prepared,
                       sources: SourceResolver | None, drill: DrillMark | None = None
                       ) -> tuple[int, Trial | None]:
    config = prepared.config
    exp = Experiment(
        uuid=prepared.uuid, name=config.name, description=config.description,
        labels=list(config.labels), config=config.to_json_dict(), config_yaml=prepared.text,
        context_dir=str(prepared.context), state=ExperimentState.ACTIVE,
        priority=config.resources.priority, max_trials=config.trial_count(),
        environment_key=prepared.environment, owner_id=owner.user_id,
    )
    if drill is not None:
        exp.drill_id, exp.drill_fault, exp.drill_fs_bytes = (drill.drill_id, drill.run,
                                                            drill.fs_bytes)
    warm_start = _warm_start(s, sources, config, prepared.source)
    if warm_start is not None:  # resolved in this transaction: GC keeps it from its commit
        exp.source_checkpoint_id, exp.source = warm_start.checkpoint_id, dict(warm_start.view)
    s.add(exp)
    s.flush()
    searcher = config.searcher.name
    record_event(s, entity="experiment", entity_id=exp.id, reason=EventReason.CREATED,
                 actor=owner.name, message=f"experiment {exp.name!r} created"
                 + (f"; the {searcher} searcher runs {count(exp.max_trials, 'trial')}"
                    if searcher != "single" else ""), experiment_id=exp.id)
    if prepared.translation is not None:
        _record_translation(s, exp, prepared.translation, owner.name)
    if searcher == "single":
        trial = Trial(uuid=str(uuid.uuid4()), experiment=exp,
                      state=TrialState.QUEUED, priority=exp.priority,
                      hparams=config.space().hparams({}))
        s.add(trial)
        s.flush()
        record_event(s, entity="trial", entity_id=trial.id, reason=EventReason.CREATED,
                     actor=owner.name, message="trial queued", experiment_id=exp.id,
                     trial_id=trial.id)
        return exp.id, trial
    return exp.id, None


def _check_warm_start(submission: Submission, config: ExperimentConfig, source: str) -> None:
    """Refuse a warm start from a checkpoint muster does not hold intact, before any work
    (the create's transaction resolves it again, for good)."""
    if config.searcher.warm_start() is not None:
        with submission.store.session_scope() as s:
            _warm_start(s, submission.sources, config, source)


def _warm_start(s: Session, sources: SourceResolver | None, config: ExperimentConfig,
                source: str) -> WarmStart | None:
    named = config.searcher.warm_start()
    if named is None:
        return None
    if sources is None:
        raise config_error(source, [f"searcher.{named[0]}: this submission resolves no warm "
                                    "starts (a PlainSubmission without `sources`)"])
    return sources(s, config.searcher, source)


def _record_translation(s: Session, exp: Experiment, translation: Translation,
                        actor: str) -> None:
    """An event per key of the Determined config the experiment was submitted as: what it
    became, or why muster does without it (those show as the experiment's warnings)."""
    for reason, lines in ((EventReason.DETERMINED_KEY_MAPPED, translation.mapped),
                          (EventReason.DETERMINED_KEY_IGNORED, translation.ignored)):
        for line in lines:
            record_event(s, entity="experiment", entity_id=exp.id, reason=reason, actor=actor,
                         message=f"Determined's {line}", experiment_id=exp.id)


def list_experiments(store: Store, owner: str | None = None
                     ) -> list[api.ExperimentSummary]:
    """Every experiment (of `owner`, when named), oldest first (`listing.list_page` pages,
    sorts and filters).

    Raises:
        NotFound: there is no user `owner`.
    """
    return listing.list_page(store, listing.ExperimentFilter(owner=owner)).rows


def describe_experiment(store: Store, experiment_id: int,
                        part_of: TrialPartOf | None = None,
                        window: TrialWindow = FIRST_TRIALS) -> api.ExperimentDetail:
    """The experiment with a page of its trials (`experiment_view`: by default the first
    `DESCRIBE_TRIALS`), each with its `snapshot` from `part_of` (null without it)."""
    with store.session_scope() as s:
        return experiment_view(s, experiment_or_404(s, experiment_id), part_of, window)


def describe_experiments(store: Store, experiment_ids: Sequence[int]
                         ) -> list[api.ExperimentDetail]:
    """`describe_experiment` of each, in one transaction (a batch create's answer)."""
    with store.session_scope() as s:
        return [experiment_view(s, experiment_or_404(s, experiment_id), None)
                for experiment_id in experiment_ids]


def experiment_overview(store: Store, experiment_id: int) -> views.ExperimentOverview:
    """`describe_experiment` without `trials`: its summary, config, search progress and
    warnings, read without any trial's attempts (a page of a search of thousands of
    trials shows those a page at a time, `search.trial_page`)."""
    with store.session_scope() as s:
        return _overview(s, experiment_or_404(s, experiment_id))[0]


def _overview(s: Session, exp: Experiment
              ) -> tuple[views.ExperimentOverview, dict[int, api.TrialProgress]]:
    """`experiment_overview` in `s`, and its RUNNING trials' progress by id."""
    # Its trials as the few columns the summary reads, not as ORM rows (the page polls this
    # for searches of thousands of trials); its RUNNING ones whole, for their progress.
    trials = views.tally(s, exp.id)
    running = s.scalars(select(Trial).where(Trial.experiment_id == exp.id,
                                            Trial.state == TrialState.RUNNING)).all()
    searcher = experiment_searcher(exp)
    best = best_validation(s, [t.id for t in trials if t.state is TrialState.SUCCEEDED],
                           views.searcher_goals(searcher))
    views.with_hparams(s, views.best_trial_of(trials, best, searcher))
    measured = progress.of_running(s, running)
    return views.experiment_overview(exp, best, _warnings(s, exp.id), measured,
                                     trials), measured


def experiment_config_text(store: Store, experiment_id: int) -> str:
    """The config an experiment was submitted with, verbatim (a drill runs it again).

    Raises:
        NotFound: no experiment has that id.
    """
    with store.session_scope() as s:
        return experiment_or_404(s, experiment_id).config_yaml


def experiment_header(store: Store, experiment_id: int) -> ExperimentHeader:
    """What a trial's page says of its experiment: `{id, name, state, owner}`, without
    reading its trials."""
    with store.session_scope() as s:
        exp = experiment_or_404(s, experiment_id)
        return {"id": exp.id, "name": exp.name, "state": exp.state, "owner": exp.owner_name}


def describe_trial(store: Store, trial_id: int,
                   part_of: TrialPartOf | None = None) -> api.TrialDescription:
    """The trial, its attempts, `best_validation` and events, its `snapshot` from
    `part_of` (null without it), its `progress` while RUNNING, and its replicas'
    `resources` (`muster.services.resources`)."""
    with store.session_scope() as s:
        trial = trial_or_404(s, trial_id)
        goals = views.searcher_goals(experiment_searcher(trial.experiment))
        view = views.trial_detail(trial, best_validation(s, [trial.id], goals).get(trial.id, {}),
                                  None if part_of is None else part_of(trial),
                                  progress.of_running(s, [trial]).get(trial.id))
        events = s.scalars(select(Event).where(Event.trial_id == trial_id).order_by(Event.id))
        numbers = {a.id: a.number for a in trial.attempts}
        return api.TrialDescription(**view, events=[views.event_view(e, numbers)
                                                    for e in events],
                                    resources=replica_resources(s, trial_id))


def trial_progress(store: Store, trial_id: int) -> TrialProgressPoll:
    """`{id, state, progress}` of a trial: what its page polls while it runs, without its
    attempts' details or events.

    Raises:
        NotFound: there is no such trial.
    """
    with store.session_scope() as s:
        trial = trial_or_404(s, trial_id)
        return {"id": trial.id, "state": trial.state,
                "progress": progress.of_running(s, [trial]).get(trial.id)}


def kill_experiment(store: Store, principal: Principal, experiment_id: int
                    ) -> api.ExperimentDetail:
    """Ask every trial to stop. Queued trials end at once; running ones through the
    supervisor (SIGTERM, grace, SIGKILL). Killing twice is harmless.

    Raises:
        Forbidden: it is not the caller's (and the caller is no admin).
        Conflict: it has ended.
    """
    with store.session_scope() as s:
        exp = experiment_or_404(s, experiment_id)
        authorize_on(principal, Action.KILL, exp)
        if exp.state.is_terminal():
            raise Conflict(f"experiment {experiment_id} is already {exp.state}; nothing to kill")
        if not exp.stop_requested:
            exp.stop_requested = True
            record_event(s, entity="experiment", entity_id=exp.id,
                         reason=EventReason.KILL_REQUESTED, actor=principal.name,
                         message="stopping every trial", experiment_id=exp.id)
        for trial in exp.trials:
            stop_trial(s, trial, principal.name)
        return experiment_view(s, exp)


def pause_experiment(store: Store, principal: Principal, experiment_id: int
                     ) -> api.ExperimentDetail:
    """Pause an ACTIVE experiment: queued trials become PAUSED at once; running ones are
    stopped by the supervisor (SIGTERM and `stop_grace`, so the harness's `should_stop()`
    lets them checkpoint), their resources freed, and they end PAUSED. Pausing a paused
    experiment is harmless.

    Raises:
        Forbidden: it is not the caller's (and the caller is no admin).
        Conflict: the experiment has ended (or is being killed).
    """
    with store.session_scope() as s:
        exp = experiment_or_404(s, experiment_id)
        authorize_on(principal, Action.PAUSE, exp)
        if exp.state is ExperimentState.PAUSED:
            return experiment_view(s, exp)
        if exp.state is not ExperimentState.ACTIVE or exp.stop_requested:
            raise Conflict(f"experiment {experiment_id} is {_state_words(exp)}; only an "
                           "ACTIVE experiment can be paused")
        transition(s, exp, ExperimentState.PAUSED, reason=EventReason.PAUSED,
                   actor=principal.name,
                   message="pausing every trial; `muster experiment activate` resumes them")
        for trial in exp.trials:
            if trial.state is TrialState.QUEUED:
                transition(s, trial, TrialState.PAUSED, reason=EventReason.PAUSED,
                           actor=principal.name, message="paused before it started")
            elif trial.state.is_active() and not trial.stop_requested:
                trial.stop_intent = trial.stop_intent or StopIntent.PAUSE
        return experiment_view(s, exp)


def activate_experiment(store: Store, principal: Principal, experiment_id: int
                        ) -> api.ExperimentDetail:
    """Resume a PAUSED experiment: its PAUSED trials go back to the queue and resume from
    their latest checkpoints; trials still being paused are requeued as soon as they have
    stopped. Activating an active experiment is harmless.

    Raises:
        Forbidden: it is not the caller's (and the caller is no admin).
        Conflict: the experiment has ended (or is being killed).
    """
    with store.session_scope() as s:
        exp = experiment_or_404(s, experiment_id)
        authorize_on(principal, Action.ACTIVATE, exp)
        if exp.state is ExperimentState.ACTIVE and not exp.stop_requested:
            return experiment_view(s, exp)
        if exp.state is not ExperimentState.PAUSED or exp.stop_requested:
            raise Conflict(f"experiment {experiment_id} is {_state_words(exp)}; only a "
                           "PAUSED experiment can be activated")
        transition(s, exp, ExperimentState.ACTIVE, reason=EventReason.ACTIVATED,
                   actor=principal.name, message="requeuing its paused trials")
        for trial in exp.trials:
            if trial.state is TrialState.PAUSED:
                transition(s, trial, TrialState.QUEUED, reason=EventReason.ACTIVATED,
                           actor=principal.name,
                           message="back in the queue; it resumes from its latest checkpoint")
        return experiment_view(s, exp)


def _state_words(exp: Experiment) -> str:
    return "being killed" if exp.stop_requested and not ExperimentState(
        exp.state).is_terminal() else exp.state


def review_trial(
    store: Store, reviewer: Principal, trial_id: int, decision: str, note: str
) -> api.TrialDescription:
    """A person's verdict on a SUSPECT trial: "approve" → SUCCEEDED, "reject" → FAILED.

    The only way out of SUSPECT (invariant 3); the event records the authenticated reviewer
    as the actor and the note as its message. Returns the trial as `describe_trial`.

    Raises:
        InvalidRequest: an unknown decision or an empty note.
        Forbidden: the trial is not the reviewer's (and the reviewer is no admin).
        Conflict: the trial is not SUSPECT.
    """
    to_state, reason = _review_move(decision)
    note = note.strip()
    if not note:
        raise InvalidRequest("a review needs a note that says why; the note is empty")
    with store.session_scope() as s:
        trial = trial_or_404(s, trial_id)
        authorize_on(reviewer, Action.REVIEW, trial.experiment, f"trial {trial_id}")
        s.refresh(trial, with_for_update=True)  # a second review waits, then sees the first
        if trial.state is not TrialState.SUSPECT:
            raise Conflict(f"trial {trial_id} is {trial.state}; only a SUSPECT trial (one that "
                           "exited 0 but failed a verification) can be reviewed")
        transition(s, trial, to_state, reason=reason, actor=reviewer.name, message=note)
    return describe_trial(store, trial_id)


def authorize_on(principal: Principal, action: Action, exp: Experiment,
                 subject: str | None = None) -> None:
    """`authorize` for an action on `exp` (or on `subject`, one of its trials)."""
    what = subject or f"experiment {exp.id}"
    if subject is not None:
        what += f" (experiment {exp.id})"
    authorize(principal, action, owner=exp.owner_name, subject=what)


def _review_move(decision: str) -> tuple[TrialState, EventReason]:
    try:
        return REVIEW_DECISIONS[decision]
    except KeyError:
        raise InvalidRequest(f"decision must be one of {', '.join(REVIEW_DECISIONS)}, "
                             f"got {decision!r}") from None


def stop_trial(s: Session, trial: Trial, actor: str) -> None:
    """Ask `trial` to stop for good (`Trial.stop_requested`): one without a process (QUEUED,
    PAUSED) is CANCELED at once; the supervisor stops a running one."""
    if trial.state.is_terminal():
        return
    trial.stop_requested = True
    if trial.state in (TrialState.QUEUED, TrialState.PAUSED):
        words = ("before it started" if trial.state is TrialState.QUEUED and not trial.attempts
                 else f"while it was {trial.state}")
        transition(s, trial, TrialState.CANCELED, reason=EventReason.KILLED, actor=actor,
                   message=f"killed {words}")


def experiment_view(s: Session, exp: Experiment, part_of: TrialPartOf | None = None,
                    window: TrialWindow = FIRST_TRIALS) -> api.ExperimentDetail:
    """`views.experiment_detail`: the overview (read from every trial's summary columns) and
    the trials in `window` whole, with their `best_validation` read from the store, their
    snapshots from `part_of` (at most `DESCRIBE_TRIALS`), and the warnings the supervisor
    recorded (`warnings`: a metric no trial reports, a search that stopped drawing)."""
    overview, measured = _overview(s, exp)
    goals = views.searcher_goals(experiment_searcher(exp))
    page = list(s.scalars(
        select(Trial).where(Trial.experiment_id == exp.id).order_by(Trial.id)
        .offset(window.offset).limit(window.limit)
        .options(selectinload(Trial.attempts).selectinload(Attempt.replicas))))
    parts = {} if part_of is None else {t.id: part_of(t) for t in page}
    return views.experiment_detail(
        overview, page, best_validation(s, [t.id for t in page], goals), parts, measured,
        offset=window.offset)


def _warnings(s: Session, experiment_id: int) -> list[str]:
    return list(s.scalars(select(Event.message).where(
        Event.experiment_id == experiment_id, Event.entity == "experiment",
        Event.reason.in_(WARNING_REASONS)).order_by(Event.id)))


def experiment_or_404(s: Session, experiment_id: int) -> Experiment:
    exp = s.get(Experiment, experiment_id)
    if exp is None:
        raise NotFound(f"experiment {experiment_id} does not exist; `muster experiment list` "
                       "shows the experiments there are")
    return exp


def trial_or_404(s: Session, trial_id: int) -> Trial:
    trial = s.get(Trial, trial_id)
    if trial is None:
        raise NotFound(f"trial {trial_id} does not exist; `muster experiment describe ID` "
                       "lists an experiment's trials")
    return trial
