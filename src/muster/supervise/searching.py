"""The supervisor's search step: create each search's next trials, and stop the ones its
pruner gives up on.

A search experiment (any searcher but `single`) starts with no trial. Each pass tops it up:
while fewer than `max_concurrent_trials` of its trials are unfinished and fewer than
`max_trials` exist, the searcher draws trial N (N = trials so far) from a study rebuilt
from the store (`muster.search.base`), and the trial is committed with its values before
anything runs it. The unique (experiment, number) index makes a second draw of N after a
restart impossible, so a search ends with exactly `max_trials` trials. Every search with room
is topped up, one of `max_trials: 1` too (it has no trial until its draw); an experiment that
has no trial and cannot draw one (a single experiment that lost its trial) says so with a
`search stopped` event, which ends it ERROR: none waits for ever in silence.

A search draws no trial while its owner has as many trials QUEUED as a quota of theirs
allows (`max_queued_trials`, `muster.schedule.quotas`): it draws again once some have
started or ended. The count and the draw share a transaction and the lock a create takes.

A search whose first `max(3, max_concurrent_trials)` trials all ended FAILED with
PERMANENT_ERROR, none succeeding, draws no more (a `search stopped` event with their common
message; the experiment then ends ERROR once its trials have ended): the same mistake would
fail every trial it has left. A search none of whose ended trials reported its metric,
although one succeeded, gets a `metric missing` warning once, which the experiment shows.

After a running trial's metrics are ingested, each new validation value of the searcher's
metric (rank 0's) is shown to the pruner in step order. When it says stop, the trial is
marked (`StopIntent.EARLY_STOP`, with an event that says why); the next pass
stops its replicas like a pause (SIGTERM, `stop_grace`, so `should_stop()` lets it
checkpoint), and it ends SUCCEEDED with `early_stopped: true`: not a failure, not a restart.
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session, aliased

from muster.config import ExperimentConfig
from muster.config.quotas import QuotasConfig
from muster.config.schema import SearcherConfig
from muster.config.space import Scalar
from muster.schedule.quota_book import lock_and_refuse_queued, read_book
from muster.search.history import Lineage, NothingToDraw, PastTrial
from muster.search.history import trial_seed as seed_for
from muster.states import (
    CheckpointState,
    EventReason,
    ExperimentState,
    MetricKind,
    Reason,
    SearchOutcome,
    StopIntent,
    TrialState,
)
from muster.store import (
    Checkpoint,
    Event,
    Experiment,
    Metric,
    Store,
    Trial,
    record_event,
    series,
)
from muster.store.actors import SEARCHER
from muster.store.configs import experiment_config
from muster.supervise.isolation import Isolation
from muster.words import count

if TYPE_CHECKING:
    from muster.search.base import Searcher

log = logging.getLogger(__name__)

ACTOR = SEARCHER
GIVE_UP_AFTER = 3  # at least this many first trials failing alike stop a search
_SHOWN_PARAMS = 6  # values named in a new trial's event


def searches(config: ExperimentConfig) -> bool:
    """Whether the experiment's trials come from a searcher (not the single trial created
    with the experiment)."""
    return config.searcher.name != "single"


def experiment_seed(experiment: Experiment, config: ExperimentConfig) -> int:
    """`reproducibility.experiment_seed`, or one fixed by the experiment's uuid: stable across
    restarts either way."""
    seed = config.reproducibility.experiment_seed
    return seed if seed is not None else int(experiment.uuid.replace("-", "")[:8], 16)


def trial_seed(experiment: Experiment, config: ExperimentConfig, number: int) -> int | None:
    """MUSTER_SEED for trial `number`: set only when the config names an experiment seed."""
    seed = config.reproducibility.experiment_seed
    return None if seed is None else seed_for(seed, number) % 2**31


@dataclass
class Searching:
    store: Store
    isolation: Isolation
    quotas: QuotasConfig = field(default_factory=QuotasConfig)  # the cluster config's

    def top_up(self) -> None:
        """Draw the next trials of every active search that has room for them."""
        created = func.count(Trial.id)
        # A search of max_trials 1 has no trial until its one draw; a single experiment has
        # its trial from the start, so an index lookup leaves it out.
        other = aliased(Trial)
        no_trial = ~select(other.id).where(other.experiment_id == Experiment.id).exists()
        with self.store.session_scope() as s:
            rows = s.execute(
                select(Experiment.id).outerjoin(Trial, Trial.experiment_id == Experiment.id)
                .where(Experiment.state == ExperimentState.ACTIVE,
                       Experiment.stop_requested.is_(False),
                       (Experiment.max_trials > 1) | no_trial)
                .group_by(Experiment.id, Experiment.max_trials)
                .having(created < Experiment.max_trials)).scalars().all()
        for experiment_id in rows:
            with self.isolation.experiment(experiment_id, "drawing its next trial"):
                self._top_up(experiment_id)

    def _top_up(self, experiment_id: int) -> None:
        while True:
            with self.store.session_scope() as s:
                experiment = s.get_one(Experiment, experiment_id)
                config = experiment_config(experiment)
                if not searches(config):
                    _nothing_to_draw(s, experiment)
                    return
                trials = list(s.scalars(select(Trial).where(
                    Trial.experiment_id == experiment_id).order_by(Trial.number)))
                unfinished = sum(t.state.is_unfinished() for t in trials)
                if (len(trials) >= experiment.max_trials
                        or unfinished >= config.searcher.max_concurrent_trials
                        or _gave_up(s, experiment, trials, config)
                        or self._queue_full(s, experiment.owner_id)):
                    return
                number = len(trials)
                searcher = _searcher(experiment, config)
                if any(not trials[n].state.is_at_rest() for n in searcher.must_end_first(number)):
                    return  # (PBT: the generation before has not ended yet)
                history = _history(s, trials, config, searcher.continues)
                warn_if_metric_missing(s, experiment, trials, config, history)
                try:
                    draw = searcher.draw(history, number)
                except NothingToDraw as exc:
                    _stop_drawing(s, experiment, str(exc))
                    return
                state: dict[str, Any] = {"params": draw.params, "attrs": draw.attrs}
                if draw.lineage is not None:
                    state["pbt"] = _lineage_record(s, draw.lineage, trials)
                trial = Trial(experiment=experiment, number=number,
                              state=TrialState.QUEUED, priority=experiment.priority,
                              hparams=searcher.space.hparams(draw.params),
                              search_state=state,
                              source_checkpoint_id=(draw.lineage.checkpoint
                                                    if draw.lineage is not None else None))
                s.add(trial)
                s.flush()
                record_event(s, entity="trial", entity_id=trial.id, reason=EventReason.CREATED,
                             actor=ACTOR, experiment_id=experiment_id, trial_id=trial.id,
                             message=f"trial {number + 1} of {experiment.max_trials} drawn by "
                                     f"{config.searcher.name}: {_shown(draw.params)}"
                                     + _lineage_note(draw.lineage, trials))

    def _queue_full(self, s: Session, owner_id: int | None) -> bool:
        """Whether one more QUEUED trial of the owner's would pass a `max_queued_trials` of
        theirs (checked under the lock a create takes, until this transaction ends)."""
        return owner_id is not None and lock_and_refuse_queued(
            s, read_book(s, self.quotas), owner_id, 1) is not None

    def judge(self, trial_id: int) -> bool:
        """Show the pruner the trial's new validation values; mark it for an early stop
        when the pruner says so. True when it is marked now.

        A value at `max_length` or beyond is not judged: the trial has done all the
        training the search gives it, and stopping it would only cut its teardown.
        """
        with self.store.session_scope() as s:
            trial = s.get_one(Trial, trial_id)
            if trial.state is not TrialState.RUNNING or trial.intent is not None:
                return False
            experiment = trial.experiment
            config = experiment_config(experiment)
            searcher = _searcher(experiment, config) if searches(config) else None
            if searcher is None or not searcher.prunes:
                return False
            metric, length = config.searcher.metric, config.searcher.max_length
            assert metric is not None and length is not None, "checked by SearcherConfig"
            state = dict(trial.search_state or {})
            judged = int(state.get("judged_step", -1))
            values = _validation(s, [trial.id], config.searcher).get(trial.id, {})
            new = sorted(step for step in values if judged < step < length)
            if not new:
                return False
            trials = list(s.scalars(select(Trial).where(
                Trial.experiment_id == experiment.id).order_by(Trial.number)))
            others = _history(s, [t for t in trials if t.id != trial.id], config)
            for step in new:
                seen = {k: v for k, v in values.items() if k <= step}
                me = PastTrial(trial.number, SearchOutcome.RUNNING, state.get("params", {}),
                               intermediate=seen, attrs=state.get("attrs", {}))
                verdict = searcher.judge(sorted([*others, me], key=lambda p: p.number),
                                         trial.number)
                state["attrs"], state["judged_step"] = verdict.attrs, step
                if verdict.prune:
                    clock = config.searcher.time_metric
                    state["early_stop"] = {
                        "rung": verdict.rung, "value": values[step],
                        "step": step if clock is None else _step_at(s, trial.id, clock, step),
                        "time": None if clock is None else step}
                    trial.stop_intent = StopIntent.EARLY_STOP
                    record_event(s, entity="trial", entity_id=trial.id,
                                 reason=EventReason.EARLY_STOP,
                                 actor=ACTOR, experiment_id=experiment.id, trial_id=trial.id,
                                 message=_early_stop_message(config, verdict.rung, step,
                                                             values[step]))
                    break
            trial.search_state = state
            return trial.intent is StopIntent.EARLY_STOP


def _gave_up(s: Session, experiment: Experiment, trials: Sequence[Trial],
             config: ExperimentConfig) -> bool:
    """True when the search draws no more: its first trials all failed alike (noted once,
    with an event that the experiment's end repeats)."""
    if stopped_drawing(s, experiment.id) is not None:
        return True
    first = streak_of_permanent_errors(trials, config)
    if first is None:
        return False
    message, times = Counter(t.message or "" for t in first).most_common(1)[0]
    common = (f"all with: {message}" if times == len(first)
              else f"most often ({times} of {len(first)}): {message}")
    record_event(s, entity="experiment", entity_id=experiment.id,
                 reason=EventReason.SEARCH_STOPPED, actor=ACTOR, experiment_id=experiment.id,
                 message=f"the first {len(first)} trials all failed with PERMANENT_ERROR and "
                         f"none succeeded, so the search draws no more; {common}")
    return True


def _stop_drawing(s: Session, experiment: Experiment, why: str) -> None:
    """The searcher can draw no more (`NothingToDraw`): say why once, which ends the
    experiment ERROR once its trials have ended (`experiments.Closing`)."""
    if stopped_drawing(s, experiment.id) is None:
        record_event(s, entity="experiment", entity_id=experiment.id,
                     reason=EventReason.SEARCH_STOPPED, actor=ACTOR,
                     experiment_id=experiment.id, message=f"the search draws no more: {why}")


def _lineage_record(s: Session, lineage: Lineage, trials: Sequence[Trial]) -> dict[str, Any]:
    """A PBT trial's lineage as its `search_state` keeps it (`views.lineage_view` reads it):
    the searcher's, with the ids of the trials it names and its parent's checkpoint as it is
    now (GC may remove that checkpoint once this trial has saved its own)."""
    record = lineage.to_json()
    if lineage.parent is not None:
        record["parent_trial_id"] = trials[lineage.parent].id
    if lineage.replaces is not None:
        record["replaces_trial_id"] = trials[lineage.replaces].id
    row = s.get(Checkpoint, lineage.checkpoint) if lineage.checkpoint is not None else None
    if row is not None:
        record.update(checkpoint_uuid=row.uuid, checkpoint_name=row.name,
                      checkpoint_step=row.step)
    return record


def _lineage_note(lineage: Lineage | None, trials: Sequence[Trial]) -> str:
    """What a PBT trial's creation adds: its generation, and whose checkpoint it starts from."""
    if lineage is None:
        return ""
    if lineage.parent is None:
        return f"; generation {lineage.generation}"
    parent = trials[lineage.parent]
    if lineage.action == "continue":
        return (f"; generation {lineage.generation}, continues trial {parent.id} "
                f"(number {parent.number}) from its checkpoint")
    assert lineage.replaces is not None
    changed = ", ".join(f"{key} {_short(old)} -> {_short(new)}"
                        for key, (old, new) in lineage.changed.items()) or "no value changed"
    return (f"; generation {lineage.generation}, replaces trial {trials[lineage.replaces].id} "
            f"and copies trial {parent.id}'s checkpoint (exploit), explored: {changed}")


def _nothing_to_draw(s: Session, experiment: Experiment) -> None:
    """A single experiment without its trial (it is made with the experiment; a store
    edited by hand, or a bug, lost it): say so once, which ends the experiment ERROR
    (`experiments.Closing`) rather than leaving it ACTIVE with nothing to run."""
    if stopped_drawing(s, experiment.id) is None:
        record_event(s, entity="experiment", entity_id=experiment.id,
                     reason=EventReason.SEARCH_STOPPED, actor=ACTOR,
                     experiment_id=experiment.id,
                     message="the experiment has no trial, and its single searcher draws "
                             "none: nothing is left to run; submit it again")


def streak_of_permanent_errors(trials: Sequence[Trial], config: ExperimentConfig
                               ) -> list[Trial] | None:
    """The first `max(3, max_concurrent_trials)` trials to end, when every one of them ended
    FAILED with PERMANENT_ERROR and no trial succeeded; else None.

    The first to *end*, not the lowest numbers: a slow trial 2 must not let trials 3, 4, ...
    fail one after another, each freeing a slot for yet another draw, while the search waits
    on it. So at most `needed - 1 + max_concurrent_trials` trials are ever drawn."""
    needed = max(GIVE_UP_AFTER, config.searcher.max_concurrent_trials)
    if any(t.state == TrialState.SUCCEEDED for t in trials):
        return None
    ended = sorted((t for t in trials if t.state.is_terminal()),
                   key=lambda t: (t.ended_at if t.ended_at is not None else float("inf"),
                                  t.number))
    first = ended[:needed]
    if len(first) == needed and all(t.state == TrialState.FAILED
                                    and t.reason == Reason.PERMANENT_ERROR for t in first):
        return sorted(first, key=lambda t: t.number)
    return None


def stopped_drawing(s: Session, experiment_id: int) -> str | None:
    """Why the search stopped drawing trials (its `search stopped` event), if it did."""
    return s.scalars(select(Event.message).where(
        Event.experiment_id == experiment_id, Event.reason == EventReason.SEARCH_STOPPED)
        .limit(1)).first()


def warn_if_metric_missing(s: Session, experiment: Experiment, trials: Sequence[Trial],
                           config: ExperimentConfig, history: Sequence[PastTrial]) -> None:
    """Warn once when trials succeed without reporting the searcher's metric: the search
    then compares nothing (a misspelt `searcher.metric`, or a script that reports another)."""
    metric = config.searcher.metric
    succeeded = [t for t in trials if t.state == TrialState.SUCCEEDED and not t.early_stopped]
    if metric is None or not succeeded or any(p.intermediate for p in history):
        return
    if s.scalars(select(Event.id).where(
            Event.experiment_id == experiment.id,
            Event.reason == EventReason.METRIC_MISSING).limit(1)).first() is not None:
        return
    ended = sum(t.state.is_terminal() for t in trials)
    record_event(s, entity="experiment", entity_id=experiment.id,
                 reason=EventReason.METRIC_MISSING, actor=ACTOR, experiment_id=experiment.id,
                 message=f"none of the {count(ended, 'ended trial')} reported the searcher's "
                         f"metric {metric!r} ({count(len(succeeded), 'succeeded', 'succeeded')}"
                         f" without it), so the search cannot compare them: check "
                         f"searcher.metric against the names the script passes to "
                         f"report_validation")


def is_search(experiment: Experiment) -> bool:
    """Whether the experiment's trials come from a searcher, read from its stored config
    without validating it (the closing pass asks this of every experiment it ends)."""
    searcher = experiment.config.get("searcher") if isinstance(experiment.config, dict) else None
    return isinstance(searcher, dict) and searcher.get("name", "single") != "single"


def note_search_end(s: Session, experiment: Experiment) -> None:
    """What a search's end adds: the missing-metric warning, if its last trials ended
    after its last draw."""
    config = experiment_config(experiment)
    if searches(config):
        trials = list(experiment.trials)
        warn_if_metric_missing(s, experiment, trials, config, _history(s, trials, config))


def early_stop_note(trial: Trial) -> str:
    """How an early-stopped trial's end reads."""
    stop = (trial.search_state or {}).get("early_stop") or {}
    where = f" at step {stop['step']}" if "step" in stop else ""
    return f"stopped early by the searcher{where}; its results up to there count"


def _searcher(experiment: Experiment, config: ExperimentConfig) -> Searcher:
    # Optuna is imported with the first search, not at server start-up.
    from muster.search.searchers import searcher_for

    return searcher_for(config, experiment_seed(experiment, config))


def _history(s: Session, trials: Sequence[Trial], config: ExperimentConfig,
             checkpoints: bool = False) -> list[PastTrial]:
    """The experiment's trials as the searcher sees them (by number); with `checkpoints`,
    each with its latest intact checkpoint (a searcher that `continues` from them)."""
    ids = [t.id for t in trials]
    values = _validation(s, ids, config.searcher)
    ended = (series.final_values(s, ids, [o.name for o in config.searcher.objectives()])
             if config.searcher.multi_objective() else None)
    latest = _latest_checkpoints(s, ids) if checkpoints else {}
    return [replace(_past(t, values.get(t.id, {}),
                          None if ended is None else ended.get(t.id, {}),
                          [o.name for o in config.searcher.objectives()]),
                    checkpoint=latest.get(t.id))
            for t in sorted(trials, key=lambda t: t.number)]


def _latest_checkpoints(s: Session, trial_ids: Sequence[int]) -> dict[int, int]:
    """Each trial's latest intact checkpoint that is still there (by step, then as saved):
    trial id -> checkpoint id."""
    latest: dict[int, int] = {}
    if not trial_ids:
        return latest
    rows = s.execute(select(Checkpoint.trial_id, Checkpoint.id)
                     .where(Checkpoint.trial_id.in_(trial_ids), Checkpoint.intact.is_(True),
                            Checkpoint.state.not_in(CheckpointState.gone()))
                     .order_by(Checkpoint.step, Checkpoint.id))
    for trial_id, checkpoint_id in rows:
        latest[trial_id] = checkpoint_id
    return latest


def _past(trial: Trial, values: dict[int, float], ended: dict[str, float] | None = None,
          objectives: Sequence[str] = ()) -> PastTrial:
    """The trial as the searcher sees it: `values`, its metric's by step; `ended`, in a
    multi-objective search, each objective's value it ended with (by name)."""
    state = trial.search_state or {}
    finite = {step: v for step, v in values.items() if math.isfinite(v)}
    outcome = SearchOutcome.RUNNING
    value, all_values = None, None
    if trial.state is TrialState.SUCCEEDED and trial.early_stopped:
        outcome = SearchOutcome.PRUNED
    elif trial.state is TrialState.SUCCEEDED and ended is not None:
        # Every objective, each finite, or the trial teaches the search nothing.
        found = [ended.get(name) for name in objectives]
        numbers = [v for v in found if v is not None and math.isfinite(v)]
        if len(numbers) == len(objectives):
            outcome, all_values, value = SearchOutcome.COMPLETE, tuple(numbers), numbers[0]
        else:
            outcome = SearchOutcome.FAILED
    elif trial.state is TrialState.SUCCEEDED and values:
        value = values[max(values)]  # the value it ended with
        outcome = SearchOutcome.COMPLETE if math.isfinite(value) else SearchOutcome.FAILED
    elif trial.state is TrialState.CANCELED:
        outcome = SearchOutcome.CANCELED  # killed: its reports stand, but it has no result
    elif trial.state.is_at_rest():
        outcome = SearchOutcome.FAILED  # (a success without the metric teaches the search nothing)
    return PastTrial(trial.number, outcome, state.get("params", {}),
                     value if outcome is SearchOutcome.COMPLETE else None, finite,
                     state.get("attrs", {}), all_values)


def _validation(s: Session, trial_ids: Iterable[int], searcher: SearcherConfig
                ) -> dict[int, dict[int, float]]:
    """Rank 0's validation values of the searcher's metric by trial and step (a later
    attempt's value of a step replaces an earlier one's: the resumed run is what continued).
    With `time_metric`, a value's "step" is the whole part of that metric's value in the same
    report (a report without it is not counted), as Determined counts a trial's time."""
    ids = list(trial_ids)
    metric, clock = searcher.metric, searcher.time_metric
    if not ids or metric is None:
        return {}
    rows = s.execute(select(Metric.trial_id, Metric.step, Metric.values)
                     .where(Metric.trial_id.in_(ids), Metric.kind == MetricKind.VALIDATION,
                            Metric.rank == 0)
                     .order_by(Metric.attempt, Metric.id))
    found: dict[int, dict[int, float]] = {}
    for trial_id, step, values in rows:
        value = values.get(metric) if isinstance(values, dict) else None
        at = step if clock is None else _count(values.get(clock))
        if isinstance(value, int | float) and not isinstance(value, bool) and at is not None:
            found.setdefault(trial_id, {})[int(at)] = float(value)
    return found


def _step_at(s: Session, trial_id: int, clock: str, at: int) -> int:
    """The step of the trial's latest rank-0 validation report whose time metric `clock`
    counts `at` (where a searcher that counts time stopped it)."""
    rows = s.execute(select(Metric.step, Metric.values)
                     .where(Metric.trial_id == trial_id, Metric.kind == MetricKind.VALIDATION,
                            Metric.rank == 0)
                     .order_by(Metric.attempt.desc(), Metric.id.desc()))
    for step, values in rows:
        if isinstance(values, dict) and _count(values.get(clock)) == at:
            return int(step)
    return at  # (not reached: `at` was read from such a report in this transaction)


def _count(value: object) -> int | None:
    """A time metric's value as the searcher counts it: its whole part (finite, >= 0)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return int(value) if math.isfinite(value) and value >= 0 else None


def _shown(params: Mapping[str, Scalar]) -> str:
    shown = [f"{k}={_short(v)}" for k, v in list(params.items())[:_SHOWN_PARAMS]]
    more = len(params) - _SHOWN_PARAMS
    return ", ".join(shown) + (f" and {more} more" if more > 0 else "") or "(constants only)"


def _short(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else repr(value)


def _early_stop_message(config: ExperimentConfig, rung: int, step: int, value: float) -> str:
    searcher = config.searcher
    at = f"step {step}" if searcher.time_metric is None else f"{searcher.time_metric} {step}"
    if not math.isfinite(value):
        return (f"stopping it early: at {at} its {searcher.metric} is {value}; it ends "
                "SUCCEEDED with early_stopped, not as a failure")
    better = "lowest" if searcher.smaller_is_better else "highest"
    return (f"stopping it early: at {at} (rung {rung}) its {searcher.metric} "
            f"{_short(value)} is not among the {better} 1/{searcher.divisor} of the trials "
            f"that reached that rung; it ends SUCCEEDED with early_stopped, not as a failure")
