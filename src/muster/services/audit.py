"""The audit trail: the event log read back, by experiment, trial or acting user.

Every event names who acted (`actor`: a user's name, or `system:...`), so this is the
answer to "who killed experiment 12" and "what did alice do today".
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import Select, func, select
from sqlalchemy.orm import InstrumentedAttribute, Session

from muster import api
from muster.errors import NotFound
from muster.store import Event, Experiment, Store, Trial

__all__ = ["DEFAULT_LIMIT", "MAX_LIMIT", "EventFacets", "event_entry", "event_facets",
           "last_event_id", "list_events"]

DEFAULT_LIMIT = 100
MAX_LIMIT = 1000
MAX_FACETS = 100  # kinds, and actors, an experiment's events are counted by


def list_events(store: Store, *, experiment_id: int | None = None,
                trial_id: int | None = None, actor: str | None = None,
                kind: str | None = None, after_id: int | None = None,
                before_id: int | None = None, limit: int = DEFAULT_LIMIT,
                tail: int | None = None) -> list[api.AuditEvent]:
    """Events oldest first, of an experiment, a trial, an actor, a kind (their `reason`):
    the first `limit` after `after_id`, or the last `tail` (before `before_id`: the page
    before the one that starts there).

    Raises:
        NotFound: the experiment or trial named does not exist.
    """
    query = select(Event)
    if experiment_id is not None:
        query = query.where(Event.experiment_id == experiment_id)
    if trial_id is not None:
        query = query.where(Event.trial_id == trial_id)
    if actor is not None:
        query = query.where(Event.actor == actor)
    if kind is not None:
        query = query.where(Event.reason == kind)
    if after_id is not None:
        query = query.where(Event.id > after_id)
    if before_id is not None:
        query = query.where(Event.id < before_id)
    with store.session_scope() as s:
        _check_exists(s.get(Experiment, experiment_id) if experiment_id else True,
                      f"experiment {experiment_id}")
        _check_exists(s.get(Trial, trial_id) if trial_id else True, f"trial {trial_id}")
        return [event_entry(e) for e in s.scalars(_page(query, limit, tail))]


def last_event_id(store: Store) -> int:
    """The id of the newest event (0: none yet)."""
    with store.session_scope() as s:
        return s.scalar(select(func.max(Event.id))) or 0


@dataclass(frozen=True)
class EventFacets:
    """How many events an experiment has, in all and by kind and by actor (most first, at
    most MAX_FACETS of each): what its page's filters offer."""

    total: int
    kinds: list[tuple[str, int]]
    actors: list[tuple[str, int]]


def event_facets(store: Store, experiment_id: int) -> EventFacets:
    """The counts of `experiment_id`'s events, by kind and by actor."""
    with store.session_scope() as s:
        total = s.scalar(select(func.count()).select_from(Event).where(
            Event.experiment_id == experiment_id)) or 0
        return EventFacets(total, _counted(s, Event.reason, experiment_id),
                           _counted(s, Event.actor, experiment_id))


def _counted(s: Session, column: InstrumentedAttribute[str], experiment_id: int
             ) -> list[tuple[str, int]]:
    n = func.count()
    rows = s.execute(select(column, n).where(Event.experiment_id == experiment_id)
                     .group_by(column).order_by(n.desc(), column).limit(MAX_FACETS))
    return [(value, count) for value, count in rows]


def _page(query: Select[Event], limit: int, tail: int | None) -> Select[Event]:
    if tail is None:
        return query.order_by(Event.id).limit(limit)
    last = query.order_by(Event.id.desc()).limit(tail).subquery()
    return select(Event).join(last, Event.id == last.c.id).order_by(Event.id)


def _check_exists(found: object, what: str) -> None:
    if found is None:
        raise NotFound(f"{what} does not exist")


def event_entry(event: Event) -> api.AuditEvent:
    """An event as the audit trail shows it (`kind` is its reason)."""
    return {
        "id": event.id,
        "at": event.at,
        "actor": event.actor,
        "kind": event.reason,
        "message": event.message,
        "entity": event.entity,
        "entity_id": event.entity_id,
        "experiment_id": event.experiment_id,
        "trial_id": event.trial_id,
        "from_state": event.from_state,
        "to_state": event.to_state,
    }
