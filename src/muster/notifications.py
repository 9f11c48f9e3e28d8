"""Notifications (issue 36): which events are told to whom, written down with the event.

**Routing.** `Router.install(store)` hooks the store's sessions: after each flush, every new
event that is a notification (`kind_of`) gets one `notification_outbox` row per target that
wants it, inserted on the flush's own connection, so in the event's own transaction: a
notification is never lost once its event is committed, and never sent for an event that
was rolled back (ARCHITECTURE, "Operations"). This costs a pass nothing for the events that
are not notifications (all but a few), and one or two small queries for those that are.
The rows hold the event's facts; the notifier (`muster.notifier`) renders and delivers them,
in its own thread, so no pass ever waits for a receiver.

**Targets.**
- The cluster config's `notifications` (`target` "config:<digest>", `config_key`): each
  entry's events, of every owner or of the `owners` it names; cluster-wide kinds (the disk
  guard, a quarantined node) go to every entry that asks for them.
- Users' own subscriptions (`muster notify add`, target "user:<id>"): the events of their
  own experiments and models, and, for admins, the cluster-wide kinds too.

**URLs and secrets.** An `http(s)://` URL is muster's own signed webhook
(`muster.webhooks`); any other scheme is an Apprise URL (Slack, Teams, Discord, e-mail,
ntfy, `json://`...). The cluster config names its URLs and signing keys as references
(`env:NAME`, `file:/path`) or literally; they are resolved at each delivery, never stored
in the outbox, and shown only as `redact` makes them (scheme and host). A user's own
subscription is checked against who they are (`check_user_url`): an ordinary user names a
literal URL of the schemes in `USER_SCHEMES`, a webhook's host public or listed in the
cluster config's `notification_hosts` (checked again at each delivery), and never a
reference (that would make the server read its own environment or files for them).
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import os
import socket
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from sqlalchemy import event as sa_event
from sqlalchemy import insert, select
from sqlalchemy.orm import Session

from muster.config.cluster import NotificationConfig
from muster.states import (
    EventReason,
    ExperimentState,
    NotificationKind,
    OutboxState,
    Reason,
    Role,
    TrialState,
)
from muster.store import (
    Event,
    Experiment,
    NotificationOutbox,
    NotificationSubscription,
    RegisteredModel,
    Store,
    User,
)
from muster.store.models import now

__all__ = ["MAX_SUBSCRIPTIONS", "MAX_URL", "USER_SCHEMES", "WEBHOOK_SCHEMES", "Router",
           "TargetError", "check_apprise_url", "check_host", "check_user_url", "config_key",
           "config_wants", "is_reference", "kind_of", "redact", "resolve", "webhook_url"]


MAX_URL = 2048  # characters of a notification URL
MAX_SUBSCRIPTIONS = 20  # a user's own
MAX_REFERENCED = 4096  # bytes of a `file:` reference's content
# The schemes whose URL names the host posted to (their host is shown when redacted).
HOST_SCHEMES = frozenset({"http", "https", "json", "jsons", "form", "forms", "xml", "xmls",
                          "ntfy", "ntfys", "mailto", "mailtos"})
# What an ordinary user's subscription may be: muster's webhook (to a host checked by
# `check_host`, never following a redirect), and the chat services whose URL names tokens,
# not hosts (Apprise posts them to the service's own public endpoint). Apprise's generic
# posts (json://...) follow redirects, so they are the cluster config's alone.
WEBHOOK_SCHEMES = frozenset({"http", "https"})
USER_SCHEMES = WEBHOOK_SCHEMES | {"slack", "msteams", "discord"}
_ENDED = frozenset({ExperimentState.COMPLETED, ExperimentState.ERROR, ExperimentState.CANCELED})


class TargetError(ValueError):
    """A URL that cannot be a notification target, or a reference that does not resolve;
    the message says what to write instead."""


def config_key(entry: NotificationConfig) -> str:
    """An entry's outbox `target`: stable while the entry is unchanged, across restarts."""
    text = json.dumps([entry.url, sorted(entry.events), sorted(entry.owners)])
    return "config:" + hashlib.sha256(text.encode()).hexdigest()[:12]


def config_wants(entry: NotificationConfig, kind: NotificationKind, owner: str | None) -> bool:
    """Whether a cluster config entry asks for this notification of this owner's work."""
    if kind not in entry.events:
        return False
    return kind.cluster_wide or not entry.owners or owner in entry.owners


