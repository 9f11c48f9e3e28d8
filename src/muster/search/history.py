"""What a searcher is told about a search's trials, and what it answers: plain data, no
Optuna, so the supervisor can build it without importing Optuna until a search runs."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from muster.states import SearchOutcome

__all__ = ["Attrs", "Draw", "Judgement", "Lineage", "NothingToDraw", "PastTrial",
           "generation_of", "trial_seed"]

# What Optuna's sampler and pruner noted on a trial (its system attributes: a grid's id,
# Hyperband's bracket...): free JSON, theirs, kept and handed back to them unread.
Attrs = dict[str, Any]

_SEED_SPACE = 2**32


@dataclass(frozen=True)
class PastTrial:
    number: int
    outcome: SearchOutcome
    params: Mapping[str, Any]  # the values the searcher chose, by key path
    value: float | None = None  # the metric it ended with (COMPLETE only)
    intermediate: Mapping[int, float] = field(default_factory=dict)  # step -> metric
    attrs: Mapping[str, Any] = field(default_factory=dict)  # Optuna's system attributes
    # Each objective's value it ended with, in `searcher.metrics`' order (COMPLETE, and a
    # multi-objective search, only); `value` is the first.
    values: tuple[float, ...] | None = None
    # Its latest intact checkpoint's id (for a searcher that continues from checkpoints,
    # `Searcher.continues`; else None).
    checkpoint: int | None = None


@dataclass(frozen=True)
class Lineage:
    """Where a trial of population-based training comes from: the trial of the generation
    before whose checkpoint it starts from, and why (`search_state["pbt"]`)."""

    generation: int  # from 0
    parent: int | None = None  # the parent trial's number (None in generation 0)
    checkpoint: int | None = None  # the parent's checkpoint it starts from (its id)
    # "continue": the parent did well and its line goes on with the same hyperparameters;
    # "exploit": the member it replaces did poorly, so it copies a better one's checkpoint
    # and explores (`changed` holds each hyperparameter changed: [parent's, its own]).
    action: str | None = None
    replaces: int | None = None  # exploit: the number of the member it replaces
    changed: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"generation": self.generation, "parent": self.parent,
                "checkpoint": self.checkpoint, "action": self.action,
                "replaces": self.replaces, "changed": dict(self.changed)}


@dataclass(frozen=True)
class Draw:
    """A searcher's next trial: its values, the attributes the sampler noted, and (PBT) its
    lineage."""

    params: dict[str, Any]
    attrs: Attrs
    lineage: Lineage | None = None


class NothingToDraw(Exception):
    """The searcher can draw no more trials, and why (a `search stopped` event says it)."""


@dataclass(frozen=True)
class Judgement:
    prune: bool
    attrs: Attrs  # the trial's system attributes after the pruner looked at it
    rung: int  # the rungs the trial has passed (where it stopped, if pruned)


def trial_seed(experiment_seed: int, number: int) -> int:
    """The seed of trial `number`'s draw: from the experiment's seed and the number alone."""
    digest = hashlib.sha256(f"{experiment_seed}/{number}".encode()).digest()
    return int.from_bytes(digest[:4], "big") % _SEED_SPACE


def generation_of(search_state: Mapping[str, Any] | None) -> int | None:
    """A PBT trial's generation, as its `search_state` records it; None for any other."""
    lineage = (search_state or {}).get("pbt")
    generation = lineage.get("generation") if isinstance(lineage, Mapping) else None
    return generation if isinstance(generation, int) and generation >= 0 else None
