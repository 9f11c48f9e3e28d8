"""The notifier: delivers the outbox (`muster.notifications`), one thread beside the passes.

Each due row (PENDING, `next_at` passed) is claimed (SENDING, one more try) and committed
before anything is sent, then rendered (once: its first try stores the title, text, link
and details, so every retry sends the same body), sent, and settled: DELIVERED, or PENDING
again after `webhooks.backoff`, or FAILED after `MAX_TRIES` or when its target is gone. Every
try is a `notification_deliveries` row (the delivery log). A server killed while sending
leaves the row SENDING; the next server's notifier puts it back to PENDING and sends it
again: at least once, with the same `Idempotency-Key` (`key_of`), so a receiver that keeps
the keys it has seen acts once.

A receiver is given `SEND_TIMEOUT` seconds; the notifier sends one notification at a time, so
a slow receiver delays the others, never a pass.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from muster import webhooks
from muster.config.cluster import NotificationConfig
from muster.errors import MusterError
from muster.notifications import (
    TargetError,
    check_host,
    config_key,
    redact,
    resolve,
    webhook_url,
)
from muster.services import views
from muster.services.validation import best_validation
from muster.states import NotificationKind, OutboxState, TrialState
from muster.store import (
    Event,
    Experiment,
    NotificationDelivery,
    NotificationOutbox,
    NotificationSubscription,
    RegisteredModel,
    Replica,
    Store,
    Trial,
    User,
)
from muster.store.configs import experiment_searcher
from muster.store.models import now
from muster.verdicts import verdict_of

__all__ = ["MAX_TRIES", "Notifier", "key_of", "render"]

log = logging.getLogger(__name__)

MAX_TRIES = 12  # about 2.3 hours of backoff (2 s, 4 s, ... capped at an hour)
SEND_TIMEOUT = 10.0  # seconds a receiver has to answer
POLL_S = 2.0  # how often due retries are looked for when nothing wakes the notifier
MAX_BACKOFF_S = 60.0  # between looks while each fails (the database is away)
BATCH = 20  # rows read per look
MAX_ERROR = 1000  # characters of an error kept in the log
MAX_TEXT = 4000  # characters of a notification's text


def _log_sparingly(failures: int, message: str, *, with_traceback: bool) -> None:
    """A failed look at the outbox, logged the 1st, 2nd and 5th time in a row, then every
    60th (as the storage worker does): not a line every `POLL_S` while the database is away."""
    if failures in (1, 2, 5) or failures % 60 == 0:
        log.error("notifications: delivering failed: %s (%d in a row); tried again later",
                  message, failures, exc_info=with_traceback)


def key_of(row: NotificationOutbox) -> str:
    """The idempotency key: one per event and target, the same on every try."""
    return f"muster-{row.event_id}-{row.target}"


class TargetGone(TargetError):
    """The target no longer exists: its notifications fail for good."""


@dataclass(frozen=True)
class Target:
    url: str  # resolved
    secret: bytes | None  # the webhook's signing key
    check_host: bool  # a user's webhook: its host is checked at each delivery


class Notifier:
    """Delivers the outbox of `store` to the cluster config's `entries` and to users'
    subscriptions, linking to the web UI at `link_base()`."""

    def __init__(self, store: Store, entries: Sequence[NotificationConfig], *,
                 allowed_hosts: Sequence[str] = (), link_base: Callable[[], str] = str,
                 poll_s: float = POLL_S) -> None:
        self.store = store
        self.entries = {config_key(e): e for e in entries}
        self.allowed_hosts = tuple(allowed_hosts)
        self.link_base = link_base  # the web UI's address, read when a row is rendered
        self.poll_s = poll_s
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._requeue_interrupted()
        self._thread = threading.Thread(target=self._run, name="muster-notifier", daemon=True)
        self._thread.start()

    def wake(self) -> None:
        """New rows were committed: look now."""
        self._wake.set()

    def stop(self, wait: float = SEND_TIMEOUT + 2) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(wait)

    def _run(self) -> None:
        failures = 0
        while not self._stop.is_set():
            self._wake.wait(min(MAX_BACKOFF_S, self.poll_s * 2 ** min(failures, 6)))
            self._wake.clear()
            try:
                while not self._stop.is_set() and self.deliver_due() == BATCH:
                    pass
            except MusterError as exc:  # the database is away (StoreError): said, retried
                failures += 1
                _log_sparingly(failures, f"{exc}", with_traceback=False)
            except Exception as exc:  # noqa: BLE001 - logged with its traceback; retried
                failures += 1
                _log_sparingly(failures, f"{type(exc).__name__}: {exc}", with_traceback=True)
            else:
                failures = 0

    def _requeue_interrupted(self) -> None:
        """Rows a previous server was sending when it died: due again now."""
        with self.store.session_scope() as s:
            s.execute(update(NotificationOutbox)
                      .where(NotificationOutbox.state == OutboxState.SENDING.value)
                      .values(state=OutboxState.PENDING.value, next_at=now()))

    def deliver_due(self) -> int:
        """Send what is due (at most `BATCH`); how many were tried."""
        with self.store.session_scope() as s:
            due = s.scalars(select(NotificationOutbox.id)
                            .where(NotificationOutbox.state == OutboxState.PENDING.value,
                                   NotificationOutbox.next_at <= now())
                            .order_by(NotificationOutbox.id).limit(BATCH)).all()
        for row_id in due:
            if self._stop.is_set():
                break
            self._deliver(row_id)
        return len(due)

    def _deliver(self, row_id: int) -> None:
        claimed = self._claim(row_id)
        if claimed is None:
            return
        payload, target_name, tries, key = claimed
        try:
            target = self._target(target_name)
        except TargetError as exc:  # gone: failed for good; unresolved: tried again
            self._settle(row_id, tries, webhooks.Delivery(False, None, str(exc), "", 0.0),
                         final=isinstance(exc, TargetGone))
            return
        outcome = self._send(target, payload, key)
        self._settle(row_id, tries, outcome, final=False)

    def _claim(self, row_id: int) -> tuple[dict[str, Any], str, int, str] | None:
        """Mark the row SENDING (committed before sending), render it on its first try."""
        with self.store.session_scope() as s:
            row = s.get(NotificationOutbox, row_id, with_for_update=True)
            if row is None or row.state != OutboxState.PENDING.value:
                return None
            row.state, row.tries = OutboxState.SENDING.value, row.tries + 1
            if "title" not in row.payload:
                row.payload = render(s, row, self.link_base().rstrip("/"))
            return dict(row.payload), row.target, row.tries, key_of(row)

    def _target(self, name: str) -> Target:
        kind, _, ident = name.partition(":")
        if kind == "config":
            entry = self.entries.get(name)
            if entry is None:
                raise TargetGone("this target is no longer in the cluster config's "
                                 "notifications")
            secret = None if entry.secret is None else resolve(entry.secret).encode()
            return Target(resolve(entry.url), secret, check_host=False)
        with self.store.session_scope() as s:
            sub = s.get(NotificationSubscription, int(ident)) if ident.isdigit() else None
            user = None if sub is None else s.get(User, sub.user_id)
            if sub is None or user is None or not user.active:
                raise TargetGone("the subscription was removed (or its user deactivated)")
            return Target(sub.url, None if sub.secret is None else sub.secret.encode(),
                          check_host=user.role != "admin")

    def _send(self, target: Target, payload: dict[str, Any], key: str) -> webhooks.Delivery:
        if webhook_url(target.url):
            if target.secret is None:
                return webhooks.Delivery(False, None, "an http(s) target is muster's signed "
                                         "webhook and needs a secret", "", 0.0)
            if target.check_host:
                try:
                    check_host(target.url, self.allowed_hosts)
                except TargetError as exc:
                    return webhooks.Delivery(False, None, str(exc), "", 0.0)
            return webhooks.deliver(target.url, payload, key, target.secret,
                                    timeout=SEND_TIMEOUT)
        return _apprise(target.url, payload, key)

    def _settle(self, row_id: int, tries: int, outcome: webhooks.Delivery, *,
                final: bool) -> None:
        with self.store.session_scope() as s:
            row = s.get_one(NotificationOutbox, row_id)
            s.add(NotificationDelivery(outbox_id=row_id, ok=outcome.ok, status=outcome.status,
                                       error=_clip(outcome.error), elapsed_s=outcome.seconds))
            if outcome.ok:
                row.state, row.delivered_at, row.last_error = (OutboxState.DELIVERED.value,
                                                               now(), None)
                return
            row.last_error = _clip(outcome.error)
            if final or tries >= MAX_TRIES:
                row.state = OutboxState.FAILED.value
                log.warning("notification %d to %s failed for good after %d tries: %s",
                            row_id, row.target, tries, row.last_error)
            else:
                row.state, row.next_at = (OutboxState.PENDING.value,
                                          now() + webhooks.backoff(tries))


def _clip(text: str | None) -> str | None:
    return None if text is None else text[:MAX_ERROR]


def _apprise(url: str, payload: dict[str, Any], key: str) -> webhooks.Delivery:
    """One try through Apprise; its warnings are the error. Generic posts (json://, form://,
    xml://) carry the idempotency key as a header."""
    import time

    import apprise  # only the notifier needs it (an import of ~0.2 s)

    sender = apprise.Apprise()
    scheme = url.split("://", 1)[0].lower()
    if scheme in ("json", "jsons", "form", "forms", "xml", "xmls"):
        url += ("&" if "?" in url else "?") + "+Idempotency-Key=" + key
    if not sender.add(url):
        return webhooks.Delivery(False, None, f"Apprise does not know the URL {redact(url)}",
                                 "", 0.0)
    said: list[str] = []
    started = time.monotonic()
    result = sender.notify(
        body=payload["text"], title=payload["title"],
        log_callback=lambda entry, _plugin: said.append(str(entry.message))
        if entry.level in ("WARNING", "ERROR", "CRITICAL") else None)
    seconds = time.monotonic() - started
    ok = bool(result)
    error = None if ok else ("; ".join(said) or "Apprise could not send it")
    return webhooks.Delivery(ok, None, error, "", seconds)


def render(s: Session, row: NotificationOutbox, public_url: str) -> dict[str, Any]:
    """The notification a row is: `title`, `text` (for Apprise), `link` (the web UI's page,
    or null), `kind`, the `event` as recorded, and `details` of its kind."""
    event = s.get(Event, row.event_id)
    kind = NotificationKind(row.kind)
    base: dict[str, Any] = {"kind": kind.value, "owner": row.payload.get("owner")}
    if event is None:  # its experiment was deleted since (events go with it)
        return {**base, "title": f"muster: {kind.value}", "text": "(the event was deleted)",
                "link": None, "event": None, "details": {}}
    base["event"] = {"id": event.id, "at": event.at, "entity": event.entity,
                     "entity_id": event.entity_id, "experiment_id": event.experiment_id,
                     "trial_id": event.trial_id, "from_state": event.from_state,
                     "to_state": event.to_state, "reason": event.reason,
                     "actor": event.actor, "message": event.message}
    title, text, link, details = _DESCRIBERS[kind](s, event)
    return {**base, "title": title, "text": text[:MAX_TEXT],
            "link": f"{public_url}{link}" if link and public_url else link,
            "details": details}


Described = tuple[str, str, str | None, dict[str, Any]]


def _experiment_ended(s: Session, event: Event) -> Described:
    exp = s.get(Experiment, event.entity_id)
    name = exp.name if exp is not None else f"experiment {event.entity_id}"
    counts = {str(state): n for state, n in s.execute(
        select(Trial.state, func.count()).where(Trial.experiment_id == event.entity_id)
        .group_by(Trial.state))}
    details: dict[str, Any] = {"name": name, "state": event.to_state, "trials": counts,
                               "best": None}
    tally = ", ".join(f"{n} {state}" for state, n in sorted(counts.items())) or "no trials"
    text = f"Experiment {event.entity_id} ({name}) ended {event.to_state}: {tally}."
    searcher = experiment_searcher(exp) if exp is not None else None
    if searcher is not None and searcher.metric is not None:
        succeeded = list(s.scalars(select(Trial).where(
            Trial.experiment_id == event.entity_id, Trial.state == TrialState.SUCCEEDED)))
        best = best_validation(s, [t.id for t in succeeded], views.searcher_goals(searcher))
        winner = views.best_trial_of(succeeded, best, searcher)
        if winner is not None:
            value = best[winner.id].get(searcher.metric)
            details["best"] = {"trial_id": winner.id, "metric": searcher.metric,
                               "value": value}
            text += f" Best: trial {winner.id}, {searcher.metric} {value}."
    if event.message:
        text += f" {event.message}"
    return (f"muster: experiment {event.entity_id} {event.to_state}", text,
            f"/experiments/{event.entity_id}", details)


def _trial_verdict(kind: str) -> Any:
    def describe(s: Session, event: Event) -> Described:
        trial = s.get(Trial, event.entity_id)
        state = str(event.to_state)
        verdict = verdict_of(state, trial.verification if trial is not None else None,
                             reason=event.reason, message=event.message).line
        what = (f"Trial {event.entity_id} of experiment {event.experiment_id} "
                + (f"is {verdict}" if kind == "suspect" else verdict))
        if kind == "suspect":
            what += f". Review it: muster trial review {event.entity_id} --approve|--reject"
        cls = event.reason if kind == "failed" else None
        title = f"muster: trial {event.entity_id} {state}" + (
            f" ({cls})" if cls else ", awaiting review")
        return (title,
                what, f"/trials/{event.entity_id}", {"verdict": verdict, "class": cls})
    return describe


def _trial_stalled(s: Session, event: Event) -> Described:
    stacks = [r.stack_summary for r in s.scalars(
        select(Replica).where(Replica.attempt_id == event.entity_id).order_by(Replica.rank))
        if r.stack_summary]
    summary = "\n".join(str(x) for x in stacks)[:MAX_TEXT // 2]
    return (f"muster: trial {event.trial_id} STALLED",
            f"Trial {event.trial_id} of experiment {event.experiment_id} stalled and was "
            f"stopped: {event.message or ''}" + (f"\nStacks:\n{summary}" if summary else ""),
            f"/trials/{event.trial_id}", {"stack_summary": summary or None})


def _plain(title: str) -> Any:
    def describe(_s: Session, event: Event) -> Described:
        link = f"/trials/{event.trial_id}" if event.trial_id is not None else None
        return f"muster: {title}", event.message or title, link, {}
    return describe


def _model(title: str) -> Any:
    """A model's event: linked to its page, which is named by the model's name."""
    def describe(s: Session, event: Event) -> Described:
        model = s.get(RegisteredModel, event.entity_id)
        name = model.name if model is not None else None
        link = f"/models/{quote(name, safe='')}" if name is not None else None
        return (f"muster: {title}", event.message or title, link, {"model": name})
    return describe


_DESCRIBERS = {
    NotificationKind.EXPERIMENT_ENDED: _experiment_ended,
    NotificationKind.TRIAL_SUSPECT: _trial_verdict("suspect"),
    NotificationKind.TRIAL_FAILED: _trial_verdict("failed"),
    NotificationKind.TRIAL_STALLED: _trial_stalled,
    NotificationKind.DISK_GUARD: _plain("the disk guard engaged"),
    NotificationKind.NODE_QUARANTINED: _plain("a node was quarantined"),
    NotificationKind.MODEL_REGISTERED: _model("a model version was registered"),
    NotificationKind.MODEL_STAGED: _model("a model version's stage changed"),
}
