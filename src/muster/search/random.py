"""`random`: every trial's values drawn independently (Optuna's RandomSampler)."""

from __future__ import annotations

from optuna.samplers import BaseSampler, RandomSampler

from muster.search.base import Searcher


class Random(Searcher):
    name = "random"

    def sampler(self, seed: int) -> BaseSampler:
        return RandomSampler(seed=seed)
