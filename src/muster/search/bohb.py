"""`bohb`: BOHB-style search: the brackets of `adaptive_asha` (Optuna's HyperbandPruner
stops poor trials early at its rungs) with the draws of `tpe` (Optuna's TPESampler), which
learns from every trial that reported, the ones stopped early included, so later trials
are drawn where the good ones were (Falkner et al., 2018: Hyperband's budgets, a TPE-like
model in place of its random draws). Its first draws are random, as `tpe`'s are."""

from __future__ import annotations

from optuna.samplers import BaseSampler, TPESampler

from muster.search.adaptive_asha import AdaptiveAsha


class Bohb(AdaptiveAsha):
    name = "bohb"

    def sampler(self, seed: int) -> BaseSampler:
        return TPESampler(seed=seed)
