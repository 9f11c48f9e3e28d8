"""`asha`: asynchronous successive halving (Optuna's SuccessiveHalvingPruner) over random
draws. Rungs sit at `max_length / divisor**k` for k = max_rungs-1 .. 1 (at least step 1); a
trial that reaches a rung goes on only if it is in the best 1/divisor of the trials that
reached that rung so far, else it is stopped early."""

from __future__ import annotations

from optuna.pruners import BasePruner, SuccessiveHalvingPruner
from optuna.samplers import BaseSampler, RandomSampler

from muster.search.base import Searcher


class Asha(Searcher):
    name = "asha"
    prunes = True

    def sampler(self, seed: int) -> BaseSampler:
        return RandomSampler(seed=seed)

    def pruner(self) -> BasePruner:
        return SuccessiveHalvingPruner(min_resource=self.min_resource(),
                                       reduction_factor=self.config.divisor)

    def min_resource(self) -> int:
        """The first rung's step."""
        assert self.config.max_length is not None, "checked by SearcherConfig"
        spacing: int = self.config.divisor ** (self.config.max_rungs - 1)
        return max(1, round(self.config.max_length / spacing))
