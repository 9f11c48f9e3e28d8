"""The checkpoint garbage-collection planner: Determined's examples, muster's safety rule,
ties, and properties over random experiments (metric attribution: test_metrics.py)."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from muster.checkpoint_storage.planner import (
    BEING_UPLOADED,
    DELETION_BEGUN,
    NOT_INTACT,
    CheckpointFacts,
    Decision,
    Policy,
    plan,
)
from muster.states import CheckpointState

S = CheckpointState
NAN, INF = math.nan, math.inf


def ck(
    id: int,
    trial: int = 1,
    *,
    step: int | None = None,
    metric: float | None = None,
    metric_step: int | None = None,
    state: CheckpointState = S.STORED,
    intact: bool = True,
) -> CheckpointFacts:
    """A checkpoint whose step is its id unless told otherwise."""
    order = (id if step is None else step, float(id), f"ckpt-{id}")
    return CheckpointFacts(id, trial, order, intact, state, metric, metric_step)


def kept(decisions: Sequence[Decision]) -> set[int]:
    return {d.checkpoint_id for d in decisions if d.keep}


def by_id(decisions: Sequence[Decision]) -> dict[int, Decision]:
    return {d.checkpoint_id: d for d in decisions}


# --- Determined's worked example ----------------------------------------------------------
# Source: Determined's experiment configuration reference, "Checkpoint Garbage Collection →
# Examples" (checkpoint_storage.save_experiment_best / save_trial_best / save_trial_latest).
# smaller_is_better; the checkpoint's order is its id; all intact and stored; both trials
# are terminal. Each checkpoint's metric is a validation at its own step.

DETERMINED_EXAMPLE = [
    ck(id, trial, metric=metric, metric_step=None if metric is None else id)
    for trial, id, metric in [
        (1, 1, None),
        (1, 2, None),
        (1, 3, 0.6),
        (1, 4, 0.5),
        (1, 5, 0.4),
        (2, 6, None),
        (2, 7, 0.2),
        (2, 8, 0.3),
        (2, 9, None),
        (2, 10, None),
    ]
]


@pytest.mark.parametrize(
    ("experiment_best", "trial_best", "trial_latest", "expected"),
    [
        pytest.param(0, 0, 0, set(), id="exp0-best0-latest0"),
        pytest.param(2, 0, 0, {8, 7}, id="exp2-best0-latest0"),
        pytest.param(5, 0, 0, {8, 7, 5, 4, 3}, id="exp5-best0-latest0"),
        pytest.param(9, 0, 0, {8, 7, 5, 4, 3}, id="exp9-best0-latest0"),
        pytest.param(0, 1, 0, {7, 5}, id="exp0-best1-latest0"),
        pytest.param(0, 3, 0, {8, 7, 5, 4, 3}, id="exp0-best3-latest0"),
        pytest.param(0, 7, 0, {8, 7, 5, 4, 3}, id="exp0-best7-latest0"),
        pytest.param(0, 0, 1, {10, 5}, id="exp0-best0-latest1"),
        pytest.param(0, 0, 3, {10, 9, 8, 5, 4, 3}, id="exp0-best0-latest3"),
        pytest.param(2, 1, 0, {8, 7, 5}, id="exp2-best1-latest0"),
        pytest.param(2, 0, 1, {10, 8, 7, 5}, id="exp2-best0-latest1"),
        pytest.param(0, 1, 1, {10, 7, 5}, id="exp0-best1-latest1"),
        pytest.param(2, 1, 1, {10, 8, 7, 5}, id="exp2-best1-latest1"),
    ],
)
def test_determined_worked_example(
    experiment_best: int, trial_best: int, trial_latest: int, expected: set[int]
) -> None:
    policy = Policy(
        save_trial_latest=trial_latest,
        save_trial_best=trial_best,
        save_experiment_best=experiment_best,
    )
    decisions = plan(DETERMINED_EXAMPLE, set(), policy, smaller_is_better=True)
    assert kept(decisions) == expected
    assert [d.checkpoint_id for d in decisions] == list(range(1, 11))


def test_determined_example_reasons() -> None:
    policy = Policy(save_trial_latest=1, save_trial_best=1, save_experiment_best=2)
    decisions = by_id(plan(DETERMINED_EXAMPLE, set(), policy, smaller_is_better=True))
    assert decisions[5].reasons == (
        "among trial 1's latest 1",
        "among trial 1's best 1 (metric 0.4 at step 5)",
    )
    assert decisions[7].reasons == (
        "among trial 2's best 1 (metric 0.2 at step 7)",
        "among the experiment's best 2 (metric 0.2 at step 7)",
    )
    assert decisions[4].reasons == (
        "not among trial 1's latest 1 or best 1, nor the experiment's best 2",
    )


# --- muster's rules, one table --------------------------------------------------------------

NOTHING = Policy(save_trial_latest=0, save_trial_best=0, save_experiment_best=0)
LATEST_1 = Policy(save_trial_latest=1, save_trial_best=0)
BEST_1 = Policy(save_trial_latest=0, save_trial_best=1)


@pytest.mark.parametrize(
    ("checkpoints", "may_still_run", "policy", "smaller_is_better", "expected"),
    [
        pytest.param(
            [ck(1), ck(2), ck(3)], {1}, NOTHING, True, {3}, id="running-trial-keeps-its-latest"
        ),
        pytest.param([ck(1), ck(2), ck(3)], set(), NOTHING, True, set(), id="terminal-keeps-none"),
        pytest.param(
            [ck(1), ck(2), ck(3, intact=False)],
            {1},
            NOTHING,
            True,
            {2, 3},
            id="latest-corrupt-previous-intact-protected",
        ),
        pytest.param(
            [ck(1), ck(2, state=S.DELETING), ck(3, state=S.DELETED)],
            {1},
            NOTHING,
            True,
            {1},
            id="protection-skips-deleting-and-deleted",
        ),
        pytest.param(
            [ck(1, 1), ck(2, 2), ck(3, 1), ck(4, 2)],
            {2},
            NOTHING,
            True,
            {4},
            id="protection-only-for-trials-that-may-run",
        ),
        pytest.param(
            [ck(1, metric=0.1), ck(2, metric=0.9), ck(3, metric=0.5)],
            set(),
            BEST_1,
            False,
            {2},
            id="larger-is-better",
        ),
        pytest.param(
            [ck(1, metric=0.1), ck(2, metric=0.9), ck(3, metric=0.5)],
            set(),
            BEST_1,
            True,
            {1},
            id="smaller-is-better",
        ),
        pytest.param(
            [ck(1, metric=NAN), ck(2, metric=-INF), ck(3, metric=0.5), ck(4)],
            set(),
            BEST_1,
            True,
            {3},
            id="nan-and-inf-are-no-metric",
        ),
        pytest.param(
            [ck(1, metric=NAN), ck(2, metric=INF)], set(), BEST_1, False, set(), id="no-finite"
        ),
        pytest.param(
            [ck(1), ck(2), ck(3), ck(4), ck(5)],
            set(),
            Policy(save_trial_latest=2, save_trial_best=0),
            True,
            {4, 5},
            id="exactly-n-latest",
        ),
        pytest.param(
            [ck(1, state=S.LOCAL), ck(2, state=S.UPLOAD_FAILED), ck(3, state=S.LOCAL)],
            set(),
            LATEST_1,
            True,
            {3},
            id="local-and-upload-failed-are-candidates",
        ),
        pytest.param(
            [ck(1), ck(2, state=S.UPLOADING)],
            set(),
            LATEST_1,
            True,
            {2},
            id="uploading-pushes-older-out",
        ),
        pytest.param(
            [ck(1), ck(2, state=S.UPLOADING)],
            set(),
            NOTHING,
            True,
            {2},
            id="uploading-kept-whatever-the-policy",
        ),
        pytest.param(
            [ck(1), ck(2, state=S.DELETING)],
            set(),
            LATEST_1,
            True,
            {1},
            id="deleting-does-not-count",
        ),
        pytest.param(
            [ck(1), ck(2, intact=False)], set(), LATEST_1, True, {1, 2}, id="corrupt-not-counted"
        ),
        pytest.param(
            [ck(1, step=10), ck(2, step=5)], set(), LATEST_1, True, {1}, id="latest-is-by-order"
        ),
    ],
)
def test_rules(
    checkpoints: list[CheckpointFacts],
    may_still_run: set[int],
    policy: Policy,
    smaller_is_better: bool,
    expected: set[int],
) -> None:
    assert kept(plan(checkpoints, may_still_run, policy, smaller_is_better)) == expected


@pytest.mark.parametrize(
    ("checkpoints", "winner"),
    [
        pytest.param(
            [
                ck(1, step=50, metric=0.2, metric_step=30),
                ck(2, step=60, metric=0.2, metric_step=55),
            ],
            2,
            id="closest-after-its-validation-before-earlier-order",
        ),
        pytest.param(
            [
                ck(1, step=50, metric=0.2, metric_step=50),
                ck(2, step=40, metric=0.2, metric_step=40),
            ],
            2,
            id="same-distance-earlier-order",
        ),
        pytest.param(
            [ck(1, step=40, metric=0.2), ck(2, step=60, metric=0.2, metric_step=40)],
            2,
            id="unknown-validation-step-ranks-last",
        ),
        pytest.param(
            [
                ck(7, step=40, metric=0.2, metric_step=40),
                ck(3, step=40, metric=0.2, metric_step=40),
            ],
            3,
            id="same-step-earlier-saved-at",
        ),
        pytest.param(
            [
                ck(1, step=50, metric=0.3, metric_step=50),
                ck(2, step=90, metric=0.2, metric_step=10),
            ],
            2,
            id="metric-before-distance",
        ),
    ],
)
def test_best_ties(checkpoints: list[CheckpointFacts], winner: int) -> None:
    for shuffled in (checkpoints, checkpoints[::-1]):
        assert kept(plan(shuffled, set(), BEST_1, smaller_is_better=True)) == {winner}


def test_same_order_tie_goes_to_the_greater_id_for_latest() -> None:
    twins = [CheckpointFacts(i, 1, (5, 0.0, "same"), True, S.STORED) for i in (4, 9)]
    assert kept(plan(twins, set(), LATEST_1, smaller_is_better=True)) == {9}


def test_reasons_of_each_kind() -> None:
    checkpoints = [
        ck(1, 3),
        ck(2, 3),
        ck(3, 3, state=S.DELETING),
        ck(4, 3, state=S.DELETED),
        ck(5, 3, intact=False),
        ck(6, 4, state=S.UPLOADING),
    ]
    decisions = by_id(plan(checkpoints, {3, 4}, LATEST_1, smaller_is_better=True))
    assert 4 not in decisions
    assert decisions[1] == Decision(
        1,
        keep=False,
        reasons=("not among trial 3's latest 1 or best 0, nor the experiment's best 0",),
    )
    assert decisions[2] == Decision(
        2,
        keep=True,
        reasons=(
            "among trial 3's latest 1",
            "the latest intact checkpoint of trial 3, which may still run",
        ),
    )
    assert decisions[3] == Decision(3, keep=False, reasons=(DELETION_BEGUN,))
    assert decisions[5] == Decision(5, keep=True, reasons=(NOT_INTACT,))
    assert decisions[6] == Decision(
        6,
        keep=True,
        reasons=(
            BEING_UPLOADED,
            "among trial 4's latest 1",
            "the latest intact checkpoint of trial 4, which may still run",
        ),
    )


def test_protection_reason_when_counts_are_zero() -> None:
    decisions = plan([ck(1, 3), ck(2, 3)], {3}, NOTHING, smaller_is_better=True)
    assert decisions == [
        Decision(
            1, False, ("not among trial 3's latest 0 or best 0, nor the experiment's best 0",)
        ),
        Decision(2, True, ("the latest intact checkpoint of trial 3, which may still run",)),
    ]


def test_a_live_trials_latest_stored_stays_until_a_later_one_is_stored() -> None:
    """Losing the trial's disk must not lose every resume point: while its latest is only
    local (or uploading, or failed to upload), its latest stored one is kept too."""
    for pending in (S.LOCAL, S.UPLOADING, S.UPLOAD_FAILED):
        decisions = by_id(plan([ck(1, 3), ck(2, 3), ck(3, 3, state=pending)], {3}, NOTHING,
                               smaller_is_better=True))
        assert [decisions[i].keep for i in (1, 2, 3)] == [False, True, True], pending
        assert decisions[2].reasons == ("the latest stored checkpoint of trial 3, which may "
                                        "still run, kept until a later one is stored",)
    once_stored = by_id(plan([ck(2, 3), ck(3, 3)], {3}, NOTHING, smaller_is_better=True))
    assert [once_stored[i].keep for i in (2, 3)] == [False, True]
    ended = by_id(plan([ck(2, 3), ck(3, 3, state=S.LOCAL)], set(), NOTHING,
                       smaller_is_better=True))
    assert [ended[i].keep for i in (2, 3)] == [False, False]


def test_metric_without_a_step_in_the_reason() -> None:
    (decision,) = plan([ck(1, metric=0.25)], set(), BEST_1, smaller_is_better=True)
    assert decision.reasons == ("among trial 1's best 1 (metric 0.25)",)


def test_output_is_by_trial_then_order() -> None:
    checkpoints = [ck(5, 2, step=1), ck(1, 1, step=9), ck(2, 2, step=0), ck(3, 1, step=2)]
    decisions = plan(checkpoints, set(), NOTHING, smaller_is_better=True)
    assert [d.checkpoint_id for d in decisions] == [3, 1, 2, 5]


def test_empty() -> None:
    assert plan([], {1}, Policy(), smaller_is_better=True) == []


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"save_trial_latest": -1}, "save_trial_latest=-1"),
        ({"save_trial_best": True}, "save_trial_best=True"),
        ({"save_experiment_best": 1.0}, "save_experiment_best=1.0"),
        ({"save_trial_latest": "2"}, "save_trial_latest='2'"),
    ],
)
def test_policy_rejects(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match="must be a whole number >= 0") as caught:
        Policy(**kwargs)  # type: ignore[arg-type]
    assert message in str(caught.value)


def test_policy_defaults_are_determineds() -> None:
    assert Policy() == Policy(save_trial_latest=1, save_trial_best=1, save_experiment_best=0)


def test_state_values_are_the_stored_words() -> None:
    assert [s.value for s in S] == [
        "local",
        "uploading",
        "stored",
        "upload_failed",
        "deleting",
        "deleted",
    ]
    assert [s for s in S if s.is_terminal()] == [S.DELETED]


# --- properties over random experiments -------------------------------------------------------

TRIALS = (1, 2, 3, 4)
metrics = st.one_of(
    st.none(),
    st.just(NAN),
    st.floats(allow_nan=False, allow_infinity=True),
    st.sampled_from([0.1, 0.2, 0.3]),  # ties
)


@st.composite
def experiments(draw: st.DrawFn) -> list[CheckpointFacts]:
    count = draw(st.integers(0, 14))
    checkpoints: list[CheckpointFacts] = []
    for id in range(1, count + 1):
        step = draw(st.integers(0, 4))  # duplicate steps on purpose
        order = (step, draw(st.sampled_from([0.0, 1.0])), draw(st.sampled_from(["a", "b"])))
        metric = draw(metrics)
        metric_step = draw(st.one_of(st.none(), st.integers(0, step)))
        checkpoints.append(
            CheckpointFacts(
                id=id,
                trial_id=draw(st.sampled_from(TRIALS)),
                order=order,
                intact=draw(st.booleans()),
                state=draw(st.sampled_from(list(S))),
                metric=metric,
                metric_step=metric_step,
            )
        )
    return checkpoints


policies = st.builds(
    Policy,
    save_trial_latest=st.integers(0, 4),
    save_trial_best=st.integers(0, 4),
    save_experiment_best=st.integers(0, 4),
)


def counts(c: CheckpointFacts) -> bool:
    """Whether the checkpoint counts toward the policy: intact, and not being deleted."""
    return c.intact and c.state not in (S.DELETING, S.DELETED)


def finite(c: CheckpointFacts) -> bool:
    return c.metric is not None and math.isfinite(c.metric)


def holders(decisions: dict[int, Decision], prefix: str) -> set[int]:
    return {i for i, d in decisions.items() if any(r.startswith(prefix) for r in d.reasons)}


def signed(c: CheckpointFacts, smaller_is_better: bool) -> float:
    assert c.metric is not None
    return c.metric if smaller_is_better else -c.metric


@settings(max_examples=300, deadline=None)
@given(
    experiments(),
    st.sets(st.sampled_from(TRIALS)),
    policies,
    st.booleans(),
    st.randoms(use_true_random=False),
)
def test_plan_properties(
    checkpoints: list[CheckpointFacts],
    may_still_run: set[int],
    policy: Policy,
    smaller_is_better: bool,
    rnd: random.Random,
) -> None:
    result = plan(checkpoints, may_still_run, policy, smaller_is_better)
    decisions = by_id(result)

    # (c) DELETED left out, DELETING deleted; everything else decided, with a reason
    assert set(decisions) == {c.id for c in checkpoints if c.state is not S.DELETED}
    for c in checkpoints:
        if c.state is S.DELETING:
            assert decisions[c.id] == Decision(c.id, False, (DELETION_BEGUN,))
    assert all(d.reasons for d in result)
    assert all(len(d.reasons) == 1 for d in result if not d.keep)

    # (d) deterministic: the same experiment in another order gives the same plan
    shuffled = list(checkpoints)
    rnd.shuffle(shuffled)
    assert plan(shuffled, may_still_run, policy, smaller_is_better) == result

    counted = [c for c in checkpoints if counts(c)]
    with_metric = [c for c in counted if finite(c)]
    exp_best = holders(decisions, "among the experiment's best")
    assert len(exp_best) == min(policy.save_experiment_best, len(with_metric))
    assert_best(exp_best, with_metric, smaller_is_better)

    for trial in TRIALS:
        group = [c for c in counted if c.trial_id == trial]
        group_metric = [c for c in group if finite(c)]

        # (a) a trial that may still run keeps its latest intact checkpoint
        if trial in may_still_run and group:
            latest = max(group, key=lambda c: (c.order, c.id))
            assert decisions[latest.id].keep

        # (b) exactness: each rule keeps exactly min(n, what it may choose from)
        latest_ids = holders(decisions, f"among trial {trial}'s latest")
        assert len(latest_ids) == min(policy.save_trial_latest, len(group))
        assert_latest(latest_ids, group)
        best_ids = holders(decisions, f"among trial {trial}'s best")
        assert len(best_ids) == min(policy.save_trial_best, len(group_metric))
        assert_best(best_ids, group_metric, smaller_is_better)

        # nothing that counts is kept beyond what the rules (and uploading) ask for
        candidates = [c for c in group if c.state is not S.UPLOADING]
        kept_candidates = {c.id for c in candidates if decisions[c.id].keep}
        protected = holders(decisions, f"the latest intact checkpoint of trial {trial}")
        fallback = holders(decisions, f"the latest stored checkpoint of trial {trial}")
        assert kept_candidates <= latest_ids | best_ids | exp_best | protected | fallback
        limit = policy.save_trial_latest + policy.save_trial_best + policy.save_experiment_best
        assert len(kept_candidates) <= limit + 2 * (trial in may_still_run)
        assert len(protected) == (1 if trial in may_still_run and group else 0)

        # (e) while a live trial's latest is not stored, its latest stored one stays
        stored = [c for c in group if c.state is S.STORED]
        if trial in may_still_run and group and stored:
            latest = max(group, key=lambda c: (c.order, c.id))
            if latest.state is not S.STORED:
                newest_stored = max(stored, key=lambda c: (c.order, c.id))
                assert decisions[newest_stored.id].keep
                assert fallback == {newest_stored.id}
        else:
            assert fallback == set()


def assert_latest(chosen: set[int], group: list[CheckpointFacts]) -> None:
    """No checkpoint left out is later than one chosen."""
    if chosen:
        oldest_chosen = min(c.order for c in group if c.id in chosen)
        assert all(c.order <= oldest_chosen for c in group if c.id not in chosen)


def assert_best(chosen: set[int], group: list[CheckpointFacts], smaller_is_better: bool) -> None:
    """Only finite metrics are chosen, and none left out is better than one chosen."""
    assert chosen <= {c.id for c in group}
    if chosen:
        worst_chosen = max(signed(c, smaller_is_better) for c in group if c.id in chosen)
        left_out = [signed(c, smaller_is_better) for c in group if c.id not in chosen]
        assert all(value >= worst_chosen for value in left_out)


@settings(max_examples=200, deadline=None)
@given(experiments(), st.integers(0, 4), st.booleans())
def test_latest_alone_keeps_exactly_n_per_terminal_trial(
    checkpoints: list[CheckpointFacts], n: int, smaller_is_better: bool
) -> None:
    policy = Policy(save_trial_latest=n, save_trial_best=0, save_experiment_best=0)
    decisions = by_id(plan(checkpoints, set(), policy, smaller_is_better))
    for trial in TRIALS:
        group = sorted(
            (c for c in checkpoints if c.trial_id == trial and counts(c)),
            key=lambda c: (c.order, c.id),
        )
        expected = {c.id for c in group[len(group) - min(n, len(group)) :]}
        expected |= {c.id for c in group if c.state is S.UPLOADING}
        assert {c.id for c in group if decisions[c.id].keep} == expected


@settings(max_examples=200, deadline=None)
@given(experiments(), st.integers(0, 4), st.booleans())
def test_best_alone_keeps_exactly_n_per_terminal_trial(
    checkpoints: list[CheckpointFacts], n: int, smaller_is_better: bool
) -> None:
    policy = Policy(save_trial_latest=0, save_trial_best=n, save_experiment_best=0)
    decisions = by_id(plan(checkpoints, set(), policy, smaller_is_better))
    for trial in TRIALS:
        group = [c for c in checkpoints if c.trial_id == trial and counts(c)]
        settled = [c for c in group if c.state is not S.UPLOADING]
        kept_settled = [c for c in settled if decisions[c.id].keep]
        assert len(kept_settled) <= min(n, sum(finite(c) for c in group))
        assert all(finite(c) for c in kept_settled)