def kind_of(event: Event) -> NotificationKind | None:
    """The notification an event is, if any.

    An experiment's end; a trial's move to SUSPECT or to FAILED (not a person's review:
    they know); an attempt that ended STALLED (the replica's stack summary is in by then);
    the disk guard's engagement (its one `cluster` event, not each running trial's warning);
    a node quarantined; a model version registered or staged."""
    reason, to_state = event.reason, event.to_state
    if event.entity == "experiment" and to_state in _ENDED:
        return NotificationKind.EXPERIMENT_ENDED
    if event.entity == "trial" and to_state == TrialState.SUSPECT:
        return NotificationKind.TRIAL_SUSPECT
    if (event.entity == "trial" and to_state == TrialState.FAILED
            and reason != EventReason.REVIEW_REJECTED):
        return NotificationKind.TRIAL_FAILED
    if event.entity == "attempt" and to_state is not None and reason == Reason.STALLED:
        return NotificationKind.TRIAL_STALLED
    if event.entity == "cluster" and reason == EventReason.DISK_LOW:
        return NotificationKind.DISK_GUARD
    if reason == EventReason.NODE_QUARANTINED:
        return NotificationKind.NODE_QUARANTINED
    if event.entity == "model" and reason == EventReason.MODEL_REGISTERED:
        return NotificationKind.MODEL_REGISTERED
    if event.entity == "model" and reason == EventReason.MODEL_STAGED:
        return NotificationKind.MODEL_STAGED
    return None


@dataclass
class Router:
    """Writes the outbox rows of each flushed event (see the module's docstring)."""

    entries: Sequence[NotificationConfig] = ()  # the cluster config's
    # Told after a commit that wrote outbox rows: the notifier's wake-up.
    on_queued: Callable[[], None] | None = None
    _pending: threading.local = field(default_factory=threading.local, repr=False)

    def install(self, store: Store) -> None:
        sessions = store.session_factory
        sa_event.listen(sessions, "after_flush", self._after_flush)
        sa_event.listen(sessions, "after_commit", self._after_commit)

    def _after_flush(self, session: Session, _context: object) -> None:
        events = [obj for obj in session.new if isinstance(obj, Event)]
        if not events:
            return
        routed = [(e, kind) for e in events if (kind := kind_of(e)) is not None]
        if not routed:
            return
        rows = self._rows(session, routed)
        if rows:
            session.connection().execute(insert(NotificationOutbox), rows)
            self._pending.queued = True

    def _after_commit(self, _session: Session) -> None:
        if getattr(self._pending, "queued", False):
            self._pending.queued = False
            if self.on_queued is not None:
                self.on_queued()

    def _rows(self, session: Session,
              routed: list[tuple[Event, NotificationKind]]) -> list[dict[str, Any]]:
        connection = session.connection()
        subscriptions = connection.execute(
            select(NotificationSubscription.id, NotificationSubscription.user_id,
                   NotificationSubscription.events, User.role)
            .join(User, User.id == NotificationSubscription.user_id)
            .where(User.active.is_(True))).all()
        rows: list[dict[str, Any]] = []
        disk_told = False
        at = now()
        for event, kind in routed:
            if kind is NotificationKind.DISK_GUARD:
                if disk_told:
                    continue  # one engagement, one notification
                disk_told = True
            owner_id, owner = _owner(connection, event, kind)
            targets = [config_key(e) for e in self.entries if config_wants(e, kind, owner)]
            for sub_id, user_id, events, role in subscriptions:
                if kind.value not in events:
                    continue
                if (user_id == owner_id and not kind.cluster_wide) or (
                        kind.cluster_wide and Role(role) is Role.ADMIN):
                    targets.append(f"user:{sub_id}")
            rows.extend(
                {"event_id": event.id, "target": target, "kind": kind.value,
                 "payload": {"owner": owner}, "state": OutboxState.PENDING.value,
                 "tries": 0, "next_at": at, "created_at": at}
                for target in targets)
        return rows


def _owner(connection: Any, event: Event,
           kind: NotificationKind) -> tuple[int | None, str | None]:
    """Whose work the event is about: its experiment's owner, or its model's."""
    if kind.cluster_wide and event.experiment_id is None:
        return None, None
    if event.entity == "model":
        query = (select(User.id, User.name).join(RegisteredModel,
                                                   RegisteredModel.owner_id == User.id)
                 .where(RegisteredModel.id == event.entity_id))
    elif event.experiment_id is not None:
        query = (select(User.id, User.name).join(Experiment, Experiment.owner_id == User.id)
                 .where(Experiment.id == event.experiment_id))
    else:
        return None, None
    found = connection.execute(query).first()
    return (None, None) if found is None else (found[0], found[1])


