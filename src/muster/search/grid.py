"""`grid`: one trial per point of the product of every parameter's points (Optuna's
GridSampler): `count` evenly spaced values of an int, double or log range (every integer of
a small int range without one), and every value of a categorical."""

from __future__ import annotations

from optuna.distributions import BaseDistribution, CategoricalDistribution
from optuna.samplers import BaseSampler, GridSampler

from muster.search.base import Searcher


class Grid(Searcher):
    name = "grid"

    def sampler(self, seed: int) -> BaseSampler:
        # The experiment's seed, not the trial's: GridSampler numbers the points of a grid
        # shuffled by its seed, and the points noted on earlier trials must keep their numbers.
        points = {name: p.grid() for name, p in self.space.searched().items()}
        return GridSampler(points, seed=self.seed % 2**32)

    def distributions(self) -> dict[str, BaseDistribution]:
        return {name: CategoricalDistribution(p.grid())
                for name, p in self.space.searched().items()}
