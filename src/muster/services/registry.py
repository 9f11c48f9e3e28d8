"""The model registry: named models whose versions are trials' checkpoints, and the one rule
neither Determined's nor MLflow's registry knows: **only a verified trial is registered**.

A trial that is SUSPECT, not verified, or approved on review (its checks did not pass) is
registered only with `accept_unverified`: a reason, given by an admin (or by the trial's
owner, where the cluster config allows it), and the version carries that mark, with who
and when, wherever it is shown. A trial rejected on review is never registered. A version
records its lineage when it is made: the trial, experiment and owner, the checkpoint (uuid,
name, step, every file's sha256), the trial's verification (every check with its detail)
and verdict, its hyperparameters, and its rank-0 validation metrics at that checkpoint; it
does not change when the trial or its checkpoints do later.
"""

from __future__ import annotations

import hashlib
import json
import re
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from muster import api
from muster.diagnostics.code_tree import tree_of
from muster.errors import Conflict, Forbidden, InvalidRequest, NotFound
from muster.home import Home
from muster.services.access import Action, Principal, authorize
from muster.services.checkpoints import CheckpointDownload, open_any_download
from muster.services.experiments import trial_or_404
from muster.services.listing import MAX_NESTED, Page, check_window, newest_place, window
from muster.services.views import trial_verdict
from muster.states import CheckpointState, EventReason, MetricKind, ModelStage, TrialState
from muster.store import (
    Checkpoint,
    Metric,
    ModelVersion,
    RegisteredModel,
    Store,
    Trial,
    User,
    record_event,
)
from muster.store.configs import experiment_config
from muster.store.models import now

__all__ = ["CHECKPOINT_CHOICES", "MAX_PAGE", "STAGES", "VersionRef", "create_model",
           "delete_model", "delete_version", "describe_model", "describe_version", "list_models",
           "list_versions", "model_names", "open_version_download", "register_version",
           "resolve_version", "set_stage"]

MODEL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
MAX_DESCRIPTION = 4096
MAX_LABELS = 32
MAX_LABEL = 64
MAX_REASON = 1000
SHOWN_LEFT = 10  # versions a refused model delete names (and how many more)
MAX_PAGE = 1000  # models, or versions of one, in one page of a list: the default and the most
CHECKPOINT_CHOICES = ("latest", "best")  # `register --latest` / `--best`
# The stages one version at a time holds (`NAME@production`): moving another version there
# archives the one that was.
SINGLE_STAGES = (ModelStage.PRODUCTION, ModelStage.STAGING)
STAGES = tuple(stage.value for stage in ModelStage)
LATEST = "latest"


@dataclass(frozen=True)
class VersionRef:
    """Which version `NAME`, `NAME@3` (or `@v3`), `NAME@production`, `NAME@staging` or
    `NAME@latest` names: a number, a stage, or (neither) the newest version."""

    name: str
    number: int | None = None
    stage: ModelStage | None = None

    @classmethod
    def parse(cls, text: str) -> VersionRef:
        """Raises:
            InvalidRequest: not of that form (said how).
        """
        name, _, at = text.partition("@")
        _check_name(name)
        return cls(name, *_version_part(at, text)) if at else cls(name)

    def __str__(self) -> str:
        at = self.number if self.number is not None else self.stage
        return self.name if at is None else f"{self.name}@{at}"


def _version_part(at: str, text: str) -> tuple[int | None, ModelStage | None]:
    digits = at[1:] if at[:1] in "vV" else at
    if digits.isdigit() and len(digits) <= 9 and int(digits) >= 1:
        return int(digits), None
    if at == LATEST:
        return None, None
    if at in (stage.value for stage in SINGLE_STAGES):
        return None, ModelStage(at)
    raise InvalidRequest(f"{text!r} does not name a version: write NAME, NAME@3, "
                         f"NAME@production, NAME@staging or NAME@latest")