def resolve(reference: str) -> str:
    """A URL or key as written, or what `env:NAME` / `file:/path` names on this server.

    Raises:
        TargetError: the variable is not set, or the file cannot be read (or is empty).
    """
    kind, _, where = reference.partition(":")
    if kind == "env" and where and "/" not in reference[:6]:
        value = os.environ.get(where, "").strip()
        if not value:
            raise TargetError(f"the server's environment has no ${where}: set it where "
                              "`muster up` runs, or change the cluster config's reference")
        return value
    if kind == "file" and where.startswith("/"):
        try:
            with open(where, "rb") as handle:
                text = handle.read(MAX_REFERENCED + 1)
        except OSError as exc:
            raise TargetError(f"the server cannot read {where}: {exc.strerror}") from exc
        if len(text) > MAX_REFERENCED or not text.strip():
            raise TargetError(f"{where} must hold one URL or key (1 to {MAX_REFERENCED} "
                              "bytes)")
        return text.decode(errors="replace").strip()
    return reference


def is_reference(text: str) -> bool:
    return text.startswith("env:") or text.startswith("file:")


def webhook_url(url: str) -> bool:
    """Whether `url` is muster's own signed webhook (http/https) rather than Apprise's."""
    return urlsplit(url).scheme.lower() in WEBHOOK_SCHEMES


def redact(url: str) -> str:
    """What may be shown of a target: a reference as written (it holds no secret), else
    the scheme and host alone (`slack://…`, `https://hooks.example.com/…`)."""
    if is_reference(url):
        return url
    parts = urlsplit(url)
    host = parts.hostname if parts.scheme.lower() in HOST_SCHEMES else None
    if host is None:
        return f"{parts.scheme}://…" if parts.scheme else "…"
    port = f":{parts.port}" if _port(parts) is not None else ""
    return f"{parts.scheme}://{host}{port}/…"


def _port(parts: Any) -> int | None:
    try:
        return parts.port  # type: ignore[no-any-return]
    except ValueError:
        return None


def check_apprise_url(url: str) -> None:
    """An Apprise URL Apprise can parse (checked without sending anything).

    Raises:
        TargetError: it cannot, with where to look.
    """
    import apprise  # only where an Apprise URL is checked or sent (an import of ~0.2 s)

    if apprise.Apprise.instantiate(url) is None:
        raise TargetError(f"{redact(url)} is not a URL Apprise can send to (a wrong number of "
                          "tokens, or an unknown service); see "
                          "https://github.com/caronc/apprise/wiki for its form")


def check_user_url(url: str, *, admin: bool, allowed_hosts: Iterable[str],
                   lookup: bool = True) -> None:
    """A subscription's URL, checked against who adds it (see the module's docstring).

    Raises:
        TargetError: what is wrong with it, and what to write instead.
    """
    if not url or len(url) > MAX_URL or any(c.isspace() for c in url):
        raise TargetError(f"a notification URL is 1 to {MAX_URL} characters without spaces")
    if is_reference(url):
        if admin:
            return
        raise TargetError("env: and file: references name the server's own secrets: only an "
                          "admin may use them (in the cluster config's notifications); give "
                          "the URL itself")
    scheme = urlsplit(url).scheme.lower()
    if not scheme:
        raise TargetError(f"{redact(url)} has no scheme: write https://… for muster's signed "
                          "webhook, or an Apprise URL such as slack://… or json://…")
    if not admin and scheme not in USER_SCHEMES:
        raise TargetError(f"{scheme}:// is not one a user may add (one of "
                          f"{', '.join(sorted(USER_SCHEMES))}); ask an admin to add it to "
                          "the cluster config's notifications")
    if scheme not in WEBHOOK_SCHEMES:
        check_apprise_url(url)
    elif not admin:
        check_host(url, allowed_hosts, lookup=lookup)


def check_host(url: str, allowed_hosts: Iterable[str], *, lookup: bool = True) -> None:
    """The URL's host is one the server may post to for a user: listed in the cluster
    config's `notification_hosts`, or one whose every address is public (not loopback,
    private, link-local or reserved: a user never makes the server reach its own network).

    Raises:
        TargetError: it is not, with the fix.
    """
    host = urlsplit(url).hostname
    if not host:
        raise TargetError(f"{redact(url)} names no host")
    allowed = {h.lower() for h in allowed_hosts}
    if host.lower() in allowed:
        return
    addresses = _addresses(host) if lookup else []
    private = [a for a in addresses if not ipaddress.ip_address(a).is_global]
    if private or (lookup and not addresses):
        what = f"{host} ({', '.join(private)})" if private and private != [host] else host
        raise TargetError(f"{what} is not a public address: the server posts users' "
                          "notifications only to public hosts and to those an admin lists "
                          "in the cluster config's notification_hosts")


def _addresses(host: str) -> list[str]:
    literal = _ip_literal(host)
    if literal is not None:
        return [literal]
    try:
        found = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError):
        return []
    return sorted({str(info[4][0]).split("%", 1)[0] for info in found})


def _ip_literal(host: str) -> str | None:
    """The address `host` spells, or None for a name (to be looked up)."""
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        return None
