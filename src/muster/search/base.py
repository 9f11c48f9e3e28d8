"""The searcher base class: Optuna's samplers and pruners over a study rebuilt from the store.

muster keeps no searcher state in memory. Each decision rebuilds an in-memory Optuna study
from the experiment's stored trials (their numbers, chosen values, outcomes, validation
values and the attributes Optuna's samplers and pruners noted on them), then asks or
prunes. A server killed mid-search therefore resumes the search exactly where the store
says it was: a trial's values are committed with the trial before it can run, so a restart
never draws a number twice, and the next draw is number N.

Reproducibility: the sampler that draws trial N is seeded from `experiment_seed` and N
alone. Given the same seed (and, for TPE, the same results so far), trial N gets the same
values, whatever the order in which trials ended or the server restarted.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import optuna
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)
from optuna.pruners import BasePruner, NopPruner
from optuna.samplers import BaseSampler
from optuna.study import StudyDirection
from optuna.trial import TrialState as OptunaState

from muster.config.schema import SearcherConfig
from muster.config.space import Categorical, Double, Int, Log, Scalar, Searched, SearchSpace
from muster.search.history import Attrs, Draw, Judgement, PastTrial, trial_seed
from muster.states import SearchOutcome

__all__ = ["Judgement", "PastTrial", "Searcher"]

optuna.logging.set_verbosity(optuna.logging.WARNING)
STUDY_NAME = "muster"  # HyperbandPruner assigns brackets from it and the trial number


_OPTUNA_STATE = {
    SearchOutcome.RUNNING: OptunaState.RUNNING,
    SearchOutcome.COMPLETE: OptunaState.COMPLETE,
    SearchOutcome.PRUNED: OptunaState.PRUNED,
    SearchOutcome.FAILED: OptunaState.FAIL,
    SearchOutcome.CANCELED: OptunaState.FAIL,  # Optuna has no canceled: no value either way
}


class Searcher:
    """One search strategy: which Optuna sampler draws, and which pruner stops trials."""

    name: ClassVar[str]
    prunes: ClassVar[bool] = False
    # Whether its trials continue from other trials' checkpoints (PBT): the history then
    # holds each trial's latest intact checkpoint.
    continues: ClassVar[bool] = False

    def __init__(self, config: SearcherConfig, space: SearchSpace, seed: int) -> None:
        self.config = config
        self.space = space
        self.seed = seed

    # -- what each searcher defines ----------------------------------------------------

    def sampler(self, seed: int) -> BaseSampler:
        raise NotImplementedError

    def pruner(self) -> BasePruner:
        return NopPruner()

    def distributions(self) -> dict[str, BaseDistribution]:
        return {name: _distribution(param) for name, param in self.space.searched().items()}

    # -- what the supervisor calls -----------------------------------------------------

    def must_end_first(self, number: int) -> range:
        """The trials that must be at rest before trial `number` is drawn (PBT's previous
        generation); none by default."""
        return range(0)

    def draw(self, history: Sequence[PastTrial], number: int) -> Draw:
        """Trial `number`: its values and what the searcher notes on it (`ask`).

        Raises:
            NothingToDraw: the search can go no further, with why.
        """
        params, attrs = self.ask(history, number)
        return Draw(params, attrs)

    def ask(self, history: Sequence[PastTrial], number: int) -> tuple[dict[str, Scalar],
                                                                      Attrs]:
        """The values of trial `number` (the next one: `history` holds 0..number-1), and
        the attributes the sampler noted on it."""
        numbers = [past.number for past in history]
        if numbers != list(range(number)):
            raise ValueError(f"the history of a search must hold trials 0..{number - 1} in "
                             f"order before trial {number} is drawn, got {numbers[:20]}")
        study = self._study(history, self.sampler(self.trial_seed(number)))
        trial = study.ask(self.distributions())
        attrs = study._storage.get_trial(trial._trial_id).system_attrs
        return dict(trial.params), _plain(attrs)

    def judge(self, history: Sequence[PastTrial], number: int) -> Judgement:
        """Whether the pruner stops trial `number` now, at its latest intermediate value
        (`history` holds it as RUNNING with its values up to that step)."""
        study = self._study(history, self.sampler(self.trial_seed(number)))
        [frozen] = [t for t in study.get_trials(deepcopy=False) if t.number == number]
        prune = self.pruner().prune(study, frozen)
        attrs = _plain(study._storage.get_trial(frozen._trial_id).system_attrs)
        return Judgement(prune, attrs, _rungs(attrs))

    def trial_seed(self, number: int) -> int:
        """The seed of trial `number`'s draw (`history.trial_seed`)."""
        return trial_seed(self.seed, number)

    # -- the study ---------------------------------------------------------------------

    def _study(self, history: Sequence[PastTrial], sampler: BaseSampler) -> optuna.Study:
        """An in-memory study of `history`: one direction per objective (`searcher.metrics`,
        or the one metric), each COMPLETE trial with its value(s)."""
        smaller = ([o.smaller_is_better for o in self.config.objectives()]
                   or [self.config.smaller_is_better])
        directions = [StudyDirection.MINIMIZE if each else StudyDirection.MAXIMIZE
                      for each in smaller]
        study = optuna.create_study(storage=optuna.storages.InMemoryStorage(),
                                    sampler=sampler, pruner=self.pruner(),
                                    study_name=STUDY_NAME, directions=directions)
        distributions = self.distributions()
        for past in sorted(history, key=lambda p: p.number):
            known = {k: v for k, v in past.params.items() if k in distributions}
            complete = past.outcome is SearchOutcome.COMPLETE
            values = (list(past.values) if past.values is not None
                      else None if past.value is None else [past.value])
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # Optuna's notes on added trials
                study.add_trial(optuna.trial.create_trial(
                    state=_OPTUNA_STATE[past.outcome], params=known,
                    distributions={k: distributions[k] for k in known},
                    values=values if complete else None,
                    intermediate_values=dict(past.intermediate),
                    system_attrs=dict(past.attrs)))
        return study


def _distribution(param: Searched) -> BaseDistribution:
    if isinstance(param, Int):
        return IntDistribution(param.minval, param.maxval)
    if isinstance(param, Double):
        return FloatDistribution(param.minval, param.maxval)
    if isinstance(param, Log):
        return FloatDistribution(param.low, param.high, log=True)
    if isinstance(param, Categorical):
        return CategoricalDistribution(list(param.vals))
    raise TypeError(f"no distribution for {param!r}")


def _plain(attrs: Mapping[str, Any]) -> Attrs:
    """Attributes as JSON keeps them (GridSampler notes its grid as tuples)."""
    def plain(value: Any) -> Any:
        if isinstance(value, tuple | list):
            return [plain(v) for v in value]
        if isinstance(value, Mapping):
            return {str(k): plain(v) for k, v in value.items()}
        return value
    return {str(k): plain(v) for k, v in attrs.items()}


def _rungs(attrs: Mapping[str, Any]) -> int:
    """How many rungs a trial has completed (SuccessiveHalvingPruner's notes)."""
    rung = 0
    while f"completed_rung_{rung}" in attrs:
        rung += 1
    return rung
