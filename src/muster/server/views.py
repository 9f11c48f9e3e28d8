"""Plain-dict views of stored records: the JSON the API returns and the CLI prints.

Field names here are a fixed contract (see README "JSON contract"): extend, never rename.
"""

from __future__ import annotations

from typing import Any

from muster.store import Attempt, Event, Experiment, Replica, Trial


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
        "restarts": max(0, len(trial.attempts) - 1),
        "hparams": trial.hparams,
        "created_at": trial.created_at,
        "started_at": trial.started_at,
        "ended_at": trial.ended_at,
        "attempts": [attempt_detail(a) for a in trial.attempts],
    }


def attempt_detail(attempt: Attempt) -> dict[str, Any]:
    return {
        "number": attempt.number,
        "state": attempt.state,
        "reason": attempt.reason,
        "message": attempt.message,
        "run_dir": attempt.run_dir,
        "started_at": attempt.started_at,
        "ended_at": attempt.ended_at,
        "replicas": [replica_detail(r) for r in attempt.replicas],
    }


def replica_detail(replica: Replica) -> dict[str, Any]:
    return {
        "rank": replica.rank,
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
