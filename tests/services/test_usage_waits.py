"""How a trial's state changes become queued and idle time in a usage report: summed by the
database (a window function over each trial's timeline, `muster.services.usage._waits`), on
each backend, for histories recorded as the transition function records them (QUEUED from
the trial's creation, then one event per move), whole and clipped by the window."""

from __future__ import annotations

import pytest

from muster.services.access import Principal
from muster.services.usage import usage_report
from muster.states import Role, TrialState
from muster.store import Event, Experiment, Store, Trial, User
from muster.store.models import now

T = TrialState
ADMIN = Principal(1, "root", Role.ADMIN)


def record(store: Store, created: float, moves: list[tuple[float, TrialState]],
           replicas: int = 1) -> None:
    """A trial created at `created` that moved as `moves` says ((at, state), in order)."""
    with store.session_scope() as s:
        if s.get(User, 1) is None:
            s.add(User(id=1, name="root", role=Role.ADMIN))
        exp = Experiment(name="waits", config={"resources": {"replicas": replicas}},
                         config_yaml="", context_dir="/nowhere", state="ACTIVE", owner_id=1)
        s.add(exp)
        s.flush()
        state = moves[-1][1] if moves else T.QUEUED
        trial = Trial(experiment_id=exp.id, state=state, created_at=created,
                      ended_at=moves[-1][0] if state.is_terminal() else None)
        s.add(trial)
        s.flush()
        before = T.QUEUED
        for at, to_state in moves:
            s.add(Event(at=at, entity="trial", entity_id=trial.id, experiment_id=exp.id,
                        trial_id=trial.id, from_state=before, to_state=to_state,
                        reason="test", actor="root"))
            before = to_state


RESTARTED = [(30, T.STARTING), (35, T.RUNNING), (60, T.RESTARTING), (62, T.STARTING),
             (70, T.RUNNING), (90, T.SUCCEEDED)]


@pytest.mark.parametrize(("moves", "opens_at", "queued", "idle"), [
    # Queued from its creation (10) to 30; starting, restarting and starting again.
    (RESTARTED, None, [(10, 30)], [(30, 35), (60, 62), (62, 70)]),
    # The same, in a window that opens at 61, while it restarts: clipped there.
    (RESTARTED, 61, [(10, 30)], [(30, 35), (60, 62), (62, 70)]),
    # Paused, queued again, then killed: paused time is neither.
    ([(20, T.PAUSED), (40, T.QUEUED), (45, T.CANCELED)], None, [(10, 20), (40, 45)], []),
])
def test_queued_and_idle_seconds_follow_the_state_changes(
        store: Store, moves: list[tuple[float, TrialState]], opens_at: float | None,
        queued: list[tuple[float, float]], idle: list[tuple[float, float]]) -> None:
    base = now() - 1000
    record(store, base + 10, [(base + at, state) for at, state in moves], replicas=2)
    window = "1h" if opens_at is None else f"{(now() - base - opens_at) * 1000:.0f}ms"
    report = usage_report(store, ADMIN, since=window)
    start = report["since"]
    if opens_at is not None:
        assert base + opens_at - 1 < start < base + opens_at + 1

    def inside(spans: list[tuple[float, float]]) -> float:
        return sum(max(0.0, base + b - max(base + a, start)) for a, b in spans)

    total = report["total"]
    assert total["queued_hours"] == pytest.approx(inside(queued) / 3600, rel=1e-9, abs=1e-9)
    assert total["idle_hours"] == pytest.approx(2 * inside(idle) / 3600, rel=1e-9, abs=1e-9)
    assert total["slot_hours"] == pytest.approx(2 * inside(idle) / 3600, rel=1e-9, abs=1e-9)


def test_a_trial_still_queued_waits_until_the_report(store: Store) -> None:
    created = now() - 600
    record(store, created, [])
    report = usage_report(store, ADMIN, since="1h")
    assert report["total"]["queued_hours"] == pytest.approx(
        (report["until"] - created) / 3600, rel=1e-9)
    assert report["total"]["slot_hours"] == 0.0 and report["total"]["goodput"] is None
    assert report["total"]["trials"] == 1


def test_a_trial_that_ended_before_the_window_is_not_counted(store: Store) -> None:
    base = now() - 7200
    record(store, base, [(base + 10, T.STARTING), (base + 20, T.FAILED)])
    report = usage_report(store, ADMIN, since="1h")
    assert report["rows"] == [] and report["total"]["trials"] == 0
