"""Users' notification subscriptions and the notification log: what `muster notify`, the
account page and their routes call. Routing and delivery are `muster.notifications` and
`muster.notifier`; this is who may see and change what.

A user manages their own subscriptions; an admin anyone's. The log shows a user the
notifications of their own subscriptions; an admin every one, the cluster config's too.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence

from sqlalchemy import func, select, true
from sqlalchemy.orm import Session

from muster import api
from muster.config.cluster import NotificationConfig
from muster.errors import Conflict, InvalidRequest, NotFound
from muster.notifications import (
    MAX_SUBSCRIPTIONS,
    TargetError,
    check_user_url,
    config_key,
    redact,
    webhook_url,
)
from muster.services.access import Action, Principal, authorize
from muster.states import EventReason, NotificationKind
from muster.store import (
    NotificationOutbox,
    NotificationSubscription,
    Store,
    User,
    record_event,
)

__all__ = ["DEFAULT_LOG", "MAX_LOG", "add_subscription", "list_notifications",
           "list_subscriptions", "remove_subscription"]

DEFAULT_LOG = 50
MAX_LOG = 500


def add_subscription(store: Store, principal: Principal, url: str,
                     events: Sequence[str] | None, *,
                     allowed_hosts: Sequence[str] = ()) -> api.NewNotificationSubscription:
    """Subscribe the caller to `events` (None: all) of their own work at `url`, checked
    against who they are (`muster.notifications.check_user_url`). An http(s) URL is
    muster's signed webhook: its signing key is made here and shown this once.

    Raises:
        InvalidRequest: a URL the caller may not use, with what to write instead, or an
            event that is none.
        Conflict: the caller holds `MAX_SUBSCRIPTIONS` already.
    """
    authorize(principal, Action.OWN_ACCOUNT)
    try:
        check_user_url(url, admin=principal.is_admin, allowed_hosts=allowed_hosts)
    except TargetError as exc:
        raise InvalidRequest(str(exc)) from exc
    chosen = sorted(_kinds(events))
    secret = secrets.token_hex(32) if webhook_url(url) else None
    with store.session_scope() as s:
        held = s.scalar(select(func.count()).select_from(NotificationSubscription)
                        .where(NotificationSubscription.user_id == principal.user_id))
        if held is not None and held >= MAX_SUBSCRIPTIONS:
            raise Conflict(f"you hold {held} notification subscriptions, the most there may "
                           "be; remove some first (muster notify list, muster notify remove "
                           "ID)")
        row = NotificationSubscription(user_id=principal.user_id, url=url,
                                       events=[k.value for k in chosen], secret=secret)
        s.add(row)
        s.flush()
        record_event(s, entity="user", entity_id=principal.user_id,
                     reason=EventReason.NOTIFICATION_ADDED, actor=principal.name,
                     message=f"notification {row.id} to {redact(url)} for "
                             f"{', '.join(row.events)}")
        return {**_view(row, principal.name), "secret": secret}


def list_subscriptions(store: Store, principal: Principal, everyone: bool = False
                       ) -> list[api.NotificationSubscriptionView]:
    """The caller's subscriptions (an admin with `everyone`: all users'), oldest first."""
    authorize(principal, Action.MANAGE_USERS if everyone else Action.OWN_ACCOUNT)
    query = (select(NotificationSubscription, User.name)
             .join(User, User.id == NotificationSubscription.user_id)
             .order_by(NotificationSubscription.id))
    if not everyone:
        query = query.where(NotificationSubscription.user_id == principal.user_id)
    with store.session_scope() as s:
        return [_view(row, name) for row, name in s.execute(query)]


def remove_subscription(store: Store, principal: Principal, subscription_id: int
                        ) -> api.NotificationSubscriptionView:
    """Remove one of the caller's subscriptions (an admin: anyone's). Its notifications
    not yet delivered fail ("the subscription was removed").

    Raises:
        NotFound: no such subscription of the caller's.
    """
    with store.session_scope() as s:
        row = _subscription(s, principal, subscription_id)
        owner = s.get_one(User, row.user_id)
        view = _view(row, owner.name)
        s.delete(row)
        record_event(s, entity="user", entity_id=row.user_id,
                     reason=EventReason.NOTIFICATION_REMOVED, actor=principal.name,
                     message=f"notification {row.id} to {view['url']} of {owner.name}")
        return view


def list_notifications(store: Store, principal: Principal, entries: Sequence[NotificationConfig],
                       limit: int = DEFAULT_LOG) -> list[api.NotificationView]:
    """The latest `limit` notifications, newest first: of the caller's subscriptions, or
    (an admin) all of them, the cluster config's `entries` included.

    Raises:
        InvalidRequest: `limit` out of 1..MAX_LOG.
    """
    if not 1 <= limit <= MAX_LOG:
        raise InvalidRequest(f"limit must be 1 to {MAX_LOG}")
    authorize(principal, Action.OWN_ACCOUNT)
    with store.session_scope() as s:
        mine = {f"user:{i}": url for i, url in s.execute(
            select(NotificationSubscription.id, NotificationSubscription.url).where(
                true() if principal.is_admin
                else NotificationSubscription.user_id == principal.user_id))}
        urls = dict(mine)
        if principal.is_admin:
            urls.update({config_key(e): e.url for e in entries})
        query = select(NotificationOutbox).order_by(NotificationOutbox.id.desc()).limit(limit)
        if not principal.is_admin:
            if not mine:
                return []
            query = query.where(NotificationOutbox.target.in_(list(mine)))
        return [_notification(row, urls.get(row.target)) for row in s.scalars(query)]


def _kinds(words: Sequence[str] | None) -> set[NotificationKind]:
    """The kinds named (None: all of them).

    Raises:
        InvalidRequest: a word that names none.
    """
    if words is None:
        return set(NotificationKind)
    known = {k.value: k for k in NotificationKind}
    unknown = [w for w in words if w not in known]
    if unknown or not words:
        raise InvalidRequest(f"events: {', '.join(map(repr, unknown)) or 'none'} is not a "
                             f"notification; name some of {', '.join(known)}")
    return {known[w] for w in words}


def _subscription(s: Session, principal: Principal,
                  subscription_id: int) -> NotificationSubscription:
    row = s.get(NotificationSubscription, subscription_id)
    if row is None or (row.user_id != principal.user_id and not principal.is_admin):
        raise NotFound(f"notification {subscription_id} is not one of yours; `muster notify "
                       "list` shows yours")
    authorize(principal, Action.OWN_ACCOUNT if row.user_id == principal.user_id
              else Action.MANAGE_USERS)
    return row


def _view(row: NotificationSubscription, user: str) -> api.NotificationSubscriptionView:
    return {"id": row.id, "user": user, "url": redact(row.url), "events": list(row.events),
            "signed": row.secret is not None, "created_at": row.created_at}


def _notification(row: NotificationOutbox, url: str | None) -> api.NotificationView:
    title = row.payload.get("title")
    return {"id": row.id, "event_id": row.event_id, "kind": row.kind, "target": row.target,
            "url": "" if url is None else redact(url), "state": row.state,
            "tries": row.tries, "last_error": row.last_error, "created_at": row.created_at,
            "delivered_at": row.delivered_at,
            "title": title if isinstance(title, str) else None}
