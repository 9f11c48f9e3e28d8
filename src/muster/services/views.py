"""The views of stored records: the shapes of `muster.api` the API returns and the CLI prints.

Pure mapping: a view reads the rows it is given (and what the service computed for them,
such as `best_validation`), never the database. Each view is built as its `muster.api`
shape, so mypy checks every key; field names are a fixed contract (see README "JSON
contract"): extend, never rename.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from sqlalchemy import JSON, select, type_coerce
from sqlalchemy.orm import Session

from muster import api
from muster.checkpoint_storage.location import Location
from muster.config.schema import SearcherConfig
from muster.states import CheckpointState, TrialState
from muster.store import Attempt, Checkpoint, Event, Experiment, Metric, Replica, Trial
from muster.store.configs import experiment_searcher
from muster.store.models import encode_non_finite
from muster.verdicts import Verdict, VerdictCounts, count_verdicts, verdict_of

# How the search block counts trials. SUSPECT counts as ended: it waits for a person, and
# the searcher does not wait for it.
ENDED_STATES = frozenset(state for state in TrialState if state.is_at_rest())
RUNNING_STATES = TrialState.active()
QUEUED_STATES = TrialState.unfinished() - TrialState.active()

# Metric name → smaller_is_better: which validation metrics to take the best of, and how.
Goals = Mapping[str, bool]
# Trial id → its best value of each validation metric of the goals.
BestValues = Mapping[int, Mapping[str, float]]


class TrialFacts(Protocol):
    """What an experiment's summary reads of each of its trials: a `Trial`, or a `TrialTally`
    (thousands of trials, no ORM objects)."""

    @property
    def id(self) -> int: ...
    @property
    def number(self) -> int: ...
    @property
    def state(self) -> TrialState: ...
    @property
    def hparams(self) -> api.JsonObject: ...
    @property
    def verification(self) -> api.JsonObject | None: ...
    @property
    def early_stopped(self) -> bool: ...
    @property
    def reason(self) -> str | None: ...
    @property
    def message(self) -> str | None: ...


_Facts = TypeVar("_Facts", bound=TrialFacts)

@dataclass
class TrialTally:
    """A `TrialFacts` read light, for an experiment's summary over thousands of trials: its
    verification as its `verified` flag alone (what the counts read: `verdict_of` a SUCCEEDED
    trial looks no further), no message, and its hyperparameters only where `tally` was
    asked for them (the best trial's)."""

    id: int
    number: int
    state: TrialState
    early_stopped: bool
    reason: str | None
    verified: bool | None
    hparams: api.JsonObject = field(default_factory=dict)
    message: str | None = None

    @property
    def verification(self) -> api.JsonObject | None:
        return None if self.verified is None else {"verified": self.verified}


def tally(s: Session, experiment_id: int) -> list[TrialTally]:
    """The experiment's trials, by id, as `TrialTally` rows: one query, no JSON decoded in
    Python (the verified flag is read by the database)."""
    flag = type_coerce(Trial.verification, JSON)["verified"].as_boolean()
    rows = s.execute(select(Trial.id, Trial.number, Trial.state, Trial.early_stopped,
                            Trial.reason, flag).where(Trial.experiment_id == experiment_id)
                     .order_by(Trial.id))
    return [TrialTally(*row) for row in rows]


def with_hparams(s: Session, trial: TrialTally | None) -> None:
    """Read `trial`'s hyperparameters into it (the one a summary shows: the best)."""
    if trial is not None:
        trial.hparams = s.scalar(select(Trial.hparams).where(Trial.id == trial.id)) or {}


class ExperimentOverview(api.ExperimentSummary):
    """`api.ExperimentDetail` without its trials: what an experiment's page shows above its
    trials table (`muster.services.experiments.experiment_overview`)."""

    config: api.Config
    config_yaml: str  # as submitted: what "run again" starts from
    search: api.SearchProgress
    warnings: list[str]
    source: api.WarmStartView | None  # its warm start


def experiment_summary(exp: Experiment, *, states: Sequence[TrialState] | None = None,
                       succeeded: Sequence[TrialFacts] | None = None,
                       best: api.BestSoFar | None = None,
                       running: Sequence[api.RunningTrialProgress] = ()
                       ) -> api.ExperimentSummary:
    """The experiment as lists show it. `states` (its trials' states) and `succeeded` (its
    SUCCEEDED trials) are taken from `exp.trials` when not given (a list reads them in
    bulk); `best` is the search's best trial so far (`best_view`), if any; `running`, its
    RUNNING trials' progress (`running_progress`)."""
    if states is None:
        states = [t.state for t in exp.trials]
    if succeeded is None:
        succeeded = [t for t in exp.trials if t.state is TrialState.SUCCEEDED]
    counts = count_verdicts(states, (trial_verdict(t).verified for t in succeeded))
    return {
        "id": exp.id,
        "uuid": exp.uuid,
        "name": exp.name,
        "description": exp.description,
        "labels": list(exp.labels),
        "state": exp.state,
        "message": exp.message,
        "created_at": exp.created_at,
        "ended_at": exp.ended_at,
        "trial_states": list(states),
        "priority": exp.priority,  # what its new trials get
        "archived": exp.archived,
        "owner": exp.owner_name,  # who submitted it; None only before users existed
        "progress": progress_view(exp.max_trials, states),
        "awaiting_review": counts.suspect,
        "unverified": counts.not_verified,
        "verdicts": verdict_counts(counts),
        "best": best,
        "trial_progress": list(running),
    }


def verdict_counts(counts: VerdictCounts) -> api.VerdictCounts:
    return {"verified": counts.verified, "not_verified": counts.not_verified,
            "suspect": counts.suspect}


def running_progress(trials: Iterable[TrialFacts], progress: Mapping[int, api.TrialProgress]
                     ) -> list[api.RunningTrialProgress]:
    """`{trial_id, number, progress}` of each of `trials` that has a `progress` view (by
    trial id: `muster.services.progress.of_running`), by number."""
    return [{"trial_id": t.id, "number": t.number, "progress": progress[t.id]}
            for t in sorted(trials, key=lambda t: (t.number, t.id)) if t.id in progress]


def progress_view(max_trials: int, states: Sequence[TrialState]) -> api.Progress:
    """Its trials by stage, of `total` (all it will make: 1, a grid's size, max_trials)."""
    counts = Counter(states)
    return {"ended": sum(counts[s] for s in ENDED_STATES),
            "running": sum(counts[s] for s in RUNNING_STATES),
            "queued": sum(counts[s] for s in QUEUED_STATES),
            "total": max(max_trials, len(states))}


def experiment_detail(overview: ExperimentOverview, page: Sequence[Trial], best: BestValues,
                      snapshots: Mapping[int, api.JsonObject], progress: Mapping[int,
                                                                             api.TrialProgress],
                      offset: int) -> api.ExperimentDetail:
    """The experiment's `overview` and a page of its trials (`page`, those from `offset` by
    id), each with its `best_validation` (`best`, by trial id), its snapshot's trial part
    (`snapshots`, by trial id; null where not given) and its `progress` (by trial id: the
    RUNNING ones). `trials_next_offset` says where the next page starts, null after the
    last."""
    trials = [trial_detail(t, best.get(t.id, {}), snapshots.get(t.id), progress.get(t.id))
              for t in page]
    total = len(overview["trial_states"])
    after = offset + len(trials)
    return api.ExperimentDetail(**overview, trials=trials, trials_total=total,
                                trials_offset=offset,
                                trials_next_offset=after if trials and after < total else None)


def experiment_overview(exp: Experiment, best: BestValues, warnings: Sequence[str],
                        progress: Mapping[int, api.TrialProgress] | None = None,
                        trials: Sequence[TrialFacts] | None = None) -> ExperimentOverview:
    """`experiment_detail` without its trials: the summary (with its RUNNING trials'
    `progress`, by trial id), the config, the search's progress and the `warnings` (what a
    page shows above its trials table, read without each trial's attempts). `trials`:
    its trials (default `exp.trials`), as `TrialTally` rows will do."""
    trials = exp.trials if trials is None else trials
    searcher = experiment_searcher(exp)
    search = search_view(exp, searcher, best, trials)
    summary = experiment_summary(
        exp, states=[t.state for t in trials],
        succeeded=[t for t in trials if t.state is TrialState.SUCCEEDED],
        best=search["best"], running=running_progress(trials, progress or {}))
    return ExperimentOverview(**summary, config=exp.config, config_yaml=exp.config_yaml,
                              search=search, warnings=list(warnings),
                              source=warm_start_view(exp))


def warm_start_view(exp: Experiment) -> api.WarmStartView | None:
    """The experiment's warm start as it was resolved at its submission, or None."""
    source = exp.source
    if source is None:
        return None
    return api.WarmStartView(
        named=str(source["named"]), checkpoint_uuid=str(source["checkpoint_uuid"]),
        checkpoint=str(source["checkpoint"]), step=int(source["step"]),
        trial_id=int(source["trial_id"]), experiment_id=int(source["experiment_id"]),
        model=source.get("model"), version=source.get("version"))


def search_view(exp: Experiment, searcher: SearcherConfig, best: BestValues,
                trials: Sequence[TrialFacts] | None = None) -> api.SearchProgress:
    """How far the search has come: trials by stage, how many are still to be made, and
    the best trial so far (`best`: the trials' `best_validation`); `trials` by default
    `exp.trials`."""
    trials = exp.trials if trials is None else trials
    states = Counter(t.state for t in trials)
    return {
        "searcher": searcher.name,
        "metric": searcher.metric,
        "smaller_is_better": searcher.smaller_is_better,
        "max_trials": exp.max_trials,
        "max_concurrent_trials": searcher.max_concurrent_trials,
        "max_length": searcher.max_length,
        "max_length_unit": searcher.max_length_unit,
        "time_metric": searcher.time_metric,
        "ended": sum(states[s] for s in ENDED_STATES),
        "running": sum(states[s] for s in RUNNING_STATES),
        "queued": sum(states[s] for s in QUEUED_STATES),
        "remaining": max(0, exp.max_trials - len(trials)),
        "best": best_view(trials, best, searcher),
        "objectives": [objective_view(o.name, o.smaller_is_better)
                       for o in searcher.objectives()],
    }


def objective_view(name: str, smaller_is_better: bool) -> api.Objective:
    return {"name": name, "smaller_is_better": smaller_is_better}


def best_view(trials: Iterable[TrialFacts], best: BestValues, searcher: SearcherConfig
              ) -> api.BestSoFar | None:
    metric, winner = searcher.metric, best_trial_of(trials, best, searcher)
    if metric is None or winner is None:
        return None
    return {"trial_id": winner.id, "number": winner.number, "hparams": winner.hparams,
            "metric": metric, "value": best[winner.id][metric],
            "early_stopped": winner.early_stopped}


def trial_detail(trial: Trial, best: Mapping[str, float],
                 snapshot: api.JsonObject | None = None,
                 progress: api.TrialProgress | None = None) -> api.TrialDetail:
    """The trial as `trial describe` shows it; `best` is its `best_validation`; `snapshot`
    the trial part of its reproducibility snapshot (`muster.services.snapshots`), null where
    the caller read none; `progress`, how far it has come while RUNNING
    (`muster.services.progress`)."""
    verdict = trial_verdict(trial)
    return {
        "id": trial.id,
        "uuid": trial.uuid,
        "experiment_id": trial.experiment_id,
        "state": trial.state,
        "reason": trial.reason,
        "message": trial.message,
        "restarts": restarts(trial),
        "hparams": trial.hparams,
        "created_at": trial.created_at,
        "started_at": trial.started_at,
        "ended_at": trial.ended_at,
        "attempts": [attempt_detail(a) for a in trial.attempts],
        "manifest": encode_non_finite(trial.manifest),
        "verification": encode_non_finite(trial.verification),
        "verified": verdict.verified,
        "verdict": verdict.line,
        "early_stopped": trial.early_stopped,
        "queue_reason": trial.queue_reason,
        "priority": trial.priority,
        "number": trial.number,  # its place in the search, from 0
        "early_stop": early_stop(trial),
        "best_validation": dict(best),
        "environment": environment_view(trial),
        "snapshot": snapshot,
        "progress": progress,
        "integration": trial.integration,
        "source": warm_start_view(trial.experiment),
        "lineage": lineage_view(trial),
    }


def lineage_view(trial: Trial) -> api.TrialLineage | None:
    """A PBT trial's lineage, as its draw recorded it (`search_state["pbt"]`); else None."""
    found = (trial.search_state or {}).get("pbt")
    if not isinstance(found, dict) or not isinstance(found.get("generation"), int):
        return None
    action = found.get("action")
    changed = found.get("changed")
    return api.TrialLineage(
        generation=found["generation"],
        action=action if action in ("continue", "exploit") else None,
        parent_trial_id=_int_or_none(found.get("parent_trial_id")),
        parent_number=_int_or_none(found.get("parent")),
        replaces_trial_id=_int_or_none(found.get("replaces_trial_id")),
        checkpoint_uuid=_str_or_none(found.get("checkpoint_uuid")),
        checkpoint=_str_or_none(found.get("checkpoint_name")),
        step=_int_or_none(found.get("checkpoint_step")),
        changed={str(k): list(v) for k, v in changed.items() if isinstance(v, list)}
        if isinstance(changed, dict) else {})


def _int_or_none(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _str_or_none(value: object) -> str | None:
    return value if isinstance(value, str) else None


def environment_view(trial: Trial) -> api.TrialEnvironmentView:
    """The trial's built environment (its own, else its experiment's) and what it held."""
    freeze = trial.environment_freeze
    return {"hash": trial.environment_key or trial.experiment.environment_key,
            "python": (trial.experiment.config.get("environment") or {}).get("python"),
            "freeze": None if freeze is None else freeze.splitlines()}


def trial_summary(trial: Trial, best: Mapping[str, float],
                  progress: api.TrialProgress | None = None) -> api.TrialSummary:
    """One row of an experiment's trial list (`best`: its `best_validation`; `progress`:
    how far it has come while RUNNING)."""
    verdict = trial_verdict(trial)
    return {
        "id": trial.id,
        "number": trial.number,
        "state": trial.state,
        "hparams": trial.hparams,
        "early_stopped": trial.early_stopped,
        "best_validation": dict(best),
        "restarts": restarts(trial),
        "started_at": trial.started_at,
        "ended_at": trial.ended_at,
        "verified": verdict.verified,
        "verdict": verdict.line,
        "early_stop": early_stop(trial),
        "progress": progress,
    }


def trial_verdict(trial: TrialFacts) -> Verdict:
    """The trial's verdict (`muster.verdicts`): verified, not verified and why, SUSPECT and
    why, or how it ended."""
    return verdict_of(trial.state, trial.verification, early_stopped=trial.early_stopped,
                      reason=trial.reason, message=trial.message)


def restarts(trial: Trial) -> int:
    return max(0, sum(not a.standby for a in trial.attempts) - 1)


def early_stop(trial: Trial) -> api.EarlyStop | None:
    """Where the searcher stopped the trial (`{rung, step, value, time}`), or None."""
    stop = (trial.search_state or {}).get("early_stop")
    if stop is None:
        return None
    return {"rung": stop["rung"], "step": stop["step"],
            "value": encode_non_finite(stop["value"]), "time": stop.get("time")}


def attempt_detail(attempt: Attempt) -> api.AttemptView:
    return {
        "number": attempt.number,
        "state": attempt.state,
        "standby": attempt.standby,  # a warm standby not (yet) promoted
        "reason": attempt.reason,
        "message": attempt.message,
        "run_dir": attempt.run_dir,
        "started_at": attempt.started_at,
        "ended_at": attempt.ended_at,
        "replicas": [replica_detail(r) for r in
                     sorted(attempt.replicas, key=lambda r: (r.rank, r.incarnation))],
    }


def replica_detail(replica: Replica) -> api.ReplicaView:
    return {
        "rank": replica.rank,
        "incarnation": replica.incarnation,  # 0, or n after n restarts in place
        "host": replica.host,
        # Where it ran: the Ray node id, or locally the host name (replicas recorded before
        # nodes were: the host).
        "node": replica.node or replica.host,
        "pid": replica.pid,
        "exit_code": replica.exit_code,
        "signal": replica.signal,
        "reason": replica.reason,
        "message": replica.message,
        "log_path": replica.log_path,
        "log_tail": replica.log_tail,
        "max_rss_bytes": replica.max_rss_bytes,
        # The peak memory of its whole process group, and who named its end an OOM kill.
        "peak_rss_bytes": replica.peak_rss_bytes,
        "oom": (None if replica.oom_source is None
                else {"source": replica.oom_source, "limit_bytes": replica.oom_limit_bytes}),
        # Output its log could not take (a full disk); a marker line in the log says where.
        "log_lost_bytes": replica.log_lost_bytes,
        # Its latest evidence bundle (relative to the attempt's directory) and its line(s).
        "evidence": replica.evidence,
        "stack_summary": replica.stack_summary,
        "started_at": replica.started_at,
        "ended_at": replica.ended_at,
    }


def event_view(event: Event, attempt_numbers: Mapping[int, int] | None = None) -> api.Event:
    """One event; an attempt's event also names the attempt by its number in the trial
    (`attempt`), the number the attempts table and `--attempt` use, not its row id."""
    attempt = (attempt_numbers or {}).get(event.entity_id) if event.entity == "attempt" else None
    return {
        "at": event.at,
        "entity": event.entity,
        "entity_id": event.entity_id,
        "from_state": event.from_state,
        "to_state": event.to_state,
        "reason": event.reason,
        "actor": event.actor,
        "message": event.message,
        "attempt": attempt,
    }


def metric_view(metric: Metric) -> api.MetricReport:
    """One report; NaN and ±Infinity are the strings "NaN", "Infinity", "-Infinity"."""
    return {
        "kind": metric.kind,
        "step": metric.step,
        "time": metric.time,
        "attempt": metric.attempt,
        "rank": metric.rank,
        "metrics": encode_non_finite(metric.values),
        "source": metric.source,
    }


def checkpoint_view(checkpoint: Checkpoint, metric: float | None = None,
                    metric_step: int | None = None) -> api.CheckpointView:
    """A checkpoint as listed: where it is (`state`, `storage_url`), its searcher metric and
    the step of the validation that metric is from (`checkpoint_storage.metrics`), and why the
    last GC kept it (`kept_because`)."""
    storage = checkpoint.storage
    url = Location.from_json(storage).url(checkpoint.uuid) if storage else None
    state = checkpoint.state
    return {
        "id": checkpoint.id,
        "uuid": checkpoint.uuid,
        "trial_id": checkpoint.trial_id,
        "name": checkpoint.name,
        "path": checkpoint.path,
        "step": checkpoint.step,
        "state": state,
        "size": checkpoint.size_bytes,
        "storage_url": url if state.is_stored() else None,
        "metric": encode_non_finite(metric),
        "metric_step": metric_step,
        "kept_because": checkpoint.gc_reason if state is not CheckpointState.DELETING else None,
        "deleted_because": checkpoint.gc_reason if state.is_gone() else None,
        "error": checkpoint.error,
        "stored_at": checkpoint.stored_at,
        "attempt": checkpoint.attempt,
        "rank": checkpoint.rank,
        "created_at": checkpoint.created_at,
        "size_bytes": checkpoint.size_bytes,
        "file_count": checkpoint.file_count,
        "metadata": encode_non_finite(checkpoint.user_metadata),
        "intact": checkpoint.intact,
        "problem": checkpoint.problem,
    }


# -- search: the best validation values and the best trial ---------------------------------


def searcher_goals(searcher: SearcherConfig) -> dict[str, bool]:
    """The searcher's metric and its direction; empty when it compares no metric."""
    return {} if searcher.metric is None else {searcher.metric: searcher.smaller_is_better}


_Item = TypeVar("_Item")


def pareto_split(items: Sequence[_Item], costs: Callable[[_Item], tuple[float, ...]]
                 ) -> tuple[list[_Item], list[_Item]]:
    """`items` on the Pareto front of `costs` (each smaller is better: negate one to
    maximise it) and the others, each list in the order of the costs (the first cost
    first). An item is on the front when no other costs at most as much on every count and
    less on one; items of equal costs are both on it.

    In that order, whatever dominates an item comes before it, and whatever dominates a
    dominated item also dominates what it dominates: so comparing each item with the
    front found so far is enough (time: items times front size)."""
    ordered = sorted(((costs(item), index, item) for index, item in enumerate(items)),
                     key=lambda entry: (entry[0], entry[1]))
    front: list[tuple[tuple[float, ...], _Item]] = []
    others: list[_Item] = []
    for cost, _, item in ordered:
        if any(all(a <= b for a, b in zip(kept, cost, strict=True)) and kept != cost
               for kept, _ in front):
            others.append(item)
        else:
            front.append((cost, item))
    return [item for _, item in front], others


def metric_order(value: float | None, smaller_is_better: bool) -> tuple[bool, float]:
    """A sort key that puts the best value first and a missing one last."""
    if value is None:
        return True, 0.0
    return False, value if smaller_is_better else -value


def best_trial_of(trials: Iterable[_Facts], best: BestValues, searcher: SearcherConfig
                  ) -> _Facts | None:
    """The SUCCEEDED trial (stopped early or not) with the best value of the searcher's
    metric; ties go to the lowest number. None without a metric or such a trial."""
    metric = searcher.metric
    if metric is None:
        return None
    candidates = [t for t in trials
                  if t.state == TrialState.SUCCEEDED and metric in best.get(t.id, {})]
    if not candidates:
        return None
    return min(candidates, key=lambda t: (
        metric_order(best[t.id][metric], searcher.smaller_is_better), t.number, t.id))
