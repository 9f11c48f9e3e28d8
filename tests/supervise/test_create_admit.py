"""Create and admit in one transaction (issue 19): a trial that may start at once gets its
first attempt recorded by the create that makes it, and the next pass launches it first.
Real processes, the real store; the creates go through `create_experiments` with the
supervisor's `admitting_new`, as the server's route does."""

from __future__ import annotations

import random
import sys
import threading
import time
from functools import partial
from pathlib import Path

import pytest
import yaml
from sqlalchemy import func, select

from muster.launch.local import LocalLauncher
from muster.priority import DEFAULT_PRIORITY
from muster.schedule.local_placement import LocalPlacement
from muster.services.experiments import NewExperiments, PlainSubmission, create_experiments
from muster.states import TrialState, values
from muster.store import Event, Trial
from muster.supervise.supervisor import ADMITTED_AT_SUBMISSION, Supervisor
from tests.supervise.conftest import Rig, Submitted, experiment_yaml
from tests.waiting import wait_until

HOLD = "import os, sys, time\nwhile os.path.exists(sys.argv[1]):\n    time.sleep(0.02)\n"
# Takes one of the `slots` files for as long as it runs: a third trial running beside two
# others finds none free and fails (the supervisor frees a slot only after its trial ended,
# and the file goes before the exit).
SLOTTED = """\
import os, sys, time
where = sys.argv[1]
for n in range(int(sys.argv[2])):
    try:
        fd = os.open(os.path.join(where, f"slot-{n}"), os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        break
    except FileExistsError:
        continue
else:
    sys.exit("more trials run at once than there are slots")
time.sleep(0.05)
os.close(fd)
os.unlink(os.path.join(where, f"slot-{n}"))
"""


def _rig(rig: Rig, slots: int) -> Rig:
    return Rig(rig.store, rig.home, Supervisor(rig.store, LocalLauncher(), rig.home,
                                               LocalPlacement(rig.store, slots),
                                               min_free_disk=0), rig.admin)


def _create(rig: Rig, entrypoint: list[str]) -> Submitted:
    (experiment_id,) = create_experiments(
        PlainSubmission(rig.store, rig.home, admit=rig.supervisor.admitting_new), rig.admin,
        NewExperiments([experiment_yaml(entrypoint)]))
    with rig.store.session_scope() as s:
        trial_id = s.scalars(select(Trial.id).where(Trial.experiment_id == experiment_id))
        return Submitted(experiment_id, trial_id.one())


def _settled(rig: Rig, trial_id: int) -> bool:
    return TrialState(rig.trial(trial_id).state).is_at_rest()


