"""Hyperparameter importance for a search: which hyperparameters it took to reach the best
values of the searcher's metric.

The evaluator is Optuna's `PedAnovaImportanceEvaluator`, named in every answer. It compares
where the top 10% of trials put each hyperparameter with where all of them did (Parzen
estimators on a grid): deterministic, and 0.05 s at 1,000 trials where fANOVA's random
forest took 65 s. Its study is built in memory from the store: one COMPLETE trial per
SUCCEEDED trial (stopped early or not; FAILED, CANCELED and SUSPECT ones do not count) with
a finite value of the metric, that value being its `best_validation`, with the values the
searcher chose for it, in the distributions the searcher draws from. The importances are
Optuna's normalised shares (they sum to 1), over the hyperparameters that took two values
or more.

Answers are kept in process memory per experiment, metric and number of ended trials, so a
page that polls one costs two small queries until another trial ends.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from muster import api
from muster.config import ExperimentConfig
from muster.config.schema import SearcherConfig
from muster.errors import Conflict
from muster.services import views
from muster.services.experiments import experiment_or_404
from muster.services.validation import best_validation
from muster.states import TrialState
from muster.store import Experiment, Store, Trial
from muster.store.configs import experiment_config
from muster.supervise.searching import experiment_seed
from muster.words import count

if TYPE_CHECKING:
    from optuna.distributions import BaseDistribution

__all__ = ["EVALUATOR", "MAX_TRIALS", "MIN_TRIALS", "Sample", "experiment_importance",
           "rank_importance"]

EVALUATOR = "PedAnovaImportanceEvaluator"
TARGET_QUANTILE = 0.1  # the evaluator's default: the top 10% of trials
# Below 10 trials the top 10% is rounded up to the best trial alone: the answer would say
# where one trial put each hyperparameter, not what the good trials share.
MIN_TRIALS = 10
ADVISED_TRIALS = 50  # Optuna advises at least 5 trials in the top quantile
MAX_TRIALS = 10_000  # the SUCCEEDED trials one answer reads at most, the lowest numbers
KEPT_ANSWERS = 256


@dataclass(frozen=True)
class Sample:
    """One trial as the importance sees it: the values the searcher chose, by key path,
    and its value of the metric."""

    params: Mapping[str, Any]
    value: float


@dataclass(frozen=True)
class Ranking:
    importances: tuple[tuple[str, float], ...]  # (key path, share), the largest first
    trials_used: int
    message: str | None  # what to keep in mind when reading it


def experiment_importance(store: Store, experiment_id: int) -> api.Importance:
    """The importance of each hyperparameter the search varied for the searcher's metric:
    `{experiment_id, evaluator, metric, smaller_is_better, ended_trials, trials_used,
    importances: [{name, importance}], message}`, the largest share first (ties by name).
    The trials used are the SUCCEEDED ones, stopped early or not, with a finite value of
    the metric; FAILED, CANCELED and SUSPECT trials count as ended but are not used.

    Raises:
        NotFound: no such experiment.
        Conflict: the searcher names no metric, the search varies no hyperparameter, or
            fewer than MIN_TRIALS SUCCEEDED trials have a finite value of the metric.
    """
    with store.session_scope() as s:
        exp = experiment_or_404(s, experiment_id)
        config = experiment_config(exp)
        metric = _searcher_metric(experiment_id, config.searcher)
        ended, succeeded = _ended_and_succeeded(s, experiment_id)
        # Succeeded too: a SUSPECT trial accepted on review succeeds without another ending.
        key = (exp.uuid, metric, ended, succeeded)
        ranking = _ANSWERS.get(key)
        if ranking is not None:
            return _view(experiment_id, metric, config.searcher, ended, ranking)
        distributions = _searched_distributions(experiment_id, exp, config)
        samples = _samples(s, experiment_id, config.searcher, metric, list(distributions))
    ranking = rank_importance(experiment_id, samples, distributions, config.searcher)
    _ANSWERS.put(key, ranking)
    return _view(experiment_id, metric, config.searcher, ended, ranking)


def rank_importance(
    experiment_id: int, samples: Sequence[Sample], distributions: Mapping[str, BaseDistribution],
    searcher: SearcherConfig,
) -> Ranking:
    """PED-ANOVA's shares of the hyperparameters that took two values or more in `samples`.

    Raises:
        Conflict: fewer than MIN_TRIALS samples, or no hyperparameter took two values.
    """
    metric = searcher.metric
    if len(samples) < MIN_TRIALS:
        raise Conflict(f"experiment {experiment_id} has "
                       f"{count(len(samples), 'SUCCEEDED trial')} with a finite {metric!r}; "
                       f"hyperparameter importance needs at least {MIN_TRIALS}, as it compares "
                       "the top 10% with the rest: ask again when more have ended (`muster "
                       f"experiment watch {experiment_id}` follows the search)")
    varying = [name for name in distributions
               if len({repr(sample.params[name]) for sample in samples}) > 1]
    if not varying:
        raise Conflict(f"no hyperparameter of experiment {experiment_id} took two values in "
                       f"its {len(samples)} trials with a {metric!r}, so none can be ranked "
                       "above another")
    values = [sample.value for sample in samples]
    tie = _tie_at_the_top(values, searcher)
    if tie is None:
        shares = _ped_anova(samples, distributions, varying, searcher.smaller_is_better)
    else:
        shares = dict.fromkeys(varying, 1.0 / len(varying))  # what Optuna answers, warning
    ranked = tuple(sorted(shares.items(), key=lambda item: (-item[1], item[0])))
    return Ranking(ranked, len(samples), tie or _rough(len(samples)))


def _searcher_metric(experiment_id: int, searcher: SearcherConfig) -> str:
    if searcher.metric is None:
        raise Conflict(f"experiment {experiment_id} has no searcher metric, so there is "
                       "nothing to rank its hyperparameters by; name one in the config's "
                       "`searcher.metric` next time")
    return searcher.metric


def _ended_and_succeeded(s: Session, experiment_id: int) -> tuple[int, int]:
    """How many of the experiment's trials ended (as the search block counts them), and
    how many of those SUCCEEDED."""
    rows = s.execute(select(Trial.state, func.count()).where(
        Trial.experiment_id == experiment_id, Trial.state.in_(views.ENDED_STATES))
        .group_by(Trial.state)).all()
    counts = {state: int(n) for state, n in rows}
    return sum(counts.values()), counts.get(TrialState.SUCCEEDED, 0)


def _searched_distributions(experiment_id: int, exp: Experiment, config: ExperimentConfig
                            ) -> dict[str, BaseDistribution]:
    """The searcher's distributions of the hyperparameters it can give two values."""
    from muster.search.searchers import searcher_for  # Optuna loads with the first answer

    searcher = searcher_for(config, experiment_seed(exp, config))
    searched = {name: d for name, d in searcher.distributions().items() if not d.single()}
    if not searched:
        raise Conflict(f"experiment {experiment_id} searches no hyperparameter: each is a "
                       "constant, so none can matter more than another; importance ranks "
                       "the int, double, log and categorical ones a search varies")
    return searched


