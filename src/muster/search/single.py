"""`single`: one trial with the constants of the space (and the middle of nothing else:
the single searcher allows constants only, as the config validation says)."""

from __future__ import annotations

from optuna.samplers import BaseSampler, RandomSampler

from muster.search.base import Searcher


class Single(Searcher):
    name = "single"

    def sampler(self, seed: int) -> BaseSampler:
        return RandomSampler(seed=seed)  # draws once, if the space has anything to draw
