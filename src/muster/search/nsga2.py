"""`nsga2`: the genetic search of NSGA-II (Optuna's NSGAIISampler): a population of trials
drawn at random, then generations bred from the trials that no other beats on every
objective (the Pareto front) and, among equals, the least crowded. Made for several
objectives (`searcher.metrics`), it searches one as well. A generation is
`population_size` trials: a quarter of `max_trials`, from 4 to 50, so that a search
breeds at least a few generations."""

from __future__ import annotations

from optuna.samplers import BaseSampler, NSGAIISampler

from muster.search.base import Searcher

MIN_POPULATION, MAX_POPULATION = 4, 50


class Nsga2(Searcher):
    name = "nsga2"

    def population_size(self) -> int:
        trials = self.config.max_trials or MAX_POPULATION
        return max(MIN_POPULATION, min(MAX_POPULATION, trials // 4))

    def sampler(self, seed: int) -> BaseSampler:
        return NSGAIISampler(population_size=self.population_size(), seed=seed)
