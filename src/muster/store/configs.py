"""Stored experiment configs, read back: the one place that validates the `config` column.

A stored config never changes through muster and an experiment's uuid is unique across
databases, so each is validated once and kept by uuid, the most recent few thousand
(`KEPT`); a reader that loaded the column anyway is answered only from a kept value made
from the same JSON (a row rewritten under the server is read again). The pieces
some readers need from many experiments at once, without keeping every config whole (the
queue's `resources`, a listing's `searcher`), have readers of their own here.
"""

from __future__ import annotations

import copy
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar

import sqlalchemy

from muster.config import ExperimentConfig, ResourcesConfig
from muster.config.schema import SearcherConfig
from muster.store.models import Experiment

__all__ = ["KEPT", "experiment_config", "experiment_resources", "experiment_searcher",
           "kept_config", "stored_config", "stored_searcher"]

# Configs (and, apart, searcher blocks) kept validated: a config kept costs ~24 KB, so the
# 4,096 of before grew a busy server by ~100 MB over its first thousands of experiments
# (the chaos soak's RSS check, issue 37); the live experiments of a pass fit in far fewer.
KEPT = 512

T = TypeVar("T")


class _Kept(Generic[T]):
    """Validated values by experiment uuid, each with the stored JSON it was made from, the
    least recently used dropped past `KEPT`. Shared by the supervisor's passes, the
    requests' threads and the storage worker.

    A stored config never changes through muster, but a row rewritten under a running server
    (a restored backup, a hand edit) must not be answered from the old one: a reader that
    holds the stored JSON passes it, and a kept value made from other JSON is made again."""

    def __init__(self) -> None:
        self._values: OrderedDict[str, tuple[Any, T]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, uuid: str, source: Any = None) -> T | None:
        """The kept value of `uuid`; None when there is none, or when `source` (the stored
        JSON, if the caller read it) is not what it was made from."""
        with self._lock:
            found = self._values.get(uuid)
            if found is None or (source is not None and found[0] != source):
                return None
            self._values.move_to_end(uuid)
            return found[1]

    def get_or_make(self, uuid: str, source: Any, make: Callable[[], T]) -> T:
        found = self.get(uuid, source)
        if found is not None:
            return found
        value = make()  # outside the lock: a validation may take a while
        with self._lock:
            self._values[uuid] = (copy.deepcopy(source), value)
            self._values.move_to_end(uuid)
            if len(self._values) > KEPT:
                self._values.popitem(last=False)
        return value


_CONFIGS: _Kept[ExperimentConfig] = _Kept()
_SEARCHERS: _Kept[SearcherConfig] = _Kept()


def experiment_config(experiment: Experiment) -> ExperimentConfig:
    """The experiment's config, validated once. Its `config` column is read only when the
    config is not kept (a query may defer it).

    Raises:
        pydantic.ValidationError: the stored config is no longer valid.
    """
    if _deferred(experiment, "config"):
        config = kept_config(experiment.uuid)
        if config is not None:
            return config
    return stored_config(experiment.uuid, experiment.config)


def stored_config(uuid: str, stored: Mapping[str, Any]) -> ExperimentConfig:
    """`stored`, the config column of the experiment `uuid`, validated once (as
    `experiment_config`), for a caller that read the column alone."""
    return _CONFIGS.get_or_make(uuid, stored, lambda: ExperimentConfig.model_validate(stored))


def kept_config(uuid: str) -> ExperimentConfig | None:
    """The config of the experiment `uuid` if it is kept (validated already), else None."""
    return _CONFIGS.get(uuid)


def _deferred(row: Experiment, column: str) -> bool:
    """Whether `row`'s `column` was left out of its query (reading it would cost one)."""
    return column in sqlalchemy.inspect(row).unloaded


def experiment_resources(uuid: str, stored: Mapping[str, Any]) -> ResourcesConfig:
    """The `resources` of the experiment `uuid`, whose config column is `stored`: the kept
    config's, else validated without keeping it (the queue may hold 10,000 experiments,
    whose configs must not push out the running ones').

    Raises:
        pydantic.ValidationError: the stored config is no longer valid.
    """
    config = kept_config(uuid)
    if config is None:
        config = ExperimentConfig.model_validate(stored)
    return config.resources


def experiment_searcher(experiment: Experiment) -> SearcherConfig:
    """The experiment's `searcher` block; experiments from before search ran `single`."""
    if _deferred(experiment, "config"):
        kept = _SEARCHERS.get(experiment.uuid)
        if kept is not None:
            return kept
    return stored_searcher(experiment.uuid, experiment.config.get("searcher"))


def stored_searcher(uuid: str, block: Mapping[str, Any] | None) -> SearcherConfig:
    """`block`, the stored config's `searcher` of the experiment `uuid` (None: it has none,
    from before search), validated once; the rest of the config is not validated."""
    block = {} if block is None else block
    return _SEARCHERS.get_or_make(uuid, block, lambda: SearcherConfig.model_validate(block))
