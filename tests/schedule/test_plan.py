"""The scheduler's rules, table by table: `plan` is pure, so these need no processes."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from muster.schedule.plan import Admit, Capacity, Demand, GpuSlot, Holding, plan
from muster.states import GpuState

A100 = [GpuSlot(i, "a100", GpuState.FREE) for i in range(4)]
MIXED = (GpuSlot(0, "a100", GpuState.FREE), GpuSlot(1, "a100", GpuState.FREE),
         GpuSlot(2, "v100", GpuState.FREE))


def cpu(trial: int, replicas: int = 1, priority: int = 42, experiment: int | None = None,
        max_slots: int | None = None) -> Demand:
    return Demand(trial, experiment or trial, priority, replicas, max_slots=max_slots)


def gpu(trial: int, replicas: int, per: int, gpu_type: str | None = None,
        priority: int = 42) -> Demand:
    return Demand(trial, trial, priority, replicas, per, gpu_type)


def test_priority_first_then_fifo_within_a_priority() -> None:
    queue = [cpu(1, priority=50), cpu(2, priority=10), cpu(3, priority=50), cpu(4, priority=10)]
    result = plan(queue, [], Capacity(slots=3))
    assert [a.trial_id for a in result.admit] == [2, 4, 1]
    assert result.waiting == {3: "position 1: waiting for 1 slot, 0 free"}


def test_a_trial_starts_all_its_replicas_or_none_and_later_ones_wait_behind_it() -> None:
    holdings = [Holding(9, 9, 42, 1)]
    result = plan([cpu(1, replicas=2), cpu(2)], holdings, Capacity(slots=2))
    assert result.admit == []
    assert result.waiting == {
        1: "position 1: waiting for 2 slots, 1 free",
        2: "position 2: waiting behind trial 1 (1 slot; first come, first served within a "
           "priority)",
    }


def test_a_trial_that_can_never_fit_holds_up_nobody() -> None:
    result = plan([cpu(1, replicas=3), cpu(2)], [], Capacity(slots=2))
    assert result.admit == [Admit(2)]
    assert result.waiting == {1: (
        "needs 3 slots for its replicas, but this server has 2; raise `slots` in the cluster "
        "config (or `muster up --slots`), or lower resources.replicas")}


def test_gpus_are_exclusive_per_replica_and_of_the_type_asked() -> None:
    queue = [gpu(1, 1, 1, "v100"), gpu(2, 2, 1, "a100"), gpu(3, 1, 1)]
    result = plan(queue, [], Capacity(slots=0, gpus=MIXED))
    assert result.admit == [Admit(1, ((2,),)), Admit(2, ((0,), (1,)))]
    assert result.waiting == {3: "position 1: waiting for 1 GPU, 0 free"}


def test_gpu_trials_take_no_slot_and_wait_apart_from_cpu_trials() -> None:
    holdings = [Holding(9, 9, 42, 1, gpus=(0, 1, 2, 3), gpus_per_replica=4)]
    queue = [gpu(1, 1, 1), cpu(2)]
    result = plan(queue, holdings, Capacity(slots=1, gpus=tuple(A100)))
    assert result.admit == [Admit(2)]  # not held up by the GPU trial that waits
    assert result.waiting == {1: "position 1: waiting for 1 GPU, 0 free"}


def test_allocated_and_releasing_gpus_are_not_handed_out() -> None:
    gpus = (GpuSlot(0, "a100", GpuState.ALLOCATED), GpuSlot(1, "a100", GpuState.RELEASING),
            GpuSlot(2, "a100", GpuState.FREE))
    result = plan([gpu(1, 1, 2, "a100")], [Holding(9, 9, 42, 1, gpus=(0,))],
                  Capacity(0, gpus))
    assert result.waiting == {
        1: "position 1: waiting for 2 GPUs of type a100, 1 free (1 more releasing memory)"}


def test_gpu_requests_that_exceed_the_inventory_say_so() -> None:
    result = plan([gpu(1, 2, 2, "a100"), gpu(2, 1, 1, "h100"), gpu(3, 1, 1)], [],
                  Capacity(0, MIXED))
    assert result.waiting == {
        1: "needs 4 GPUs of type a100 (2 per replica), but this server has 2 of type a100; lower "
           "resources.replicas or gpus_per_replica, or drop gpu_type",
        2: "needs 1 GPU of type h100 (1 per replica), but this server has no GPUs of type h100; "
           "lower resources.replicas or gpus_per_replica, or drop gpu_type",
    }
    assert result.admit == [Admit(3, ((0,),))]
    assert plan([gpu(1, 1, 1)], [], Capacity(2)).waiting == {1: (
        "needs 1 GPU (1 per replica), but this server has no GPUs; lower resources.replicas or "
        "gpus_per_replica")}


def test_max_slots_caps_an_experiment_without_holding_up_others() -> None:
    holdings = [Holding(1, 7, 42, 2)]
    queue = [cpu(2, experiment=7, max_slots=2), cpu(3)]
    result = plan(queue, holdings, Capacity(slots=4))
    assert result.admit == [Admit(3)]
    assert result.waiting == {
        2: "position 1: its experiment runs 2 replicas and resources.max_slots is 2"}


def test_preemption_stops_the_worst_and_newest_trials_it_needs_and_no_more() -> None:
    holdings = [Holding(1, 1, 60, 1), Holding(2, 2, 60, 1), Holding(3, 3, 50, 1),
                Holding(4, 4, 10, 1)]
    result = plan([cpu(5, replicas=2, priority=20)], holdings, Capacity(slots=4),
                  preemption=True)
    assert result.preempt == {2: 5, 1: 5}
    assert result.waiting == {5: "position 1: waiting for 2 slots, 0 free; preempting "
                                 "trials 2, 1"}
    # Without preemption nobody is stopped; equal or better priority is never preempted.
    assert plan([cpu(5, replicas=2, priority=20)], holdings, Capacity(4)).preempt == {}
    assert plan([cpu(5, priority=60)], holdings, Capacity(4), preemption=True).preempt == {}


def test_preemption_waits_for_trials_already_stopping_and_gives_up_when_it_cannot_help() -> None:
    stopping = [Holding(1, 1, 60, 2, stopping=True)]
    result = plan([cpu(5, replicas=2, priority=1)], stopping, Capacity(2), preemption=True)
    assert result.preempt == {}  # their slots are on their way back
    holdings = [Holding(1, 1, 60, 1), Holding(2, 2, 10, 1)]
    assert plan([cpu(5, replicas=2, priority=20)], holdings, Capacity(2),
                preemption=True).preempt == {}  # stopping trial 1 alone would not do


def test_gpu_preemption_counts_only_gpus_of_the_type_asked() -> None:
    holdings = [Holding(1, 1, 60, 1, gpus=(2,)), Holding(2, 2, 70, 1, gpus=(0,))]
    busy = (GpuSlot(0, "a100", GpuState.ALLOCATED), GpuSlot(1, "a100", GpuState.FREE),
            GpuSlot(2, "v100", GpuState.ALLOCATED))
    result = plan([gpu(5, 1, 2, "a100", priority=1)], holdings, Capacity(0, busy),
                  preemption=True)
    assert result.preempt == {2: 5}


demands = st.builds(
    lambda t, r, g, p, kind: Demand(t, t % 5, p, r, g if kind else 0,
                                    ("a100", "v100", None)[t % 3] if kind else None),
    st.integers(1, 10_000), st.integers(1, 4), st.integers(1, 3), st.integers(1, 99),
    st.booleans())


@settings(max_examples=300, deadline=None)
@given(st.lists(demands, max_size=30, unique_by=lambda d: d.trial_id),
       st.integers(0, 8), st.lists(st.sampled_from(["a100", "v100"]), max_size=8))
def test_no_plan_overbooks_a_slot_or_a_gpu(queue: list[Demand], slots: int,
                                           types: list[str]) -> None:
    gpus = tuple(GpuSlot(i, t, GpuState.FREE) for i, t in enumerate(types))
    result = plan(queue, [], Capacity(slots, gpus))
    by_id = {d.trial_id: d for d in queue}
    used = [i for a in result.admit for rank in a.gpus for i in rank]
    assert len(used) == len(set(used))  # never two replicas on one GPU
    assert sum(by_id[a.trial_id].replicas for a in result.admit
               if not by_id[a.trial_id].gpus_per_replica) <= slots
    for admit in result.admit:
        demand = by_id[admit.trial_id]
        assert len(admit.gpus) == (demand.replicas if demand.gpus_per_replica else 0)
        for rank in admit.gpus:
            assert len(rank) == demand.gpus_per_replica
            assert all(demand.gpu_type in (None, gpus[i].type) for i in rank)
    assert set(result.waiting) | {a.trial_id for a in result.admit} == set(by_id)
