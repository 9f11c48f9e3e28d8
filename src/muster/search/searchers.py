"""The searcher for an experiment config: one class per module (see `muster.search`)."""

from __future__ import annotations

from muster.config.schema import ExperimentConfig
from muster.search.adaptive_asha import AdaptiveAsha
from muster.search.asha import Asha
from muster.search.base import Searcher
from muster.search.bohb import Bohb
from muster.search.grid import Grid
from muster.search.nsga2 import Nsga2
from muster.search.pbt import Pbt
from muster.search.random import Random
from muster.search.single import Single
from muster.search.tpe import Tpe

__all__ = ["searcher_for"]

_SEARCHERS: dict[str, type[Searcher]] = {
    cls.name: cls for cls in (Single, Grid, Random, Tpe, Asha, AdaptiveAsha, Bohb, Nsga2,
                                   Pbt)
}


def searcher_for(config: ExperimentConfig, seed: int) -> Searcher:
    """The experiment's searcher; `seed` is its experiment_seed (or one drawn and stored
    when the experiment was created)."""
    return _SEARCHERS[config.searcher.name](config.searcher, config.space(), seed)
