"""The bad-node circuit breaker's bookkeeping (`note_node_end`, `release_node`) on a real
SQLite store, table by table: each row is a sequence of replica ends on one node, each end
committed in its own session as the supervisor commits it, and what the node's row says
afterwards. No process is started."""

from __future__ import annotations

import time
from dataclasses import dataclass

import pytest
from sqlalchemy import select

from muster.launch.exits import Classification
from muster.states import EventReason, Reason
from muster.store import ClusterNode, Event, Experiment, Store, Trial
from muster.supervise.placement import note_node_end, release_node
from tests.store.rows import add_attempt, add_experiment, add_replica, add_trial

NODE = "node-a"
INFRA = (Reason.INFRA, Reason.LOST, Reason.STALLED)
JOBS_OWN = (Reason.OK, Reason.USER_ERROR, Reason.PERMANENT_ERROR, Reason.OOM, Reason.TRANSIENT)
MUSTERS_OWN = (Reason.STOPPED, Reason.INTERNAL, Reason.CAPACITY)


def _verdict(reason: Reason) -> Classification:
    return Classification(reason, f"the replica ended {reason.value}", None, None, None)


@dataclass(frozen=True)
class NodeView:
    failed_trials: list[int]
    quarantined: bool
    reason: str | None


@dataclass
class Cluster:
    """Trials "a", "b", "c", ... of one experiment; `end` ends a replica of a new attempt of
    one of them on a node."""

    store: Store
    trials: dict[str, int]

    def end(self, trial: str, reason: Reason, failures: int | None = 3,
            node: str | None = NODE) -> None:
        with self.store.session_scope() as s:
            row = s.get_one(Trial, self.trials[trial])
            attempt = add_attempt(s, row, state="RUNNING", number=len(row.attempts) + 1)
            replica = add_replica(s, attempt)
            replica.node = node
            s.flush()
            note_node_end(s, replica, _verdict(reason), failures)

    def ends(self, steps: list[tuple[str, Reason]], failures: int | None = 3) -> None:
        for trial, reason in steps:
            self.end(trial, reason, failures)

    def node(self, node: str = NODE) -> NodeView | None:
        with self.store.session_scope() as s:
            row = s.get(ClusterNode, node)
            if row is None:
                return None
            return NodeView(list(row.failed_trials), row.quarantined_at is not None,
                            row.quarantine_reason)

    def streak(self, node: str = NODE) -> list[str]:
        """The node's streak, as trial names."""
        names = {tid: name for name, tid in self.trials.items()}
        view = self.node(node)
        assert view is not None, f"no row for {node}"
        return [names[t] for t in view.failed_trials]

    def node_count(self) -> int:
        with self.store.session_scope() as s:
            return len(s.scalars(select(ClusterNode.id)).all())

    def quarantine_events(self) -> list[tuple[int | None, int | None, str]]:
        """(experiment_id, trial_id, message) of every "node quarantined" event."""
        with self.store.session_scope() as s:
            return [(e.experiment_id, e.trial_id, e.message or "") for e in s.scalars(
                select(Event).where(Event.reason == EventReason.NODE_QUARANTINED.value)
                .order_by(Event.id))]

    def release(self, node: str = NODE) -> bool:
        with self.store.session_scope() as s:
            return release_node(s, node)


@pytest.fixture
def cluster(sqlite_store: Store) -> Cluster:
    with sqlite_store.session_scope() as s:
        experiment = add_experiment(s, name="breaker")
        trials = {name: add_trial(s, experiment, state="RUNNING").id for name in "abcde"}
    return Cluster(sqlite_store, trials)


def _experiment_id(cluster: Cluster) -> int:
    with cluster.store.session_scope() as s:
        return s.scalars(select(Experiment.id)).one()