def create_model(store: Store, who: Principal, name: str, description: str = "",
                 labels: Sequence[str] = ()) -> api.RegisteredModelView:
    """A new, empty model.

    Raises:
        InvalidRequest: the name, description or labels are not acceptable (said how).
        Conflict: a model of that name exists.
        Forbidden: a viewer.
    """
    authorize(who, Action.SUBMIT)
    _check_name(name)
    if len(description) > MAX_DESCRIPTION:
        raise InvalidRequest(f"a model's description is at most {MAX_DESCRIPTION} characters")
    if len(labels) > MAX_LABELS or any(not 1 <= len(label) <= MAX_LABEL for label in labels):
        raise InvalidRequest(f"a model has at most {MAX_LABELS} labels of 1 to {MAX_LABEL} "
                             "characters each")
    with store.session_scope() as s:
        if s.scalars(select(RegisteredModel.id).where(RegisteredModel.name == name)).first():
            raise Conflict(f"a model named {name!r} exists; `muster model describe {name}` "
                           "shows it, `muster model register` adds a version to it")
        model = RegisteredModel(name=name, description=description, labels=list(labels),
                                owner_id=who.user_id)
        s.add(model)
        s.flush()
        record_event(s, entity="model", entity_id=model.id, reason=EventReason.MODEL_CREATED,
                     actor=who.name, message=f"model {name} created")
        return _model_view(s, model)


def register_version(store: Store, home: Home, who: Principal, name: str, trial_id: int, *,
                     checkpoint: str | None = None, pick: str = "latest",
                     accept_unverified: str | None = None,
                     owners_accept_unverified: bool = False) -> api.ModelVersionView:
    """Trial `trial_id`'s checkpoint as the next version of model `name`: the one named
    `checkpoint` (its uuid or name), else its `pick` ("latest", or "best" by the searcher's
    metric) among its intact checkpoints that are not deleted.

    Raises:
        NotFound: no such model, trial or checkpoint.
        Conflict: the trial is not verified and no reason accepts that, was rejected on
            review, has not ended, or has no checkpoint to register.
        Forbidden: a viewer; a user and another's trial; accepting an unverified trial
            without the right to.
        InvalidRequest: `pick` or the reason is not acceptable.
    """
    if pick not in CHECKPOINT_CHOICES:
        raise InvalidRequest(f"choose the checkpoint as one of {', '.join(CHECKPOINT_CHOICES)}"
                             f" (or name it), not {pick!r}")
    with store.session_scope() as s:
        model = _model_or_404(s, name)
        trial = trial_or_404(s, trial_id)
        if trial.experiment.delete_requested_at is not None:
            raise Conflict(f"trial {trial_id}'s experiment is being deleted: its checkpoints "
                           "cannot be registered")
        owner = trial.experiment.owner.name if trial.experiment.owner else None
        authorize(who, Action.REGISTER_MODEL, owner=owner, subject=f"trial {trial_id}")
        verdict = trial_verdict(trial)
        accepted = _accepted(trial, verdict.verified, verdict.line, who, owner,
                             accept_unverified, owners_accept_unverified)
        row = _checkpoint(s, trial, checkpoint, pick)
        number = (s.scalar(select(func.max(ModelVersion.version))
                           .where(ModelVersion.model_id == model.id)) or 0) + 1
        version = ModelVersion(
            model=model, version=number, trial_id=trial.id,
            experiment_id=trial.experiment_id, checkpoint_id=row.id,
            checkpoint_uuid=row.uuid, verified=bool(verdict.verified),
            accepted_unverified=accepted, registered_by=who.name,
            lineage=_lineage(s, home, trial, row, owner, verdict.line))
        s.add(version)
        s.flush()
        mark = (f"; unverified, accepted by {who.name}: {accepted['reason']}" if accepted
                else "")
        record_event(s, entity="model", entity_id=model.id,
                     reason=EventReason.MODEL_REGISTERED, actor=who.name,
                     experiment_id=trial.experiment_id, trial_id=trial.id,
                     message=f"{name} v{number}: checkpoint {row.name} (step {row.step}) of "
                             f"trial {trial.id}{mark}")
        return _version_view(version, name)


