"""What a trial's page offers to register as a model version: its "Register" form and the
button on each checkpoint row (`templates/_trial_register.html`, `static/register.js`,
which post to `POST /api/v1/models/{name}/versions`).

The form is offered only where the API would take it: to one who may register from the
trial (the one authorization table: its owner, or an admin), once the trial is at rest and
not rejected on review, with a checkpoint that is intact and not deleted; for a trial that
was not verified, only to one who may accept it with a reason (an admin, or the owner where
the cluster config allows it), and the form then asks for that reason. The server decides
in the end: what it refuses, the page shows in its own words.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from muster import api
from muster.errors import Forbidden
from muster.services.access import Action, Principal, authorize
from muster.states import EventReason, TrialState

__all__ = ["RegisterOffer", "register_offer"]


@dataclass(frozen=True)
class RegisterOffer:
    """The trial page's Register form: what it offers to pick from."""

    models: list[str]  # the models a version can join, by name (or a new one)
    checkpoints: list[api.CheckpointView]  # intact and not deleted, by step
    best: bool  # a checkpoint carries the searcher's metric: "best" can be picked
    reason_needed: bool  # not verified: registered only with a reason, and marked

    def offers(self, checkpoint: api.CheckpointView) -> bool:
        """Whether a checkpoint row gets its own Register button."""
        return any(c["uuid"] == checkpoint["uuid"] for c in self.checkpoints)


def register_offer(who: Principal, trial: api.TrialDetail, owner: str | None,
                   checkpoints: Sequence[api.CheckpointView], model_names: Callable[[], list[str]],
                   owners_accept_unverified: bool) -> RegisterOffer | None:
    """The trial page's Register form for `who`, or None where it is not offered.
    `model_names` is called only when the form is offered."""
    if not _may_register(who, owner, trial["id"]) or not _registrable(trial):
        return None
    reason_needed = not trial["verified"]
    if reason_needed and not (who.is_admin or (owners_accept_unverified and owner == who.name)):
        return None
    usable = [c for c in checkpoints if c["intact"] and not c["state"].is_gone()]
    if not usable:
        return None
    return RegisterOffer(models=model_names(), checkpoints=usable,
                         best=any(c["metric"] is not None for c in usable),
                         reason_needed=reason_needed)


def _may_register(who: Principal, owner: str | None, trial_id: int) -> bool:
    try:
        authorize(who, Action.REGISTER_MODEL, owner=owner, subject=f"trial {trial_id}")
    except Forbidden:
        return False
    return True


def _registrable(trial: api.TrialDetail) -> bool:
    """At rest, and not rejected on review (which is never registered)."""
    rejected = (trial["state"] is TrialState.FAILED
                and trial["reason"] == EventReason.REVIEW_REJECTED)
    return trial["state"].is_at_rest() and not rejected