# (what, ends, the streak afterwards, quarantined) with failures=3 on one node.
STREAKS: list[tuple[str, list[tuple[str, Reason]], list[str], bool]] = [
    ("three trials, one infra end each",
     [("a", Reason.INFRA), ("b", Reason.LOST), ("c", Reason.STALLED)], ["a", "b", "c"], True),
    ("two trials are not enough",
     [("a", Reason.INFRA), ("b", Reason.INFRA)], ["a", "b"], False),
    ("one trial three times counts once",
     [("a", Reason.INFRA), ("a", Reason.LOST), ("a", Reason.STALLED)], ["a"], False),
    ("a trial seen again moves to the end",
     [("a", Reason.INFRA), ("b", Reason.INFRA), ("a", Reason.LOST)], ["b", "a"], False),
    ("a repeat then a third trial",
     [("a", Reason.INFRA), ("b", Reason.INFRA), ("a", Reason.INFRA), ("c", Reason.INFRA)],
     ["b", "a", "c"], True),
    ("an OK end in between clears the streak",
     [("a", Reason.INFRA), ("b", Reason.INFRA), ("c", Reason.OK), ("c", Reason.INFRA)],
     ["c"], False),
    ("the OK end of a trial already in the streak clears it too",
     [("a", Reason.INFRA), ("b", Reason.INFRA), ("b", Reason.OK), ("c", Reason.INFRA)],
     ["c"], False),
    ("STOPPED in between changes nothing",
     [("a", Reason.INFRA), ("b", Reason.STOPPED), ("b", Reason.INFRA), ("c", Reason.INFRA)],
     ["a", "b", "c"], True),
    ("INTERNAL and CAPACITY in between change nothing",
     [("a", Reason.INFRA), ("d", Reason.INTERNAL), ("b", Reason.INFRA),
      ("e", Reason.CAPACITY), ("c", Reason.STALLED)], ["a", "b", "c"], True),
]


@pytest.mark.parametrize(("ends", "streak", "quarantined"),
                         [pytest.param(e, st, q, id=what) for what, e, st, q in STREAKS])
def test_the_streak_and_the_quarantine(cluster: Cluster, ends: list[tuple[str, Reason]],
                                       streak: list[str], quarantined: bool) -> None:
    cluster.ends(ends)
    view = cluster.node()
    assert view is not None
    assert cluster.streak() == streak
    assert view.quarantined is quarantined
    assert len(cluster.quarantine_events()) == int(quarantined)


def test_a_quarantine_records_why_and_one_event_on_the_last_trial(cluster: Cluster) -> None:
    before = time.time()
    cluster.ends([("a", Reason.INFRA), ("b", Reason.LOST), ("c", Reason.STALLED)])
    view = cluster.node()
    assert view is not None and view.quarantined
    ids = [cluster.trials[t] for t in "abc"]
    assert view.failed_trials == ids
    assert view.reason is not None
    assert "3 different trials in a row" in view.reason
    assert f"trials {ids[0]}, {ids[1]}, {ids[2]}" in view.reason
    with cluster.store.session_scope() as s:
        row = s.get_one(ClusterNode, NODE)
        assert row.quarantined_at is not None and before <= row.quarantined_at <= time.time()
    [(experiment_id, trial_id, message)] = cluster.quarantine_events()
    assert (experiment_id, trial_id) == (_experiment_id(cluster), cluster.trials["c"])
    assert f"node {NODE} quarantined" in message
    assert f"`muster cluster node release {NODE}`" in message
    assert view.reason in message


@pytest.mark.parametrize("reason", JOBS_OWN, ids=lambda r: r.value)
def test_each_end_of_the_jobs_own_clears_the_streak(cluster: Cluster, reason: Reason) -> None:
    cluster.ends([("a", Reason.INFRA), ("b", Reason.INFRA), ("c", reason)])
    assert cluster.streak() == []
    cluster.ends([("d", Reason.INFRA), ("e", Reason.INFRA)])
    view = cluster.node()
    assert view is not None and not view.quarantined  # counts afresh: 2 of 3
    assert cluster.streak() == ["d", "e"]


@pytest.mark.parametrize("reason", MUSTERS_OWN, ids=lambda r: r.value)
def test_musters_own_stops_change_nothing(cluster: Cluster, reason: Reason) -> None:
    cluster.end("a", reason)
    assert cluster.node() is None  # no row for a node that only saw muster's own ends
    cluster.ends([("a", Reason.INFRA), ("b", Reason.INFRA)])
    with cluster.store.session_scope() as s:
        before = s.get_one(ClusterNode, NODE).updated_at
    cluster.end("c", reason)
    with cluster.store.session_scope() as s:
        assert s.get_one(ClusterNode, NODE).updated_at == before
    assert cluster.streak() == ["a", "b"]