def list_models(store: Store, offset: int = 0, limit: int = MAX_PAGE
                ) -> Page[api.RegisteredModelView]:
    """A page of the models by name, each with its newest `MAX_NESTED` versions and the
    count of all: `limit` (at most `MAX_PAGE`, the default) from `offset`.

    Raises:
        InvalidRequest: a negative `offset`, or a `limit` not 1 to `MAX_PAGE`.
    """
    check_window(offset, limit, MAX_PAGE)
    with store.session_scope() as s:
        models, total = window(s, select(RegisteredModel).order_by(RegisteredModel.name),
                               offset, limit)
        return Page(_model_views(s, models), total, offset, limit)


def list_versions(store: Store, name: str, offset: int = 0, limit: int = MAX_PAGE
                  ) -> Page[api.ModelVersionView]:
    """A page of the model's versions, oldest first: `limit` (at most `MAX_PAGE`, the
    default) from `offset`.

    Raises:
        NotFound: no such model.
        InvalidRequest: a negative `offset`, or a `limit` not 1 to `MAX_PAGE`.
    """
    check_window(offset, limit, MAX_PAGE)
    with store.session_scope() as s:
        model = _model_or_404(s, name)
        versions, total = window(s, select(ModelVersion).where(ModelVersion.model_id == model.id)
                                 .order_by(ModelVersion.version), offset, limit)
        return Page([_version_view(v, model.name) for v in versions], total, offset, limit)


def model_names(store: Store) -> list[str]:
    """Every model's name, sorted (without loading their versions)."""
    with store.session_scope() as s:
        return list(s.scalars(select(RegisteredModel.name).order_by(RegisteredModel.name)))


def describe_model(store: Store, name: str) -> api.RegisteredModelView:
    """A model with its newest `MAX_NESTED` versions, oldest first, and the count of all
    (`list_versions` pages through every one).

    Raises:
        NotFound: no such model.
    """
    with store.session_scope() as s:
        return _model_view(s, _model_or_404(s, name))


def resolve_version(s: Session, ref: VersionRef) -> ModelVersion:
    """The version `ref` names.

    Raises:
        NotFound: no such model, or no version of it is that one.
    """
    model = _model_or_404(s, ref.name)
    mine = select(ModelVersion).where(ModelVersion.model_id == model.id)
    if ref.number is not None:
        mine = mine.where(ModelVersion.version == ref.number)
    elif ref.stage is not None:
        mine = mine.where(ModelVersion.stage == ref.stage)
    found = s.scalars(mine.order_by(ModelVersion.version.desc()).limit(1)).first()
    if found is not None:
        return found
    if s.scalar(select(ModelVersion.id).where(ModelVersion.model_id == model.id).limit(1)) \
            is None:
        raise NotFound(f"model {ref.name} has no version yet; `muster model register "
                       f"{ref.name} --trial ID` makes v1")
    raise NotFound(f"model {ref.name} has no version {ref}; `muster model versions "
                   f"{ref.name}` lists them")


def describe_version(store: Store, ref: VersionRef) -> api.ModelVersionView:
    """The version `ref` names, with its lineage.

    Raises:
        NotFound: no such model or version.
    """
    with store.session_scope() as s:
        version = resolve_version(s, ref)
        return _version_view(version, version.model.name)


def set_stage(store: Store, who: Principal, ref: VersionRef, stage: ModelStage
              ) -> api.ModelVersionView:
    """Put the version in `stage`. Production and staging hold one version each: the one
    there before is archived (both are events).

    Raises:
        NotFound: no such model or version.
        Forbidden: a viewer, or a user and a model that is not theirs.
    """
    with store.session_scope() as s:
        version = resolve_version(s, ref)
        model = version.model
        authorize(who, Action.MANAGE_MODEL, owner=_owner_name(s, model),
                  subject=f"model {model.name}")
        if version.stage is stage:
            return _version_view(version, model.name)
        moved = []
        if stage in SINGLE_STAGES:
            for other in model.versions:
                if other.stage is stage and other.id != version.id:
                    other.stage = ModelStage.ARCHIVED
                    moved.append(other.version)
        was, version.stage = version.stage, stage
        archived = "".join(f"; v{n} was {stage} and is archived" for n in moved)
        record_event(s, entity="model", entity_id=model.id, reason=EventReason.MODEL_STAGED,
                     actor=who.name, trial_id=version.trial_id,
                     experiment_id=version.experiment_id,
                     message=f"{model.name} v{version.version}: {was} → {stage}{archived}")
        return _version_view(version, model.name)


