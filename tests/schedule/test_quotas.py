"""Quotas, table by table (`muster.schedule.quotas` and `plan` with a book): where each limit
comes from, and that no plan admits trials that together pass a quota. Pure: no processes."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from muster.config.quotas import QuotasConfig
from muster.schedule.plan import Admit, Capacity, Demand, GpuSlot, Holding, plan
from muster.schedule.quotas import (
    FROM_ADMIN,
    FROM_CONFIG,
    FROM_DEFAULT_ADMIN,
    FROM_DEFAULT_CONFIG,
    Charge,
    Directory,
    QuotaBook,
    Setting,
    Usage,
    build_book,
    queued_refusal,
    user_settings,
)
from muster.states import GpuState, QuotaLimit, QuotaSubject

L, S = QuotaLimit, QuotaSubject
ALICE, BOB, CAROL = 1, 2, 3
VISION = 10
PEOPLE = Directory(users={ALICE: "alice", BOB: "bob", CAROL: "carol"},
                   groups={VISION: "vision"}, members={VISION: [ALICE, BOB]})
GPUS = tuple(GpuSlot(i, "a100", GpuState.FREE) for i in range(8))


def config(**quotas: Any) -> QuotasConfig:
    return QuotasConfig.model_validate(quotas)


def book(**quotas: Any) -> QuotaBook:
    return build_book(config(**quotas), {}, PEOPLE)


def gpu_trial(trial: int, owner: int, gpus: int = 1, priority: int = 42) -> Demand:
    return Demand(trial, trial, priority, 1, gpus, charge=Charge.of(owner, 1, gpus))


def cpu_trial(trial: int, owner: int, replicas: int = 1) -> Demand:
    return Demand(trial, trial, 42, replicas, charge=Charge.of(owner, replicas, 0))


def holding(trial: int, owner: int, gpus: tuple[int, ...]) -> Holding:
    return Holding(trial, trial, 42, 1, gpus, gpus_per_replica=len(gpus),
                   charge=Charge.of(owner, 1, len(gpus)))


@pytest.mark.parametrize(("runtime", "quotas", "expected"), [
    # the user's own, at runtime, wins over everything
    ({(S.USER, ALICE): {L.MAX_GPUS: 8}},
     {"users": {"alice": {"max_gpus": 4}}, "default": {"max_gpus": 2}},
     {L.MAX_GPUS: Setting(8, FROM_ADMIN)}),
    # the config's user entry wins over any default, the admin's default too
    ({(S.DEFAULT, 0): {L.MAX_GPUS: 1}},
     {"users": {"alice": {"max_gpus": 4}}, "default": {"max_gpus": 2}},
     {L.MAX_GPUS: Setting(4, FROM_CONFIG)}),
    # the admin's default wins over the config's default
    ({(S.DEFAULT, 0): {L.MAX_GPUS: 1}}, {"default": {"max_gpus": 2}},
     {L.MAX_GPUS: Setting(1, FROM_DEFAULT_ADMIN)}),
    ({}, {"default": {"max_gpus": 2}}, {L.MAX_GPUS: Setting(2, FROM_DEFAULT_CONFIG)}),
    # per limit: each falls through on its own
    ({(S.USER, ALICE): {L.MAX_SLOTS: 3}},
     {"users": {"alice": {"max_running_trials": 5}}, "default": {"max_queued_trials": 9}},
     {L.MAX_SLOTS: Setting(3, FROM_ADMIN), L.MAX_RUNNING_TRIALS: Setting(5, FROM_CONFIG),
      L.MAX_QUEUED_TRIALS: Setting(9, FROM_DEFAULT_CONFIG)}),
    # null is "no limit", and lifts a more general one
    ({}, {"users": {"alice": {"max_gpus": None}}, "default": {"max_gpus": 2}},
     {L.MAX_GPUS: Setting(None, FROM_CONFIG)}),
    ({(S.USER, ALICE): {L.MAX_GPUS: None}}, {"users": {"alice": {"max_gpus": 4}}},
     {L.MAX_GPUS: Setting(None, FROM_ADMIN)}),
    ({}, {}, {}),
])
def test_where_a_users_limit_comes_from(runtime: Any, quotas: Any, expected: Any) -> None:
    assert user_settings(config(**quotas), runtime, ALICE, "alice") == expected


def test_the_book_holds_a_user_to_their_own_quota_and_each_of_their_groups() -> None:
    found = build_book(config(default={"max_gpus": 2}, groups={"vision": {"max_gpus": 3}}),
                       {(S.USER, BOB): {L.MAX_GPUS: None}}, PEOPLE)
    alice, bob, carol = (found.of(i) for i in (ALICE, BOB, CAROL))
    assert [c.holder for c in alice] == ["alice's quota", "group vision's quota"]
    assert [c.holder for c in bob] == ["group vision's quota"]  # no limit of his own
    assert [(c.holder, c.limits) for c in carol] == [("carol's quota", ((L.MAX_GPUS, 2),))]
    assert found.of(None) == () and not found.limits_running(None)


def test_two_trials_that_together_pass_a_quota_are_not_admitted_together() -> None:
    quotas = book(users={"alice": {"max_gpus": 3}})
    result = plan([gpu_trial(1, ALICE, 2), gpu_trial(2, ALICE, 2), gpu_trial(3, ALICE)],
                  [], Capacity(0, GPUS), quotas=quotas)
    assert [a.trial_id for a in result.admit] == [1, 3]
    assert result.waiting == {2: "position 1: alice's quota: 2 of 3 GPUs in use, and this "
                                 "trial needs 2"}


def test_the_queue_reason_names_the_quota_and_what_is_in_use() -> None:
    quotas = book(users={"alice": {"max_gpus": 2}})
    held = [holding(7, ALICE, (0,)), holding(8, ALICE, (1,))]
    result = plan([gpu_trial(1, ALICE)], held, Capacity(0, GPUS), quotas=quotas)
    assert result.admit == []
    assert result.waiting == {1: "position 1: alice's quota: 2 of 2 GPUs in use"}


def test_a_quota_held_trial_holds_up_nobody_else_and_preempts_nobody() -> None:
    quotas = book(users={"alice": {"max_running_trials": 1}})
    held = [Holding(7, 7, 90, 1, charge=Charge.of(ALICE, 1, 0)),
            Holding(8, 8, 90, 1, charge=Charge.of(BOB, 1, 0))]
    queue = [Demand(1, 1, 1, 1, charge=Charge.of(ALICE, 1, 0)), cpu_trial(2, BOB)]
    result = plan(queue, held, Capacity(3), preemption=True, quotas=quotas)
    assert result.admit == [Admit(2)]
    assert result.preempt == {}
    assert result.waiting == {1: "position 1: alice's quota: 1 of 1 running trial in use"}


def test_a_groups_quota_counts_its_members_together() -> None:
    quotas = book(groups={"vision": {"max_slots": 3}})
    held = [Holding(7, 7, 42, 2, charge=Charge.of(BOB, 2, 0))]
    queue = [cpu_trial(1, ALICE, 2), cpu_trial(2, ALICE), cpu_trial(3, CAROL, 2)]
    result = plan(queue, held, Capacity(8), quotas=quotas)
    assert [a.trial_id for a in result.admit] == [2, 3]
    assert result.waiting == {1: "position 1: group vision's quota: 2 of 3 slots in use, and "
                                 "this trial needs 2"}


def test_a_trial_past_a_quota_by_itself_says_so_and_holds_nobody_up() -> None:
    quotas = book(users={"alice": {"max_gpus": 2}})
    result = plan([gpu_trial(1, ALICE, 4), gpu_trial(2, ALICE)], [], Capacity(0, GPUS),
                  quotas=quotas)
    assert result.admit == [Admit(2, ((0,),))]
    assert result.waiting == {1: (
        "alice's quota allows 2 GPUs, but this trial needs 4; an admin can raise it (muster "
        "quota set --user alice --max-gpus N), or lower resources.replicas or "
        "gpus_per_replica")}


def test_gpu_replicas_take_no_slot_of_a_quota() -> None:
    quotas = book(users={"alice": {"max_slots": 1}})
    result = plan([gpu_trial(1, ALICE, 2), cpu_trial(2, ALICE)], [], Capacity(4, GPUS),
                  quotas=quotas)
    assert [a.trial_id for a in result.admit] == [1, 2]


def test_a_create_past_max_queued_trials_is_refused_with_the_quota_named() -> None:
    (own,) = book(users={"alice": {"max_queued_trials": 3}}).of(ALICE)
    assert queued_refusal(own, 2, 1) is None
    assert queued_refusal(own, 3, 1) == (
        "alice's quota: 3 of 3 queued trials, and this submission queues 1 more; wait for "
        "some to start or end, kill some (muster job list), or ask an admin to raise it "
        "(muster quota set --user alice --max-queued-trials N)")


@settings(max_examples=200, deadline=None)
@given(limit=st.integers(0, 6), held=st.lists(st.integers(1, 3), max_size=4),
       queue=st.lists(st.tuples(st.sampled_from([ALICE, BOB, CAROL]), st.integers(1, 3)),
                      max_size=10))
def test_no_plan_takes_a_user_or_a_group_past_its_quota(
        limit: int, held: list[int], queue: list[tuple[int, int]]) -> None:
    """Whatever runs and waits: what runs after the plan is within every quota (a holding
    already past a quota, lowered under it, admits nothing more there)."""
    quotas = book(users={"alice": {"max_gpus": limit}}, groups={"vision": {"max_gpus": limit}})
    index = iter(range(100))
    holdings = [holding(100 + i, [ALICE, BOB, CAROL][i % 3],
                        tuple(next(index) for _ in range(g))) for i, g in enumerate(held)]
    gpus = tuple(GpuSlot(i, "a100", GpuState.FREE) for i in range(30))
    demands = [gpu_trial(i + 1, owner, g) for i, (owner, g) in enumerate(queue)]
    result = plan(demands, holdings, Capacity(0, gpus), quotas=quotas)
    admitted = {a.trial_id for a in result.admit}
    running = [h.charge for h in holdings] + [d.charge for d in demands
                                              if d.trial_id in admitted]

    def use(owners: set[int]) -> int:
        return sum(c.gpus for c in running if c is not None and c.owner_id in owners)

    before = Usage(quotas, [h.charge for h in holdings if h.charge is not None])
    for owners, constraint in (({ALICE}, quotas.of(ALICE)[0]),
                               ({ALICE, BOB}, quotas.of(BOB)[0])):
        assert use(owners) <= max(limit, before.in_use(constraint, L.MAX_GPUS))