def _script(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_a_trial_with_a_free_slot_starts_in_its_creates_transaction(rig: Rig) -> None:
    job = _create(rig, [sys.executable, "-c", "print('hello')"])
    created = rig.trial(job.trial_id)
    # Recorded by the create itself: no pass has run.
    assert created.state == TrialState.STARTING.value
    assert [(a.number, a.state, a.shim_pid) for a in created.attempts] == [(1, "STARTING", None)]
    assert created.trial_moves() == [("QUEUED", "STARTING", "launching")]
    assert ADMITTED_AT_SUBMISSION in (created.events[-1].message or "")
    rig.supervisor.tick()  # the pass launches it before anything else
    assert rig.trial(job.trial_id).attempts[0].shim_pid is not None
    ended = rig.run_to_end(job)
    assert ended.state == "SUCCEEDED"
    assert (ended.attempts[0].run_dir / "rank-0.log").read_bytes() == b"hello\n"


def test_a_create_admits_neither_past_the_free_slots_nor_ahead_of_the_queue(
    rig: Rig, tmp_path: Path
) -> None:
    one = _rig(rig, slots=1)
    hold = tmp_path / "hold"
    hold.touch()
    holder = [sys.executable, "-c", HOLD, str(hold)]
    first = _create(one, holder)
    assert one.trial(first.trial_id).state == "STARTING"
    second = _create(one, holder)
    assert one.trial(second.trial_id).state == "QUEUED", "the only slot is taken"
    one.until_trial(first, TrialState.RUNNING)
    hold.unlink()  # both end once started; the first frees the slot
    one.tick_until(lambda: one.trial(first.trial_id).state == "SUCCEEDED",
                   what="the first trial to end")
    if one.trial(second.trial_id).state == "QUEUED":  # the same pass may have started it
        third = _create(one, [sys.executable, "-c", "pass"])
        assert one.trial(third.trial_id).state == "QUEUED", "the second waits ahead of it"
        one.supervisor.tick()
        assert one.trial(second.trial_id).state in ("STARTING", "RUNNING", "SUCCEEDED")
        assert one.trial(third.trial_id).state == "QUEUED"
        assert one.run_to_end(third).state == "SUCCEEDED"
    assert one.run_to_end(second).state == "SUCCEEDED"


def test_a_batch_admits_in_the_queues_order_up_to_the_free_slots(rig: Rig) -> None:
    """Three configs in one create on 2 free slots, the third of a better priority: it and
    the first are admitted by the create, the second waits (behind nothing but the slots)."""
    two = _rig(rig, slots=2)
    configs = [yaml.safe_dump({"name": "batch", "entrypoint": [sys.executable, "-c", "pass"],
                               "resources": {"priority": priority}})
               for priority in (50, 50, 10)]
    created = create_experiments(
        PlainSubmission(two.store, two.home, admit=two.supervisor.admitting_new), two.admin,
        NewExperiments(configs))
    with two.store.session_scope() as s:
        states = [s.scalars(select(Trial.state).where(Trial.experiment_id == e)).one()
                  for e in created]
    assert states == ["STARTING", "QUEUED", "STARTING"]
    for experiment_id in created:
        with two.store.session_scope() as s:
            trial_id = s.scalars(select(Trial.id).where(Trial.experiment_id == experiment_id)
                                 ).one()
        assert two.run_to_end(Submitted(experiment_id, trial_id)).state == "SUCCEEDED"


def test_a_pass_between_the_creates_commit_and_its_launch_leaves_the_attempt_alone(
    rig: Rig
) -> None:
    """The attempt is committed before the pass that launches it gets it: a pass that runs
    in between must not take its missing process for a lost one."""
    supervisor = rig.supervisor
    with supervisor.admitting_new(DEFAULT_PRIORITY) as admit:
        assert admit is not None
        (experiment_id,) = create_experiments(
            PlainSubmission(rig.store, rig.home), rig.admin,
            NewExperiments([experiment_yaml([sys.executable, "-c", "pass"])]))
        with rig.store.session_scope() as s:
            trial = s.scalars(select(Trial).where(Trial.experiment_id == experiment_id)).one()
            trial_id = trial.id
            admit(s, trial)
        # Committed, not handed to the passes yet: a pass settles what is live (it then
        # waits for the admission lock this create holds).
        ticking = threading.Thread(target=supervisor.tick, daemon=True)
        ticking.start()
        ticking.join(timeout=2.0)
        assert ticking.is_alive(), "the pass waits for the create's admission"
        view = rig.trial(trial_id)
        assert (view.state, [a.state for a in view.attempts]) == ("STARTING", ["STARTING"])
    ticking.join(timeout=30)
    assert not ticking.is_alive()
    ended = rig.run_to_end(Submitted(experiment_id, trial_id))
    assert ended.state == "SUCCEEDED" and len(ended.attempts) == 1


@pytest.mark.timeout(300)
def test_concurrent_creates_and_passes_never_run_more_trials_than_slots(
    sqlite_rig: Rig, tmp_path: Path
) -> None:
    """Three threads create 60 trials while a thread runs the passes, on 2 slots: the
    trials holding slots never number more than 2 (sampled in the store, and each trial
    takes a slot file exclusively), many are admitted by their creates, and all succeed."""
    two = _rig(sqlite_rig, slots=2)
    slots_dir = tmp_path / "slots"
    slots_dir.mkdir()
    entry = [sys.executable, _script(tmp_path, "slotted.py", SLOTTED), str(slots_dir), "2"]
    stop = threading.Event()
    errors: list[BaseException] = []

    def passes() -> None:
        while not stop.is_set():
            try:
                two.supervisor.tick()
            except BaseException as exc:  # noqa: BLE001 - reported by the test
                errors.append(exc)
                return
            time.sleep(0.05)  # the lock is free most of the time: the creates race each other

    def creates(seed: int) -> None:
        """One after another, as a user's loop submits: the next once the last has ended,
        so that the queue is often empty and the three race for the two slots. The pause
        between is long beside a trial's life (~0.25 s: a Python start, its 50 ms, a pass)
        so that a create often finds a slot free: with no pause, two of the three hold both
        slots nearly always and a create is admitted ~1 time in 8, too near the bound."""
        pace = random.Random(seed)
        try:
            for _ in range(20):
                trial_id = _create(two, entry).trial_id
                wait_until(partial(_settled, two, trial_id), timeout=120, interval=0.01,
                           what=f"trial {trial_id} to end")
                time.sleep(pace.uniform(0.05, 0.25))
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    ticker = threading.Thread(target=passes, daemon=True)
    ticker.start()
    creators = [threading.Thread(target=creates, args=(n,), daemon=True) for n in range(3)]
    for thread in creators:
        thread.start()
    most = 0
    holding = values(TrialState.active())

    def all_ended() -> bool:
        nonlocal most
        with two.store.session_scope() as s:
            most = max(most, s.scalar(select(func.count(Trial.id))
                                      .where(Trial.state.in_(holding))) or 0)
            states = list(s.scalars(select(Trial.state)))
        return (not any(t.is_alive() for t in creators) and len(states) == 60
                and all(TrialState(st).is_at_rest() for st in states))

    try:
        wait_until(lambda: all_ended() or errors, timeout=240, interval=0.005,
                   what="the 60 trials to end")
    finally:
        stop.set()
        ticker.join(timeout=30)
    assert not errors, errors
    assert most <= 2
    with two.store.session_scope() as s:
        failed = {t.id: t.message for t in s.scalars(select(Trial)) if t.state != "SUCCEEDED"}
    assert not failed, failed
    with two.store.session_scope() as s:
        admitted = s.scalar(select(func.count(Event.id)).where(
            Event.message.contains(ADMITTED_AT_SUBMISSION)))
    assert admitted is not None and admitted >= 10, \
        f"only {admitted} of 60 trials were admitted by their creates"
