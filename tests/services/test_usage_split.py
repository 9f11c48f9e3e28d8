"""The pure parts of usage (`muster.services.usage`): how one attempt's time splits into
productive, lost, stalled and running inside a window, and the bounds and defaults of a
report's window and scope. (How state changes become queued and idle time is summed by the
database: tests/services/test_usage_waits.py.)"""

from __future__ import annotations

import math

import pytest

from muster.errors import InvalidRequest
from muster.services.access import Principal
from muster.services.usage import (
    MAX_SINCE_S,
    AttemptTime,
    Seconds,
    report_scope,
    split_attempt,
    window_seconds,
)
from muster.states import Role

INF = math.inf


@pytest.mark.parametrize(("attempt", "since", "until", "expected"), [
    # Succeeded: all productive; clipped to the window on either side.
    (AttemptTime(100, 200, INF), 0, 1000, Seconds(productive=100)),
    (AttemptTime(100, 200, INF), 150, 1000, Seconds(productive=50)),
    (AttemptTime(100, 200, INF), 0, 120, Seconds(productive=20)),
    (AttemptTime(100, 200, INF), 300, 1000, Seconds()),
    # Died after a checkpoint at 160 that a later attempt resumed from.
    (AttemptTime(100, 200, 160), 0, 1000, Seconds(productive=60, lost=40)),
    (AttemptTime(100, 200, 160), 170, 1000, Seconds(lost=30)),
    (AttemptTime(100, 200, 160), 0, 130, Seconds(productive=30)),
    # Nothing kept: all lost; a checkpoint time before its start keeps nothing.
    (AttemptTime(100, 200, -INF), 0, 1000, Seconds(lost=100)),
    (AttemptTime(100, 200, 50), 0, 1000, Seconds(lost=100)),
    # Stalled from 170 to its end, nothing kept: lost up to the stall.
    (AttemptTime(100, 200, -INF, ((170, 200),)), 0, 1000, Seconds(lost=70, stalled=30)),
    # Kept up to 150, stalled from 170: productive, lost, stalled.
    (AttemptTime(100, 200, 150, ((170, 200),)), 0, 1000,
     Seconds(productive=50, lost=20, stalled=30)),
    # A stall that began before its (recorded) start counts from the start.
    (AttemptTime(100, 200, -INF, ((90, 200),)), 0, 1000, Seconds(stalled=100)),
    # A stall of a replica restarted in place, inside an attempt that then succeeded.
    (AttemptTime(100, 200, INF, ((120, 130),)), 0, 1000, Seconds(productive=90, stalled=10)),
    # Two overlapping stalls count once.
    (AttemptTime(100, 200, -INF, ((150, 180), (170, 190))), 0, 1000,
     Seconds(lost=60, stalled=40)),
    # Still running: running until the window's end, not yet productive or lost.
    (AttemptTime(100, None, -INF), 0, 250, Seconds(running=150)),
    (AttemptTime(100, None, -INF), 180, 250, Seconds(running=70)),
])
def test_an_attempt_splits_by_what_became_of_its_work(
        attempt: AttemptTime, since: float, until: float, expected: Seconds) -> None:
    assert split_attempt(attempt, since, until) == expected


def test_seconds_add_weighs_slot_time_but_not_queued_time() -> None:
    total = Seconds(queued=1)
    total.add(Seconds(productive=1, lost=2, stalled=3, idle=4, running=5, queued=6), 2)
    assert total == Seconds(productive=2, lost=4, stalled=6, idle=8, running=10, queued=7)
    assert total.held == 30


@pytest.mark.parametrize(("text", "seconds"), [
    ("30d", 30 * 86400), ("12h", 12 * 3600), ("90m", 5400), ("400d", MAX_SINCE_S)])
def test_the_window_is_a_duration(text: str, seconds: float) -> None:
    assert window_seconds(text) == seconds


@pytest.mark.parametrize(("text", "message"), [
    ("401d", "since must be more than 0 and at most 400d"),
    ("0s", "since must be more than 0 and at most 400d"),
    ("a month", "since must look like '30s'"),
    ("-5d", "since must"),
])
def test_a_bad_window_says_what_to_write(text: str, message: str) -> None:
    with pytest.raises(InvalidRequest, match=message):
        window_seconds(text)


ADMIN = Principal(1, "root", Role.ADMIN)
ALICE = Principal(2, "alice", Role.USER)
VERA = Principal(3, "vera", Role.VIEWER)


@pytest.mark.parametrize(("who", "user", "everyone", "scope"), [
    (ALICE, None, False, "alice"),  # a user's own by default
    (ALICE, None, True, None),
    (ALICE, "bob", False, "bob"),
    (ADMIN, None, False, None),  # an admin's and a viewer's default: everyone's
    (VERA, None, False, None),
    (VERA, "alice", False, "alice"),
])
def test_whose_usage_a_report_counts(who: Principal, user: str | None, everyone: bool,
                                     scope: str | None) -> None:
    assert report_scope(who, user, everyone) == scope


def test_a_user_and_everyone_at_once_is_refused() -> None:
    with pytest.raises(InvalidRequest, match="give either user"):
        report_scope(ADMIN, "alice", True)
