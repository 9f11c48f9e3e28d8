"""Stored experiment configs, validated once per experiment."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from muster.config import ExperimentConfig
from muster.store import Experiment

_CONFIGS: OrderedDict[str, ExperimentConfig] = OrderedDict()
_CONFIGS_KEPT = 4096


def experiment_config(experiment: Experiment) -> ExperimentConfig:
    """The experiment's config, validated once (a stored config never changes; the uuid is
    unique across databases), the most recent few thousand kept. Its `config` column is read
    only when the config is not kept (a query may defer it)."""
    config = kept_config(experiment.uuid)
    return config if config is not None else _validated(experiment.uuid, experiment.config)


def stored_config(uuid: str, stored: dict[str, Any]) -> ExperimentConfig:
    """`stored`, the config column of the experiment `uuid`, validated once (as
    `experiment_config`), for a caller that read the column alone."""
    config = kept_config(uuid)
    return config if config is not None else _validated(uuid, stored)


def kept_config(uuid: str) -> ExperimentConfig | None:
    """The config of the experiment `uuid` if it is kept (validated already), else None."""
    config = _CONFIGS.get(uuid)
    if config is not None:
        _CONFIGS.move_to_end(uuid)
    return config


def _validated(uuid: str, stored: dict[str, Any]) -> ExperimentConfig:
    config = _CONFIGS[uuid] = ExperimentConfig.model_validate(stored)
    if len(_CONFIGS) > _CONFIGS_KEPT:
        _CONFIGS.popitem(last=False)
    return config
