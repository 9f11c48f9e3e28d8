"""The audit trail read back by experiment, actor and kind, a page at a time
(`muster.services.audit`), on SQLite and PostgreSQL (the `store` fixture): what the
experiment page's events section and `GET /api/v1/events` show."""

from __future__ import annotations

import pytest

from muster import api
from muster.errors import NotFound
from muster.services import audit
from muster.states import EventReason
from muster.store import Experiment, Store
from muster.store.transitions import record_event

# (actor, kind) of the events recorded, in order; the other experiment's come between.
SCRIPT = ([("alice", EventReason.CREATED)] + [("system:supervisor", EventReason.LAUNCHING)] * 3
          + [("alice", EventReason.PRIORITY_CHANGED)] * 7 + [("bob", EventReason.KILLED)])


def seed(store: Store) -> tuple[int, int, list[int]]:
    """Two experiments, the first with SCRIPT's events; returns both ids and the first's
    event ids in order."""
    with store.session_scope() as s:
        first, other = (Experiment(name=name, config={}, config_yaml="", context_dir="/tmp",
                                   state="ACTIVE") for name in ("first", "other"))
        s.add_all([first, other])
        s.flush()
        recorded = []
        for actor, kind in SCRIPT:
            recorded.append(record_event(s, entity="experiment", entity_id=first.id,
                                         reason=kind, actor=actor, message=None,
                                         experiment_id=first.id))
            record_event(s, entity="experiment", entity_id=other.id, reason=kind,
                         actor="carol", message=None, experiment_id=other.id)
        s.flush()
        return first.id, other.id, [event.id for event in recorded]


def _ids(events: list[api.AuditEvent]) -> list[int]:
    return [e["id"] for e in events]


def test_pages_before_an_event_walk_the_trail_back_to_its_start(store: Store) -> None:
    first, _, ids = seed(store)
    newest = audit.list_events(store, experiment_id=first, tail=5)
    assert _ids(newest) == ids[-5:]  # oldest first within the page
    before = audit.list_events(store, experiment_id=first, tail=5, before_id=ids[-5])
    assert _ids(before) == ids[-10:-5]
    last = audit.list_events(store, experiment_id=first, tail=5, before_id=ids[-10])
    assert _ids(last) == ids[:2]
    assert audit.list_events(store, experiment_id=first, tail=5, before_id=ids[0]) == []


def test_events_filter_by_kind_and_actor(store: Store) -> None:
    first, _, ids = seed(store)
    priority = audit.list_events(store, experiment_id=first, kind="priority changed")
    assert _ids(priority) == ids[4:11]
    assert {e["kind"] for e in priority} == {"priority changed"}
    alice = audit.list_events(store, experiment_id=first, actor="alice", tail=3)
    assert _ids(alice) == ids[8:11]
    assert audit.list_events(store, experiment_id=first, actor="bob", kind="priority changed") == []
    assert audit.list_events(store, experiment_id=first, kind="no such kind") == []


def test_facets_count_an_experiments_events_by_kind_and_actor(store: Store) -> None:
    first, other, _ = seed(store)
    facets = audit.event_facets(store, first)
    assert facets.total == len(SCRIPT)
    assert facets.kinds == [("priority changed", 7), ("launching", 3), ("created", 1),
                            ("killed", 1)]
    assert facets.actors == [("alice", 8), ("system:supervisor", 3), ("bob", 1)]
    assert audit.event_facets(store, other).actors == [("carol", len(SCRIPT))]


def test_an_experiment_that_does_not_exist_is_named(store: Store) -> None:
    with pytest.raises(NotFound, match="experiment 999 does not exist"):
        audit.list_events(store, experiment_id=999, kind="priority changed")