@pytest.mark.parametrize("reason", INFRA, ids=lambda r: r.value)
def test_each_infra_reason_counts(cluster: Cluster, reason: Reason) -> None:
    cluster.ends([("a", reason), ("b", reason), ("c", reason)])
    view = cluster.node()
    assert view is not None and view.quarantined
    assert reason.value in (view.reason or "")


@pytest.mark.parametrize("reason", JOBS_OWN, ids=lambda r: r.value)
def test_a_clean_end_on_a_node_without_a_row_writes_none(cluster: Cluster,
                                                         reason: Reason) -> None:
    cluster.end("a", reason)
    assert cluster.node_count() == 0


@pytest.mark.parametrize("reason", [*INFRA, *JOBS_OWN, *MUSTERS_OWN], ids=lambda r: r.value)
def test_the_breaker_off_never_writes_a_row(cluster: Cluster, reason: Reason) -> None:
    cluster.ends([(t, reason) for t in "abcde"], failures=None)
    assert cluster.node_count() == 0
    assert cluster.quarantine_events() == []


def test_a_replica_without_a_node_is_not_counted(cluster: Cluster) -> None:
    for trial in "abcde":
        cluster.end(trial, Reason.INFRA, node=None)
    assert cluster.node_count() == 0
    assert cluster.quarantine_events() == []


def test_each_node_has_its_own_streak(cluster: Cluster) -> None:
    cluster.end("a", Reason.INFRA, node="node-a")
    cluster.end("b", Reason.INFRA, node="node-b")
    cluster.end("c", Reason.INFRA, node="node-a")
    cluster.end("d", Reason.OK, node="node-b")
    cluster.end("e", Reason.INFRA, node="node-a")
    assert cluster.streak("node-a") == ["a", "c", "e"]
    assert cluster.streak("node-b") == []
    a, b = cluster.node("node-a"), cluster.node("node-b")
    assert a is not None and a.quarantined
    assert b is not None and not b.quarantined
    [(_, _, message)] = cluster.quarantine_events()
    assert "node node-a quarantined" in message


def test_a_threshold_of_one_quarantines_at_the_first_infra_end(cluster: Cluster) -> None:
    cluster.end("a", Reason.LOST, failures=1)
    view = cluster.node()
    assert view is not None and view.quarantined
    assert len(cluster.quarantine_events()) == 1


def test_a_quarantined_node_stays_quarantined_and_is_announced_once(cluster: Cluster) -> None:
    cluster.ends([("a", Reason.INFRA), ("b", Reason.INFRA), ("c", Reason.INFRA)])
    cluster.ends([("d", Reason.OK), ("d", Reason.INFRA), ("e", Reason.STALLED)])
    view = cluster.node()
    assert view is not None and view.quarantined
    # A clean end does not clear the streak of a quarantined node; later failures join it.
    assert cluster.streak() == ["a", "b", "c", "d", "e"]
    assert len(cluster.quarantine_events()) == 1


def test_release_returns_the_node_once_and_clears_its_streak(cluster: Cluster) -> None:
    cluster.ends([("a", Reason.INFRA), ("b", Reason.LOST), ("c", Reason.STALLED)])
    assert cluster.release() is True
    assert cluster.node() == NodeView([], False, None)
    assert cluster.release() is False
    assert cluster.node() == NodeView([], False, None)
    # Counted afresh: two more failures are not enough, a third different trial is.
    cluster.ends([("a", Reason.INFRA), ("b", Reason.INFRA)])
    view = cluster.node()
    assert view is not None and not view.quarantined
    cluster.end("c", Reason.INFRA)
    view = cluster.node()
    assert view is not None and view.quarantined
    assert len(cluster.quarantine_events()) == 2


def test_release_of_a_node_not_quarantined_or_unknown_is_false(cluster: Cluster) -> None:
    assert cluster.release("nowhere") is False
    assert cluster.node_count() == 0  # not created by asking
    cluster.ends([("a", Reason.INFRA), ("b", Reason.INFRA)])
    assert cluster.release() is False
    assert cluster.streak() == ["a", "b"]  # a node not quarantined keeps its streak
