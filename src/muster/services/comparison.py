"""Trials, or experiments, side by side: what the compare page shows.

Trials (from any experiments): each one's hyperparameters by dotted name, the best value of
its experiment's searcher metric, and the last value of every metric its rank 0 reported
(both kinds), as rows with a cell per trial and whether the cells differ. The curves
themselves are read by the page from the public API (`GET /trials/{id}/series`).

Experiments: each one's search (its metric, how far it came) and the trial that stands for
it (`snapshots.stand_in`: its best by the searcher's metric, else its latest), its config's
differences from the first experiment's (a unified diff of the configs with every default
filled in), and those trials compared as above.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any

import yaml
from sqlalchemy import select

from muster.errors import InvalidRequest, NotFound
from muster.services import curves, views
from muster.services.experiments import experiment_or_404
from muster.services.snapshots import stand_in
from muster.services.trials_export import flat_hparams
from muster.services.validation import best_validation, best_validation_each
from muster.states import Basis, ExperimentState, TrialState
from muster.store import Store, Trial
from muster.store.configs import experiment_searcher

__all__ = ["MAX_COMPARED", "ComparedExperiment", "ComparedTrial", "ExperimentComparison", "Row",
           "TrialComparison", "compare_experiments", "compare_trials", "parse_ids"]

MAX_COMPARED = 20  # trials (or experiments) one comparison shows


@dataclass(frozen=True)
class ComparedTrial:
    id: int
    number: int
    experiment_id: int
    experiment_name: str
    state: TrialState
    verdict: str


@dataclass(frozen=True)
class Row:
    """One hyperparameter or metric: a value per compared trial (None: it has none)."""

    name: str
    values: tuple[Any, ...]

    @property
    def differs(self) -> bool:
        return len({repr(value) for value in self.values}) > 1


@dataclass(frozen=True)
class TrialComparison:
    trials: list[ComparedTrial]
    hparams: list[Row]
    metrics: list[Row]  # `best NAME` of each searcher metric, then `last KIND NAME`
    series: list[str]  # `kind:name` of every metric reported, for the curves' chooser


def parse_ids(text: str, what: str) -> list[int]:
    """`12,15,19` as ids, each once, in order.

    Raises:
        InvalidRequest: not comma-separated positive ids, none, or more than `MAX_COMPARED`.
    """
    words = [word.strip() for word in text.split(",") if word.strip()]
    if not all(word.isascii() and word.isdigit() and 0 < int(word) < 2**31 for word in words):
        raise InvalidRequest(f"{what} must be ids separated by commas, like 12,15,19; got "
                             f"{text[:100]!r}")
    ids = list(dict.fromkeys(int(word) for word in words))
    if not 1 <= len(ids) <= MAX_COMPARED:
        raise InvalidRequest(f"compare 1 to {MAX_COMPARED} {what}, got {len(ids)}")
    return ids


def compare_trials(store: Store, trial_ids: list[int]) -> TrialComparison:
    """The trials (at most `MAX_COMPARED`) side by side, in the order given.

    Raises:
        NotFound: a trial that does not exist (named).
        InvalidRequest: more than `MAX_COMPARED` trials.
    """
    if len(trial_ids) > MAX_COMPARED:
        raise InvalidRequest(f"compare at most {MAX_COMPARED} trials, got {len(trial_ids)}")
    with store.session_scope() as s:
        found = {t.id: t for t in s.scalars(select(Trial).where(Trial.id.in_(trial_ids)))}
        missing = [str(i) for i in trial_ids if i not in found]
        if missing:
            raise NotFound(f"no trial {', '.join(missing)}; pick trials from an experiment's "
                           "table")
        trials = [found[i] for i in trial_ids]
        goals = {t.id: views.searcher_goals(experiment_searcher(t.experiment)) for t in trials}
        best = best_validation_each(s, goals)
        compared = [ComparedTrial(t.id, t.number, t.experiment_id, t.experiment.name, t.state,
                                  views.trial_verdict(t).line) for t in trials]
        flat = [dict(flat_hparams(t.hparams)) for t in trials]
    metric_names = dict.fromkeys(name for g in goals.values() for name in g)
    rows = [Row(f"best {name}", tuple(best.get(i, {}).get(name) for i in trial_ids))
            for name in metric_names]
    last: list[dict[str, float | None]] = []
    for trial_id in trial_ids:
        kept = curves.trial_series(store, trial_id, points=4)["series"]
        last.append({f"{c['kind']}:{c['name']}": c["values"][-1] if c["values"] else None
                     for c in kept})
    series = sorted({name for values in last for name in values})
    rows += [Row(f"last {name.replace(':', ' ', 1)}", tuple(v.get(name) for v in last))
             for name in series]
    names = dict.fromkeys(name for hp in flat for name in hp)
    return TrialComparison(compared, [Row(n, tuple(hp.get(n) for hp in flat)) for n in names],
                           rows, series)


@dataclass(frozen=True)
class ComparedExperiment:
    id: int
    name: str
    state: ExperimentState
    metric: str | None
    smaller_is_better: bool
    trials: int  # made so far
    max_trials: int
    stand_in: int | None  # the trial that stands for it; None before its first
    basis: Basis | None
    config_diff: list[str]  # its config against the first experiment's; [] for the first


@dataclass(frozen=True)
class ExperimentComparison:
    experiments: list[ComparedExperiment]
    trials: TrialComparison | None  # the stand-in trials; None when none has a trial


def compare_experiments(store: Store, experiment_ids: list[int]) -> ExperimentComparison:
    """The experiments (at most `MAX_COMPARED`) side by side, in the order given.

    Raises:
        NotFound: an experiment that does not exist.
        InvalidRequest: more than `MAX_COMPARED` experiments.
    """
    if len(experiment_ids) > MAX_COMPARED:
        raise InvalidRequest(f"compare at most {MAX_COMPARED} experiments, got "
                             f"{len(experiment_ids)}")
    found: list[ComparedExperiment] = []
    first: list[str] = []
    with store.session_scope() as s:
        for experiment_id in experiment_ids:
            exp = experiment_or_404(s, experiment_id)
            searcher = experiment_searcher(exp)
            succeeded = [t.id for t in exp.trials if t.state is TrialState.SUCCEEDED]
            chosen = stand_in(exp.trials, best_validation(s, succeeded,
                                                          views.searcher_goals(searcher)),
                              searcher)
            lines = yaml.safe_dump(exp.config, sort_keys=True).splitlines()
            diff = [] if not found else list(difflib.unified_diff(
                first, lines, f"experiment {experiment_ids[0]}", f"experiment {exp.id}",
                n=1, lineterm=""))
            first = first or lines
            found.append(ComparedExperiment(
                exp.id, exp.name, exp.state, searcher.metric, searcher.smaller_is_better,
                len(exp.trials), exp.max_trials, None if chosen is None else chosen[0].id,
                None if chosen is None else chosen[1], diff))
    trial_ids = list(dict.fromkeys(e.stand_in for e in found if e.stand_in is not None))
    return ExperimentComparison(found, compare_trials(store, trial_ids) if trial_ids else None)
