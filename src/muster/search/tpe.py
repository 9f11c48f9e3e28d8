"""`tpe`: the Tree-structured Parzen Estimator (Optuna's TPESampler) learns from the trials
that have ended; its first draws are random."""

from __future__ import annotations

from optuna.samplers import BaseSampler, TPESampler

from muster.search.base import Searcher


class Tpe(Searcher):
    name = "tpe"

    def sampler(self, seed: int) -> BaseSampler:
        return TPESampler(seed=seed)
