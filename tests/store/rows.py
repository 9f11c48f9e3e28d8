"""Minimal valid rows for store tests, created directly (test setup, not transitions)."""

from __future__ import annotations

from sqlalchemy import insert
from sqlalchemy.orm import Session

from muster.store import Attempt, Experiment, Metric, Replica, Trial, series


def add_experiment(session: Session, state: str = "ACTIVE", name: str = "exp") -> Experiment:
    experiment = Experiment(
        name=name,
        config={"name": name},
        config_yaml=f"name: {name}\n",
        context_dir="/tmp/context",
        state=state,
    )
    session.add(experiment)
    session.flush()
    return experiment


def add_trial(session: Session, experiment: Experiment, state: str = "QUEUED") -> Trial:
    number = len(experiment.trials)  # each trial's place in its experiment is unique
    trial = Trial(experiment=experiment, state=state, hparams={"lr": 0.1}, number=number)
    session.add(trial)
    session.flush()
    return trial


def add_attempt(
    session: Session, trial: Trial, state: str = "STARTING", number: int = 1
) -> Attempt:
    attempt = Attempt(trial=trial, number=number, state=state, run_dir=f"/tmp/run/{number}")
    session.add(attempt)
    session.flush()
    return attempt


def add_replica(session: Session, attempt: Attempt, rank: int = 0) -> Replica:
    replica = Replica(attempt=attempt, rank=rank, host="localhost", log_path=f"rank-{rank}.log")
    session.add(replica)
    session.flush()
    return replica


def add_metric(session: Session, trial: Trial, values: dict[str, float], *, step: int = 1,
               kind: str = "validation", rank: int = 0, attempt: int = 1) -> None:
    """One report, stored as ingestion stores it: the row and its metric series."""
    add_reports(session, trial, [(step, values)], kind=kind, rank=rank, attempt=attempt)


def add_reports(session: Session, trial: Trial, reports: list[tuple[int, dict[str, float]]],
                *, kind: str = "validation", rank: int = 0, attempt: int = 1) -> None:
    """(step, values) reports, stored as one batch of ingestion stores them."""
    rows = [{"trial_id": trial.id, "attempt": attempt, "rank": rank, "kind": kind,
             "step": step, "time": 1.0 + step, "values": values} for step, values in reports]
    session.execute(insert(Metric), rows)
    series.record(session, trial.id, rows)
