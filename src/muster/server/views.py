"""Plain-dict views of stored records: the JSON the API returns and the CLI prints.

Field names here are a fixed contract (see README "JSON contract"): extend, never rename.
"""

from __future__ import annotations

from typing import Any

from muster.store import Attempt, Checkpoint, Event, Experiment, Metric, Replica, Trial
from muster.store.models import encode_non_finite


def experiment_summary(exp: Experiment) -> dict[str, Any]:
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
        "trial_states": [t.state for t in exp.trials],
        "priority": exp.priority,  # what its new trials get
    }


def experiment_detail(exp: Experiment) -> dict[str, Any]:
    view = experiment_summary(exp)
    view["config"] = exp.config
    view["trials"] = [trial_detail(t) for t in exp.trials]
    return view


def trial_detail(trial: Trial) -> dict[str, Any]:
    return {
        "id": trial.id,
        "uuid": trial.uuid,
        "experiment_id": trial.experiment_id,
        "state": trial.state,
        "reason": trial.reason,
        "message": trial.message,
        "restarts": max(0, sum(not a.standby for a in trial.attempts) - 1),
        "hparams": trial.hparams,
        "created_at": trial.created_at,
        "started_at": trial.started_at,
        "ended_at": trial.ended_at,
        "attempts": [attempt_detail(a) for a in trial.attempts],
        "manifest": encode_non_finite(trial.manifest),
        "verification": encode_non_finite(trial.verification),
        "early_stopped": trial.early_stopped,
        "queue_reason": trial.queue_reason,
        "priority": trial.priority,
    }


def attempt_detail(attempt: Attempt) -> dict[str, Any]:
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


def replica_detail(replica: Replica) -> dict[str, Any]:
    return {
        "rank": replica.rank,
        "incarnation": replica.incarnation,  # 0, or n after n restarts in place
        "host": replica.host,
        "pid": replica.pid,
        "exit_code": replica.exit_code,
        "signal": replica.signal,
        "reason": replica.reason,
        "message": replica.message,
        "log_path": replica.log_path,
        "log_tail": replica.log_tail,
        "max_rss_bytes": replica.max_rss_bytes,
        "started_at": replica.started_at,
        "ended_at": replica.ended_at,
    }


def event_view(event: Event) -> dict[str, Any]:
    return {
        "at": event.at,
        "entity": event.entity,
        "entity_id": event.entity_id,
        "from_state": event.from_state,
        "to_state": event.to_state,
        "reason": event.reason,
        "actor": event.actor,
        "message": event.message,
    }


def metric_view(metric: Metric) -> dict[str, Any]:
    """One report; NaN and ±Infinity are the strings "NaN", "Infinity", "-Infinity"."""
    return {
        "kind": metric.kind,
        "step": metric.step,
        "time": metric.time,
        "attempt": metric.attempt,
        "rank": metric.rank,
        "metrics": encode_non_finite(metric.values),
    }


def checkpoint_view(checkpoint: Checkpoint) -> dict[str, Any]:
    return {
        "name": checkpoint.name,
        "path": checkpoint.path,
        "step": checkpoint.step,
        "attempt": checkpoint.attempt,
        "rank": checkpoint.rank,
        "created_at": checkpoint.created_at,
        "size_bytes": checkpoint.size_bytes,
        "file_count": checkpoint.file_count,
        "metadata": encode_non_finite(checkpoint.user_metadata),
        "intact": checkpoint.intact,
        "problem": checkpoint.problem,
    }