def delete_version(store: Store, who: Principal, ref: VersionRef) -> api.ModelVersionView:
    """Take a version out of the registry (an admin's): its checkpoint is no longer pinned,
    so garbage collection and `experiment delete` may then remove it. Its number is never
    given again.

    Raises:
        NotFound: no such model or version.
        Forbidden: not an admin.
    """
    authorize(who, Action.DELETE_MODEL, subject=f"model {ref.name}")
    with store.session_scope() as s:
        version = resolve_version(s, ref)
        model = version.model
        view = _version_view(version, model.name)
        s.delete(version)
        record_event(s, entity="model", entity_id=model.id,
                     reason=EventReason.MODEL_VERSION_DELETED, actor=who.name,
                     trial_id=view["trial_id"], experiment_id=view["experiment_id"],
                     message=f"{model.name} v{view['version']} deleted (checkpoint "
                             f"{view['checkpoint_uuid']} of trial {view['trial_id']} is no "
                             "longer pinned)")
        return view


def delete_model(store: Store, who: Principal, name: str) -> api.RegisteredModelView:
    """Delete a model that has no version left (an admin's).

    Raises:
        NotFound: no such model.
        Forbidden: not an admin.
        Conflict: it still has versions (they are named).
    """
    authorize(who, Action.DELETE_MODEL, subject=f"model {name}")
    with store.session_scope() as s:
        model = _model_or_404(s, name)
        left = s.scalar(select(func.count()).where(ModelVersion.model_id == model.id)) or 0
        if left:
            shown = list(s.scalars(select(ModelVersion.version)
                                   .where(ModelVersion.model_id == model.id)
                                   .order_by(ModelVersion.version).limit(SHOWN_LEFT)))
            numbers = ", ".join(f"{name}@{n}" for n in shown) + (
                f" and {left - len(shown):,} more" if left > len(shown) else "")
            raise Conflict(f"model {name} still has {left:,} version"
                           f"{'' if left == 1 else 's'} ({numbers}); delete each first "
                           f"(`muster model delete {name}@N`), then the model")
        view = _model_view(s, model)
        record_event(s, entity="model", entity_id=model.id, reason=EventReason.MODEL_DELETED,
                     actor=who.name, message=f"model {name} deleted")
        s.delete(model)
        return view


@dataclass
class VersionDownload:
    """A version's checkpoint, open and checked, sent as a tar.gz whose top directory is
    `<name>-v<version>`; a file whose sha256 fails as it is read cuts the gzip stream off
    before its end, so no client takes it for whole."""

    filename: str
    top: str
    checkpoint: CheckpointDownload

    def chunks(self) -> Iterator[bytes]:
        # Level 1: a checkpoint is mostly tensors, which gzip barely shrinks at any level.
        packer = zlib.compressobj(1, zlib.DEFLATED, 31)
        for chunk in self.checkpoint.chunks():
            if packed := packer.compress(chunk):
                yield packed
        yield packer.flush()

    def close(self) -> None:
        self.checkpoint.close()


def open_version_download(store: Store, home: Home, ref: VersionRef) -> VersionDownload:
    """The version's checkpoint, from its run directory or from storage, opened to send.

    Raises:
        NotFound: no such model or version.
        Conflict: its checkpoint is no longer intact here or in storage.
    """
    with store.session_scope() as s:
        version = resolve_version(s, ref)
        top = f"{version.model.name}-v{version.version}"
        uuid = version.checkpoint_uuid
    try:
        opened = open_any_download(store, home, uuid)
    except Conflict as exc:
        raise Conflict(f"{top}'s checkpoint cannot be sent: {exc}") from exc
    opened.plan = replace(opened.plan, name=top)
    return VersionDownload(f"{top}.tar.gz", top, opened)


# -- the rules -----------------------------------------------------------------------------


