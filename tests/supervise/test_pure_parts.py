"""The supervisor's other pure parts, table by table: how an experiment ends, and when a
replica counts as stalled (from its heartbeat file, with the time given)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from muster.rundir import RankFiles
from muster.states import EventReason, ExperimentState, TrialState
from muster.supervise.experiments import experiment_end
from muster.supervise.heartbeats import check_in_overdue, checked_in, stall_reason

T = TrialState


@pytest.mark.parametrize(("killed", "states", "end"), [
    (True, [T.SUCCEEDED], (ExperimentState.CANCELED, EventReason.KILLED)),
    (True, [], (ExperimentState.CANCELED, EventReason.KILLED)),
    (False, [T.FAILED, T.SUCCEEDED], (ExperimentState.COMPLETED, EventReason.TRIALS_FINISHED)),
    (False, [T.FAILED, T.CANCELED], (ExperimentState.ERROR, EventReason.NO_TRIAL_SUCCEEDED)),
])
def test_how_an_experiment_ends(killed: bool, states: list[TrialState],
                                end: tuple[ExperimentState, EventReason]) -> None:
    assert experiment_end(killed, states) == end


def beat(tmp_path: Path, **fields: object) -> Path:
    files = RankFiles(tmp_path, 0)
    tmp_path.mkdir(exist_ok=True)
    files.heartbeat.write_text(json.dumps(fields))
    return tmp_path


@pytest.mark.parametrize(("progress", "step", "now", "stalled"), [
    (100.0, 7, 150.0, False),   # 50 s idle, timeout 60
    (100.0, 7, 160.0, True),    # exactly the timeout
    (100.0, None, 500.0, True),  # checked in, never moved
])
def test_a_checked_in_replica_is_stalled_after_the_timeout(
    tmp_path: Path, progress: float, step: int | None, now: float, stalled: bool
) -> None:
    attempt = beat(tmp_path, progress_time=progress, step=step)
    assert checked_in(attempt, 0)
    stall = stall_reason(attempt, 0, 60.0, now)
    assert (stall is not None) == stalled
    if stall is not None:
        assert stall.reason.startswith(
            f"no progress for {now - progress:.0f}s (heartbeat_timeout 60s)")
        assert ("step 7" if step is not None else "its check-in") in stall.reason
        assert stall.since == progress  # the stall began at the last progress


@pytest.mark.parametrize("content", ['{"step": 3}', '[1, 2]', '{"progress_time": "soon"}'])
def test_a_heartbeat_without_a_progress_time_judges_nothing(tmp_path: Path, content: str) -> None:
    RankFiles(tmp_path, 0).heartbeat.write_text(content)
    assert stall_reason(tmp_path, 0, 1.0, 1e12) is None


def test_a_damaged_heartbeat_is_logged_not_judged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    RankFiles(tmp_path, 0).heartbeat.write_text('{"progress_time": 1.')
    assert stall_reason(tmp_path, 0, 1.0, 1e12) is None
    assert "cannot read the heartbeat" in caplog.text


def test_without_a_heartbeat_there_is_no_check_in(tmp_path: Path) -> None:
    assert not checked_in(tmp_path, 0) and stall_reason(tmp_path, 0, 1.0, 1e12) is None


@pytest.mark.parametrize(("since", "now", "overdue"), [(0.0, 59.0, False), (0.0, 60.0, True)])
def test_a_check_in_is_overdue_after_the_timeout(since: float, now: float, overdue: bool) -> None:
    stall = check_in_overdue(since, 60.0, now)
    assert (stall is not None) == overdue
    if stall is not None:
        assert "has not called muster.harness.init()" in stall.reason
        assert "harness: false" in stall.reason
        assert stall.since == since  # it has waited for the check-in since its start