def _samples(s: Session, experiment_id: int, searcher: SearcherConfig, metric: str,
             names: Sequence[str]) -> list[Sample]:
    """The SUCCEEDED trials (stopped early or not) of the first MAX_TRIALS by number that
    have a finite value of the metric and a chosen value of every hyperparameter named."""
    rows = s.execute(select(Trial.id, Trial.search_state).where(
        Trial.experiment_id == experiment_id, Trial.state == TrialState.SUCCEEDED)
        .order_by(Trial.number, Trial.id).limit(MAX_TRIALS)).all()
    best = best_validation(s, [trial_id for trial_id, _ in rows],
                           views.searcher_goals(searcher))
    samples = []
    for trial_id, state in rows:
        params = (state or {}).get("params", {})
        value = best.get(trial_id, {}).get(metric)
        if value is not None and all(name in params for name in names):
            samples.append(Sample({name: params[name] for name in names}, value))
    return samples


def _ped_anova(samples: Sequence[Sample], distributions: Mapping[str, BaseDistribution],
               names: list[str], smaller_is_better: bool) -> dict[str, float]:
    import optuna
    from optuna.importance import PedAnovaImportanceEvaluator, get_param_importances

    optuna.logging.set_verbosity(optuna.logging.WARNING)  # no line per study, as in search
    study = optuna.create_study(storage=optuna.storages.InMemoryStorage(),
                                direction="minimize" if smaller_is_better else "maximize")
    study.add_trials([optuna.trial.create_trial(params=dict(sample.params),
                                                distributions=dict(distributions),
                                                value=sample.value) for sample in samples])
    return get_param_importances(study, evaluator=PedAnovaImportanceEvaluator(), params=names)


def _tie_at_the_top(values: Sequence[float], searcher: SearcherConfig) -> str | None:
    """Why the top 10% cannot be told from the rest, if it cannot: picked as the evaluator
    picks it (every value as good as the ceil(10% n)-th best), it holds every trial. The
    evaluator then gives each hyperparameter an equal share, with a warning."""
    losses = sorted(v if searcher.smaller_is_better else -v for v in values)
    cutoff = losses[math.ceil(TARGET_QUANTILE * len(losses)) - 1]
    if losses[-1] > cutoff:
        return None
    tied = sum(loss == cutoff for loss in losses)
    value = cutoff if searcher.smaller_is_better else -cutoff
    return (f"{tied} of the {len(values)} trials share the {searcher.metric} {value:.6g}, so "
            "the top 10% cannot be told from the rest: every hyperparameter gets an equal "
            "share")


def _rough(trials: int) -> str | None:
    if trials >= ADVISED_TRIALS:
        return None
    top = math.ceil(TARGET_QUANTILE * trials)
    return (f"only {trials} trials: the top 10% that PED-ANOVA compares with the rest holds "
            f"{top} of them, where Optuna advises at least 5; read these shares as rough "
            "until more trials end")


def _view(experiment_id: int, metric: str, searcher: SearcherConfig, ended: int,
          ranking: Ranking) -> api.Importance:
    return {"experiment_id": experiment_id, "evaluator": EVALUATOR, "metric": metric,
            "smaller_is_better": searcher.smaller_is_better, "ended_trials": ended,
            "trials_used": ranking.trials_used,
            "importances": [{"name": name, "importance": share}
                            for name, share in ranking.importances],
            "message": ranking.message}


class _Answers:
    """The latest rankings by (experiment uuid, metric, ended, succeeded): a thread-safe
    LRU. The uuid, not the id: ids repeat across databases, uuids do not."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._lock = threading.Lock()
        self._kept: OrderedDict[tuple[str, str, int, int], Ranking] = OrderedDict()

    def get(self, key: tuple[str, str, int, int]) -> Ranking | None:
        with self._lock:
            ranking = self._kept.get(key)
            if ranking is not None:
                self._kept.move_to_end(key)
            return ranking

    def put(self, key: tuple[str, str, int, int], ranking: Ranking) -> None:
        with self._lock:
            self._kept[key] = ranking
            self._kept.move_to_end(key)
            if len(self._kept) > self._size:
                self._kept.popitem(last=False)


_ANSWERS = _Answers(KEPT_ANSWERS)
