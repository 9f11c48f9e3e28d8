"""`pbt`: population-based training (Jaderberg et al. 2017, as Determined and Ray Tune run it).

A population of `population_size` members trains in `num_rounds` rounds of
`length_per_round` each. Every trial here is one member's round: trial N is member
N mod population_size of generation N // population_size, and trains from its parent's
checkpoint to (generation + 1) * `length_per_round` (MUSTER_MAX_LENGTH). Each trial is
verified on its own round, so a round that did not train or saved no checkpoint cannot
hand its line on as if it had.

Generation 0 draws every member at random. A generation is drawn only once every trial of
the one before is at rest (a synchronous round, as Determined's), and then, member by member:

- the members of the previous generation are ranked by the value they ended with, best
  first; only a SUCCEEDED trial with the metric and an intact checkpoint ranks (a failed,
  SUSPECT or canceled one cannot be continued from);
- every member that does not rank, and the worst ranked ones until
  `replace_function.truncate_fraction` of the population is replaced, are replaced
  (exploit): the new member copies the checkpoint of one of the best as many (the best
  first, in turn) and changes its hyperparameters (explore: `explore_function`);
- every other member goes on (continue): the new member starts from its own predecessor's
  checkpoint with the same hyperparameters.

Each new trial records its lineage (`search_state["pbt"]`, `muster.search.history.Lineage`)
and the checkpoint it starts from (`trials.source_checkpoint_id`), which the launch copies
in as MUSTER_SOURCE_CHECKPOINT (`muster.supervise.warm_start`). Draws are reproducible: what
trial N does depends on the stored history and the experiment's seed alone.

Determined's PBT continues the surviving trials themselves; here a member's next round is a
new trial, so that each trial has one planned length and one verdict, and its lineage is a
chain of trials.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from optuna.samplers import BaseSampler, RandomSampler

from muster.config.space import Categorical, Double, Int, Log, Scalar, Searched
from muster.search.base import Searcher
from muster.search.history import Draw, Lineage, NothingToDraw, PastTrial
from muster.states import SearchOutcome

__all__ = ["Pbt"]


@dataclass(frozen=True)
class _Member:
    """How one member of a generation begins: from whose checkpoint, and whether it
    explores."""

    parent: PastTrial
    replaces: int | None  # the number of the member it replaces (exploit), else None


class Pbt(Searcher):
    name = "pbt"
    continues = True

    def sampler(self, seed: int) -> BaseSampler:
        return RandomSampler(seed=seed)

    @property
    def population(self) -> int:
        assert self.config.population_size is not None, "checked by SearcherConfig"
        return self.config.population_size

    def generation(self, number: int) -> int:
        return number // self.population

    def must_end_first(self, number: int) -> range:
        generation = self.generation(number)
        if generation == 0:
            return range(0)
        return range((generation - 1) * self.population, generation * self.population)

    def draw(self, history: Sequence[PastTrial], number: int) -> Draw:
        generation = self.generation(number)
        if generation == 0:
            params, attrs = self.ask(history, number)
            return Draw(params, attrs, Lineage(generation=0))
        previous = [history[n] for n in self.must_end_first(number)]
        member = self._plan(previous)[number % self.population]
        parent = member.parent
        if member.replaces is None:
            params, changed = dict(parent.params), {}
        else:
            params = self.explore(parent.params, random.Random(self.trial_seed(number)))
            changed = {key: [parent.params.get(key), value] for key, value in params.items()
                       if parent.params.get(key) != value}
        return Draw(params, {}, Lineage(
            generation=generation, parent=parent.number, checkpoint=parent.checkpoint,
            action="continue" if member.replaces is None else "exploit",
            replaces=member.replaces, changed=changed))

    def _plan(self, previous: Sequence[PastTrial]) -> list[_Member]:
        """How each member of the next generation begins, by its place in the population
        (member i follows member i of `previous`)."""
        ranked = [p for p in previous if p.outcome is SearchOutcome.COMPLETE
                  and p.value is not None and math.isfinite(p.value)
                  and p.checkpoint is not None]
        if not ranked:
            first, last = previous[0].number, previous[-1].number
            raise NothingToDraw(
                f"no trial of generation {self.generation(first)} (trials {first + 1} to "
                f"{last + 1}) ended SUCCEEDED with the metric {self.config.metric!r} and an "
                "intact checkpoint, so population-based training has nothing to continue "
                "from; each round must report the metric and save a checkpoint")
        sign = 1.0 if self.config.smaller_is_better else -1.0
        assert all(p.value is not None for p in ranked)
        ranked.sort(key=lambda p: (sign * (p.value or 0.0), p.number))
        # The worst `cut` of the population are replaced; a member that does not rank is
        # among them (as if the worst), so only the rest of `cut` are taken from the ranked.
        # With cut <= population / 2, the best `cut` are never among the worst.
        cut = math.floor(self.config.replace_function.truncate_fraction * len(previous))
        from_ranked = max(0, cut - (len(previous) - len(ranked)))
        worst = {p.number for p in ranked[len(ranked) - from_ranked:]} if from_ranked else set()
        best = ranked[:max(1, cut)]
        kept = {p.number for p in ranked} - worst
        plan, replaced = [], 0
        for member in previous:
            if member.number in kept:
                plan.append(_Member(member, None))
            else:
                plan.append(_Member(best[replaced % len(best)], member.number))
                replaced += 1
        return plan

    def explore(self, params: Mapping[str, Any], rng: random.Random) -> dict[str, Any]:
        """The parent's values, each searched one (of `explore_function.hyperparameters`,
        when it names them) drawn again (`resample_probability`) or perturbed
        (`perturb_factor`), within its range."""
        explore = self.config.explore_function
        only = explore.hyperparameters
        found = dict(params)
        for key, param in self.space.searched().items():
            if key not in params or (only is not None and key not in only):
                continue
            if rng.random() < explore.resample_probability:
                found[key] = _resample(param, rng)
            else:
                found[key] = _perturb(param, params[key], explore.perturb_factor, rng)
        return found


def _resample(param: Searched, rng: random.Random) -> Scalar:
    if isinstance(param, Int):
        return rng.randint(param.minval, param.maxval)
    if isinstance(param, Double):
        return rng.uniform(param.minval, param.maxval)
    if isinstance(param, Log):
        return float(param.base ** rng.uniform(param.minval, param.maxval))
    return rng.choice(param.vals)


def _perturb(param: Searched, value: Any, factor: float, rng: random.Random) -> Scalar:
    """`value` times 1 ± `factor` within the range (an int moves at least by one); a
    categorical value moves to a neighbour in the order written."""
    up = rng.random() < 0.5
    if isinstance(param, Categorical):
        at = param.vals.index(value) if value in param.vals else 0
        return param.vals[min(len(param.vals) - 1, at + 1) if up else max(0, at - 1)]
    scaled = float(value) * ((1 + factor) if up else (1 - factor))
    if isinstance(param, Int):
        moved = round(scaled)
        if moved == value:
            moved = value + (1 if up else -1)
        return int(min(param.maxval, max(param.minval, moved)))
    low, high = ((param.low, param.high) if isinstance(param, Log)
                 else (param.minval, param.maxval))
    return float(min(high, max(low, scaled)))
