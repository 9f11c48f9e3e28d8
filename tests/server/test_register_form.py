"""When a trial's page offers "Register as a model version" (`server/register_form.py`): only
where the API would take it, the form asking for a reason exactly when the trial was not
verified. A table of who, the trial and its checkpoints; the pure function, no server."""

from __future__ import annotations

from typing import Any, cast

import pytest

from muster import api
from muster.server.register_form import register_offer
from muster.services.access import Principal
from muster.states import CheckpointState, EventReason, Role, TrialState

ADMIN = Principal(1, "admin", Role.ADMIN)
ALICE = Principal(2, "alice", Role.USER)  # owns the trial
BOB = Principal(3, "bob", Role.USER)
VERA = Principal(4, "vera", Role.VIEWER)


def _trial(state: TrialState = TrialState.SUCCEEDED, verified: bool | None = True,
           reason: str | None = None) -> api.TrialDetail:
    return cast(api.TrialDetail, {"id": 7, "state": state, "verified": verified,
                                  "reason": reason})


def _checkpoint(uuid: str, *, intact: bool = True, metric: float | None = None,
                state: CheckpointState = CheckpointState.STORED) -> api.CheckpointView:
    return cast(api.CheckpointView, {"uuid": uuid, "intact": intact, "metric": metric,
                                     "state": state})


INTACT = [_checkpoint("a", metric=0.5)]
SUSPECT = _trial(TrialState.SUSPECT, verified=False)
NOT_VERIFIED = _trial(verified=False)  # a plain exit 0
REJECTED = _trial(TrialState.FAILED, verified=False, reason=EventReason.REVIEW_REJECTED)

# who, trial, checkpoints, owners may accept unverified → None (not offered) or reason_needed
CASES: list[tuple[Principal, api.TrialDetail, list[api.CheckpointView], bool, bool | None]] = [
    (ALICE, _trial(), INTACT, False, False),  # the owner, verified
    (ADMIN, _trial(), INTACT, False, False),
    (BOB, _trial(), INTACT, False, None),  # another's trial
    (VERA, _trial(), INTACT, False, None),  # a viewer
    (ALICE, SUSPECT, INTACT, False, None),  # unverified: not to its owner...
    (ALICE, SUSPECT, INTACT, True, True),  # ...unless the cluster config allows it
    (BOB, SUSPECT, INTACT, True, None),  # and then to its owner only
    (ADMIN, SUSPECT, INTACT, False, True),  # an admin, with a reason
    (ADMIN, NOT_VERIFIED, INTACT, False, True),
    (ADMIN, _trial(TrialState.RUNNING, verified=None), INTACT, False, None),  # not ended
    (ADMIN, REJECTED, INTACT, False, None),  # never
    (ADMIN, _trial(TrialState.FAILED, verified=False), INTACT, False, True),
    (ALICE, _trial(), [_checkpoint("a", intact=False)], False, None),  # none intact
    (ALICE, _trial(), [_checkpoint("a", state=CheckpointState.DELETED)], False, None),
]


@pytest.mark.parametrize(("who", "trial", "checkpoints", "owners_may", "reason_needed"), CASES)
def test_the_form_is_offered_where_the_api_would_take_it(
        who: Principal, trial: api.TrialDetail, checkpoints: list[api.CheckpointView],
        owners_may: bool, reason_needed: bool | None) -> None:
    offer = register_offer(who, trial, "alice", checkpoints, lambda: ["digits"], owners_may)
    assert (None if offer is None else offer.reason_needed) == reason_needed


def test_it_offers_the_intact_checkpoints_and_best_only_with_a_metric() -> None:
    asked: list[Any] = []
    kept = [_checkpoint("a"), _checkpoint("b", intact=False),
            _checkpoint("c", state=CheckpointState.DELETING), _checkpoint("d")]
    offer = register_offer(ALICE, _trial(), "alice", kept,
                           lambda: asked.append(1) or ["digits", "mlp"], False)
    assert offer is not None and asked == [1]
    assert ([c["uuid"] for c in offer.checkpoints], offer.models, offer.best) == (
        ["a", "d"], ["digits", "mlp"], False)
    assert [offer.offers(c) for c in kept] == [True, False, False, True]
    scored = register_offer(ALICE, _trial(), "alice", [_checkpoint("a", metric=0.1)],
                            list, False)
    assert scored is not None and scored.best
    assert register_offer(VERA, _trial(), "alice", kept, lambda: asked.append(2) or [],
                          False) is None
    assert asked == [1]  # models are read only when the form is offered
