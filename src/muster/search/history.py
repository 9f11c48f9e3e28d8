"""What a searcher is told about a search's trials, and what it answers: plain data, no
Optuna, so the supervisor can build it without importing Optuna until a search runs."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from muster.states import SearchOutcome

__all__ = ["Attrs", "Judgement", "PastTrial", "trial_seed"]

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


@dataclass(frozen=True)
class Judgement:
    prune: bool
    attrs: Attrs  # the trial's system attributes after the pruner looked at it
    rung: int  # the rungs the trial has passed (where it stopped, if pruned)


def trial_seed(experiment_seed: int, number: int) -> int:
    """The seed of trial `number`'s draw: from the experiment's seed and the number alone."""
    digest = hashlib.sha256(f"{experiment_seed}/{number}".encode()).digest()
    return int.from_bytes(digest[:4], "big") % _SEED_SPACE
