"""Warm starts: the checkpoint an experiment's trials start from, resolved at submission.

`searcher.source_trial_id` (that trial's latest intact checkpoint, Determined's meaning, or
its best with `source_checkpoint: best`), `source_checkpoint_uuid` or `source_model`
(`NAME@VERSION`, `NAME@production`, `NAME@staging`, `NAME`: a registered version) name one
checkpoint muster holds; it is resolved once, when the experiment is recorded, so a model's
stage moved later does not change what a running experiment starts from. The experiment
keeps its id (`Experiment.source_checkpoint_id`, which holds it against GC and deletes
while the experiment runs: `muster.checkpoint_storage.pins`) and what it was
(`Experiment.source`, shown as `api.WarmStartView`). Only a checkpoint's row is followed,
never a path a user writes; any user who may submit may start from any intact checkpoint
(every reader may read every checkpoint). The launch copies it into each trial's run
directory (`muster.supervise.warm_start`). It reads the registry, a layer above the create
(`muster.services.experiments`), which is handed `resolve_source` with the submission.
"""

from __future__ import annotations

import math

from sqlalchemy import select
from sqlalchemy.orm import Session

from muster import api
from muster.checkpoint_storage.metrics import checkpoint_metrics
from muster.checkpoint_storage.resume import resumable
from muster.config.problems import config_error
from muster.config.schema import SearcherConfig
from muster.errors import InvalidRequest, NotFound
from muster.services.experiments import WarmStart
from muster.services.registry import VersionRef, resolve_version
from muster.services.retention import checkpoint_row
from muster.store import Checkpoint, RegisteredModel, Trial
from muster.store.configs import experiment_config

__all__ = ["resolve_source"]


def resolve_source(s: Session, searcher: SearcherConfig, source: str) -> WarmStart | None:
    """The checkpoint the searcher's warm start names, in the caller's transaction; None
    without a warm start.

    Raises:
        ConfigError: (422) it names no checkpoint, or one that is deleted, not intact or
            of an experiment being deleted, with its key path and where to look instead.
    """
    named = searcher.warm_start()
    if named is None:
        return None
    key, value = named
    try:
        row, model, version = _checkpoint_named(s, searcher, key, value)
        _check_usable(s, row)
    except (NotFound, InvalidRequest, _Unusable) as exc:
        raise config_error(source, [f"searcher.{key}: {exc}"]) from exc
    return WarmStart(row.id, api.WarmStartView(
        named=f"{key}: {value}", checkpoint_uuid=row.uuid, checkpoint=row.name,
        step=row.step, trial_id=row.trial_id,
        experiment_id=s.get_one(Trial, row.trial_id).experiment_id,
        model=model, version=version))


class _Unusable(Exception):
    """A checkpoint that is there but cannot be started from (said why, and what to do)."""


def _checkpoint_named(s: Session, searcher: SearcherConfig, key: str, value: str
                      ) -> tuple[Checkpoint, str | None, int | None]:
    """The checkpoint row `key: value` names, and the model and version it was named by."""
    if key == "source_model":
        ref = VersionRef.parse(value)
        if s.scalar(select(RegisteredModel.id).where(RegisteredModel.name == ref.name)) is None:
            raise NotFound(f"no model named {ref.name!r}; `muster model list` shows the models")
        version = resolve_version(s, ref)
        return (s.get_one(Checkpoint, version.checkpoint_id), version.model.name,
                version.version)
    if key == "source_checkpoint_uuid":
        return checkpoint_row(s, value), None, None
    latest_or_best = searcher.source_checkpoint or "latest"  # source_trial_id's
    return _of_trial(s, int(value), latest_or_best), None, None


def _of_trial(s: Session, trial_id: int, pick: str) -> Checkpoint:
    """Trial `trial_id`'s latest intact checkpoint, or its best by its experiment's
    searcher metric (the validation each was saved after: `checkpoint_metrics`)."""
    trial = s.get(Trial, trial_id)
    if trial is None or trial.experiment.delete_requested_at is not None:
        raise NotFound(f"there is no trial {trial_id}; `muster experiment describe ID` lists "
                       "an experiment's trials")
    usable = list(s.scalars(select(Checkpoint).where(*resumable(trial_id))))
    if not usable:
        raise _Unusable(f"trial {trial_id} has no intact checkpoint to start from; `muster "
                        f"checkpoint list {trial_id}` shows its checkpoints")
    if pick == "latest":
        return max(usable, key=lambda c: (c.step, c.created_at or 0.0, c.id))
    searcher = experiment_config(trial.experiment).searcher
    metrics = checkpoint_metrics(s, usable, searcher.metric)
    scored = [(metrics[row.id][0], row) for row in usable
              if row.id in metrics and math.isfinite(metrics[row.id][0])]
    if not scored:
        raise _Unusable(f"trial {trial_id}'s checkpoints carry no {searcher.metric or 'searcher'}"
                        " metric to choose the best by; take its latest (remove "
                        "source_checkpoint) or name one by source_checkpoint_uuid")
    sign = 1 if searcher.smaller_is_better else -1
    return min(scored, key=lambda vc: (sign * vc[0], -vc[1].step))[1]


def _check_usable(s: Session, row: Checkpoint) -> None:
    what = f"checkpoint {row.uuid} ({row.name} of trial {row.trial_id})"
    listing = f"`muster checkpoint list {row.trial_id}` shows the trial's checkpoints"
    if not row.intact:
        raise _Unusable(f"{what} is not intact ({row.problem}); {listing}")
    if row.state.is_gone():
        raise _Unusable(f"{what} was deleted ({row.gc_reason}); {listing}")
    if s.get_one(Trial, row.trial_id).experiment.delete_requested_at is not None:
        raise _Unusable(f"{what} belongs to an experiment being deleted")