def _accepted(trial: Trial, verified: bool | None, verdict: str, who: Principal,
              owner: str | None, reason: str | None, owners_may: bool
              ) -> dict[str, Any] | None:
    """None for a verified trial; else the acceptance `reason` makes, when `who` may."""
    if trial.state is TrialState.FAILED and trial.reason == EventReason.REVIEW_REJECTED:
        raise Conflict(f"trial {trial.id} was rejected on review ({trial.message}): it can "
                       "never be registered")
    if verified:
        return None
    if not (trial.state.is_terminal() or trial.state is TrialState.SUSPECT):
        raise Conflict(f"trial {trial.id} is {trial.state}: register it once it has ended")
    who_may = "an admin" + (" or the trial's owner" if owners_may else "")
    if reason is None:
        raise Conflict(f"trial {trial.id} is not verified ({verdict}); only a verified trial "
                       f"is registered, unless {who_may} accepts it with a reason "
                       "(--accept-unverified REASON), which every view of the version shows")
    reason = reason.strip()
    if not 1 <= len(reason) <= MAX_REASON:
        raise InvalidRequest(f"the reason for accepting an unverified trial is 1 to "
                             f"{MAX_REASON} characters, and says why")
    if not (who.is_admin or (owners_may and owner == who.name)):
        raise Forbidden(f"trial {trial.id} is not verified; only {who_may} can accept it "
                        "unverified")
    return {"reason": reason, "by": who.name, "at": now()}


def _checkpoint(s: Session, trial: Trial, named: str | None, pick: str) -> Checkpoint:
    usable = [c for c in s.scalars(select(Checkpoint).where(Checkpoint.trial_id == trial.id))
              if c.intact and not c.state.is_gone()]
    if named is not None:
        found = [c for c in usable if named in (c.uuid, c.name)]
        if not found:
            raise NotFound(f"trial {trial.id} has no intact checkpoint {named!r}; `muster "
                           f"checkpoint list {trial.id}` shows them")
        return found[0]
    if not usable:
        raise Conflict(f"trial {trial.id} has no intact checkpoint to register")
    if pick == "latest":
        return max(usable, key=lambda c: (c.step, c.created_at or 0.0, c.id))
    searcher = experiment_config(trial.experiment).searcher
    scored = [(value, c) for c in usable
              if (value := _metric_at(s, trial.id, c.step, searcher.metric)) is not None]
    if searcher.metric is None or not scored:
        raise Conflict(f"trial {trial.id}'s checkpoints have no {searcher.metric or 'searcher'}"
                       " metric to choose the best by; name the checkpoint, or take --latest")
    sign = 1 if searcher.smaller_is_better else -1
    return min(scored, key=lambda vc: (sign * vc[0], -vc[1].step))[1]


def _metric_at(s: Session, trial_id: int, step: int, metric: str | None) -> float | None:
    values = _validation_at(s, trial_id, step)
    value = values.get(metric) if metric else None
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) \
        else None


def _validation_at(s: Session, trial_id: int, step: int) -> dict[str, Any]:
    """Rank 0's last validation report at or before `step` (of the latest attempt that
    reported one)."""
    row = s.scalars(select(Metric).where(
        Metric.trial_id == trial_id, Metric.kind == MetricKind.VALIDATION, Metric.rank == 0,
        Metric.step <= step).order_by(Metric.step.desc(), Metric.attempt.desc(),
                                      Metric.id.desc()).limit(1)).first()
    return dict(row.values) if row is not None and isinstance(row.values, dict) else {}


def snapshot_key(home: Home, trial: Trial) -> dict[str, Any]:
    """What the trial was made of, as keys (`muster trial diff` compares the whole): its
    code's tree hash, its config's sha256, its environment's key, its data's fingerprint."""
    config = json.dumps(trial.experiment.config, sort_keys=True).encode()
    return {"code": tree_of(home.context_dir(trial.experiment.uuid))["tree_sha256"],
            "config_sha256": hashlib.sha256(config).hexdigest(),
            "environment": trial.experiment.environment_key,
            "data": (trial.manifest or {}).get("fingerprint")}


def _lineage(s: Session, home: Home, trial: Trial, row: Checkpoint, owner: str | None,
             verdict: str) -> dict[str, Any]:
    return {
        "trial_id": trial.id, "trial_uuid": trial.uuid, "experiment_id": trial.experiment_id,
        "experiment": trial.experiment.name, "owner": owner, "hparams": trial.hparams,
        "checkpoint": {"uuid": row.uuid, "name": row.name, "step": row.step,
                       "attempt": row.attempt, "size_bytes": row.size_bytes,
                       "file_count": row.file_count,
                       "stored": row.state is CheckpointState.STORED},
        "verification": trial.verification, "verdict": verdict,
        "metrics": _validation_at(s, trial.id, row.step),
        "snapshot": snapshot_key(home, trial),
        "source": trial.experiment.source,  # the warm start it began from (`warm_starts`)
    }


def _check_name(name: str) -> None:
    if not MODEL_NAME.fullmatch(name):
        raise InvalidRequest(f"a model's name is 1 to 128 letters, digits and . _ -, the first "
                             f"a letter or digit; got {name!r}")


def _owner_name(s: Session, model: RegisteredModel) -> str | None:
    owner = s.get(User, model.owner_id) if model.owner_id is not None else None
    return owner.name if owner is not None else None


def _model_or_404(s: Session, name: str) -> RegisteredModel:
    _check_name(name)
    model = s.scalars(select(RegisteredModel).where(RegisteredModel.name == name)).first()
    if model is None:
        raise NotFound(f"no model named {name!r}; `muster model create {name}` makes it")
    return model


# -- views ---------------------------------------------------------------------------------


def _model_view(s: Session, model: RegisteredModel) -> api.RegisteredModelView:
    return _model_views(s, [model])[0]


def _model_views(s: Session, models: Sequence[RegisteredModel]
                 ) -> list[api.RegisteredModelView]:
    """The views of `models`, their versions read in two queries whatever their number."""
    newest, totals = _newest_versions(s, [model.id for model in models])
    return [api.RegisteredModelView(
        name=model.name, description=model.description, labels=list(model.labels),
        created_at=model.created_at,
        versions=[_version_view(v, model.name) for v in newest.get(model.id, [])],
        versions_total=totals.get(model.id, 0)) for model in models]


def _newest_versions(s: Session, model_ids: Sequence[int]
                     ) -> tuple[dict[int, list[ModelVersion]], dict[int, int]]:
    """The newest `MAX_NESTED` versions of each model, oldest first, and how many each has,
    by model id."""
    if not model_ids:
        return {}, {}
    mine = ModelVersion.model_id.in_(model_ids)
    totals = {model_id: n for model_id, n in s.execute(
        select(ModelVersion.model_id, func.count()).where(mine)
        .group_by(ModelVersion.model_id))}
    ranked = select(ModelVersion.id, newest_place(ModelVersion.model_id, ModelVersion.version)
                    ).where(mine).subquery()
    newest: dict[int, list[ModelVersion]] = {}
    for version in s.scalars(select(ModelVersion).join(ranked, ranked.c.id == ModelVersion.id)
                             .where(ranked.c.place <= MAX_NESTED)
                             .order_by(ModelVersion.model_id, ModelVersion.version)):
        newest.setdefault(version.model_id, []).append(version)
    return newest, totals


def _version_view(version: ModelVersion, name: str) -> api.ModelVersionView:
    lineage = version.lineage or {}
    accepted = version.accepted_unverified
    return api.ModelVersionView(
        model=name, version=version.version, stage=version.stage,
        trial_id=version.trial_id, experiment_id=version.experiment_id,
        checkpoint_uuid=version.checkpoint_uuid, verified=version.verified,
        accepted_unverified=None if accepted is None else api.AcceptedUnverified(
            reason=str(accepted["reason"]), by=str(accepted["by"]), at=float(accepted["at"])),
        metrics=lineage.get("metrics", {}),
        snapshot=lineage.get("snapshot", {}), lineage=lineage,
        registered_by=version.registered_by,
        registered_at=version.registered_at)
