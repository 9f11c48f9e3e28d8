"""Routing notifications into the outbox with their events (`muster.notifications.Router`, on
the real store of each backend), the URLs a user may name, and the notifier's delivery to a
real receiver (`tests.receivers`): a row per target in the event's own transaction and none
for one rolled back, owners' and admins' subscriptions, the disk guard told once, a node's
quarantine delivered signed, a row a killed server was sending sent again, a removed target
failed for good, and a target that keeps failing given up after `MAX_TRIES`."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import select, update

from muster import webhooks
from muster.config import load_config
from muster.config.cluster import ClusterConfig, NotificationConfig
from muster.notifications import (
    Router,
    TargetError,
    check_user_url,
    config_key,
    kind_of,
    redact,
)
from muster.notifier import MAX_TRIES, Notifier
from muster.states import NotificationKind, OutboxState, Role
from muster.store import (
    Event,
    Experiment,
    NotificationDelivery,
    NotificationOutbox,
    NotificationSubscription,
    Store,
    Trial,
    User,
    record_event,
    transition,
)
from tests.receivers import Receiver
from tests.waiting import wait_until

KEY = "unit-key"


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with Receiver() as running:
        yield running


def _entry(url: str, **fields: Any) -> NotificationConfig:
    return NotificationConfig.model_validate({"url": url, **fields})


def _world(store: Store) -> dict[str, int]:
    """alice's running trial in her experiment, bob, and an admin; their ids."""
    text = json.dumps({"name": "exp", "entrypoint": ["true"]})
    config = load_config(text, source="the test").to_json_dict()
    with store.session_scope() as s:
        users = {name: User(name=name, role=role) for name, role in
                 (("alice", Role.USER), ("bob", Role.USER), ("root2", Role.ADMIN))}
        s.add_all(users.values())
        s.flush()
        exp = Experiment(name="exp", config=config, config_yaml=text, context_dir="/tmp/c",
                         state="ACTIVE", owner_id=users["alice"].id)
        trial = Trial(experiment=exp, state="RUNNING", number=0)
        s.add_all([exp, trial])
        s.flush()
        return {"experiment": exp.id, "trial": trial.id,
                **{name: user.id for name, user in users.items()}}


def _subscribe(store: Store, user_id: int, url: str, *kinds: NotificationKind) -> int:
    with store.session_scope() as s:
        row = NotificationSubscription(user_id=user_id, url=url,
                                       events=[k.value for k in kinds], secret=KEY)
        s.add(row)
        s.flush()
        return row.id


def _outbox(store: Store) -> list[tuple[str, str]]:
    with store.session_scope() as s:
        return [(r.kind, r.target) for r in s.scalars(
            select(NotificationOutbox).order_by(NotificationOutbox.id))]


def _fail_trial(store: Store, trial_id: int) -> None:
    with store.session_scope() as s:
        transition(s, s.get_one(Trial, trial_id), "FAILED", reason="USER_ERROR",
                   actor="system:supervisor", message="exit code 3")


def test_each_kind_of_event_is_recognised_and_the_rest_are_not() -> None:
    def event(**fields: Any) -> Event:
        return Event(**{"entity": "trial", "entity_id": 1, "reason": "x", "actor": "a",
                        **fields})

    assert kind_of(event(entity="experiment", to_state="ERROR")) is \
        NotificationKind.EXPERIMENT_ENDED
    assert kind_of(event(entity="experiment", to_state="PAUSED")) is None
    assert kind_of(event(to_state="SUSPECT")) is NotificationKind.TRIAL_SUSPECT
    assert kind_of(event(to_state="FAILED", reason="USER_ERROR")) is \
        NotificationKind.TRIAL_FAILED
    assert kind_of(event(to_state="FAILED", reason="review rejected")) is None  # a person's
    assert kind_of(event(entity="attempt", to_state="FAILED", reason="STALLED")) is \
        NotificationKind.TRIAL_STALLED
    assert kind_of(event(entity="attempt", reason="STALLED")) is None  # the stop, not the end
    assert kind_of(event(entity="cluster", reason="disk low")) is NotificationKind.DISK_GUARD
    assert kind_of(event(reason="disk low")) is None  # each running trial's own warning
    assert kind_of(event(reason="node quarantined")) is NotificationKind.NODE_QUARANTINED
    assert kind_of(event(entity="model", reason="model registered")) is \
        NotificationKind.MODEL_REGISTERED
    assert kind_of(event(entity="model", reason="model staged")) is \
        NotificationKind.MODEL_STAGED
    assert kind_of(event(to_state="RUNNING", reason="started")) is None


@pytest.mark.parametrize(("url", "admin", "error"), [
    ("env:SLACK_URL", False, "only an admin may use them"),
    ("file:/etc/passwd", False, "only an admin may use them"),
    ("json://example.com/x", False, "json:// is not one a user may add"),
    ("mailto://a:b@example.com", False, "mailto:// is not one a user may add"),
    ("http://127.0.0.1:9/x", False, "127.0.0.1 is not a public address"),
    ("https://169.254.169.254/latest", False, "169.254.169.254 is not a public address"),
    ("https://[::1]/x", False, "::1 is not a public address"),
    ("https://localhost/x", False, "localhost (127.0.0.1"),
    ("no-scheme", False, "has no scheme"),
    ("https://a b/x", False, "without spaces"),
    ("https://" + "a" * 2100, True, "1 to 2048 characters"),
])
def test_a_user_may_not_make_the_server_post_to_its_own_network(
        url: str, admin: bool, error: str) -> None:
    with pytest.raises(TargetError, match=error.replace("(", r"\(").replace(".", r"\.")):
        check_user_url(url, admin=admin, allowed_hosts=())


def test_what_a_user_and_an_admin_may_name() -> None:
    check_user_url("slack://T1/B2/C3", admin=False, allowed_hosts=())  # no host: Slack's own
    check_user_url("https://93.184.215.14/hook", admin=False, allowed_hosts=())
    check_user_url("http://127.0.0.1:9/x", admin=False, allowed_hosts=["127.0.0.1"])
    check_user_url("http://chat.lab:9/x", admin=False, allowed_hosts=["CHAT.lab"],
                   lookup=False)
    check_user_url("env:SLACK_URL", admin=True, allowed_hosts=())
    check_user_url("json://127.0.0.1/x", admin=True, allowed_hosts=())


def test_redacted_urls_show_scheme_and_host_never_paths_or_tokens() -> None:
    assert redact("https://hooks.example.com:8443/services/T0/B0/secret") == \
        "https://hooks.example.com:8443/…"
    assert redact("slack://TokenA/TokenB/TokenC/#general") == "slack://…"
    assert redact("mailtos://user:password@smtp.example.com") == "mailtos://smtp.example.com/…"
    assert redact("env:SLACK_URL") == "env:SLACK_URL"


def test_the_cluster_config_names_kinds_and_signs_webhooks() -> None:
    config = ClusterConfig.model_validate({"notifications": [
        {"url": "env:SLACK", "events": ["trial-failed"], "owners": ["alice"]},
        {"url": "https://hooks.example/x", "secret": "env:KEY"}]})
    first, second = config.notifications
    assert first.events == [NotificationKind.TRIAL_FAILED]
    assert second.events == list(NotificationKind)
    assert config_key(first) != config_key(second)
    assert config_key(first) == config_key(_entry("env:SLACK", events=["trial-failed"],
                                                  owners=["alice"]))  # stable
    with pytest.raises(ValueError, match="add `secret: env:NAME`"):
        _entry("https://hooks.example/x")
    with pytest.raises(ValueError, match="remove `secret`"):
        _entry("slack://a/b/c", secret="env:KEY")
    with pytest.raises(ValueError, match="not an event to notify"):
        _entry("slack://a/b/c", events=["trial-exploded"])
    with pytest.raises(ValueError, match="must be a URL"):
        _entry("hooks.example/x")


def test_outbox_rows_are_written_with_the_event_and_not_for_a_rolled_back_one(
        store: Store) -> None:
    ids = _world(store)
    everyone = _entry("slack://a/b/c")
    only_bob = _entry("slack://d/e/f", owners=["bob"])
    Router([everyone, only_bob]).install(store)
    alice_sub = _subscribe(store, ids["alice"], "https://example.com/a",
                           NotificationKind.TRIAL_FAILED)
    _subscribe(store, ids["bob"], "https://example.com/b", NotificationKind.TRIAL_FAILED)
    _subscribe(store, ids["alice"], "https://example.com/c", NotificationKind.MODEL_STAGED)

    with pytest.raises(RuntimeError), store.session_scope() as s:
        transition(s, s.get_one(Trial, ids["trial"]), "FAILED", reason="USER_ERROR",
                   actor="system:supervisor", message="exit code 3")
        s.flush()
        raise RuntimeError("the pass failed after the move")
    assert _outbox(store) == []  # rolled back with its event

    _fail_trial(store, ids["trial"])
    assert _outbox(store) == [("trial-failed", config_key(everyone)),
                              ("trial-failed", f"user:{alice_sub}")]


def test_cluster_wide_kinds_go_to_admins_and_the_disk_guard_is_told_once(
        store: Store) -> None:
    ids = _world(store)
    Router().install(store)
    admin_sub = _subscribe(store, ids["root2"], "https://example.com/r",
                           NotificationKind.DISK_GUARD, NotificationKind.NODE_QUARANTINED)
    _subscribe(store, ids["alice"], "https://example.com/a", *NotificationKind)
    with store.session_scope() as s:
        for _ in range(2):
            record_event(s, entity="cluster", entity_id=0, reason="disk low",
                         actor="system:supervisor", message="the disk guard engaged: ...")
        record_event(s, entity="trial", entity_id=ids["trial"], reason="node quarantined",
                     actor="system:supervisor", message="node n1 quarantined",
                     experiment_id=ids["experiment"], trial_id=ids["trial"])
    assert _outbox(store) == [("disk-guard", f"user:{admin_sub}"),
                              ("node-quarantined", f"user:{admin_sub}")]


def test_the_notifier_delivers_signed_and_a_killed_servers_try_is_made_again(
        store: Store, receiver: Receiver, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MUSTER_UNIT_KEY", KEY)
    ids = _world(store)
    entry = _entry(f"{receiver.url}/q", secret="env:MUSTER_UNIT_KEY",
                   events=["node-quarantined"])
    Router([entry]).install(store)
    with store.session_scope() as s:
        record_event(s, entity="trial", entity_id=ids["trial"], reason="node quarantined",
                     actor="system:supervisor", message="node n1 quarantined: 3 in a row",
                     experiment_id=ids["experiment"], trial_id=ids["trial"])
        s.execute(update(NotificationOutbox).values(state=OutboxState.SENDING.value,
                                                    tries=1))  # as a killed server left it
    notifier = Notifier(store, [entry], link_base=lambda: "https://m.example")
    assert notifier.deliver_due() == 0  # not due: another server was sending it
    notifier.start()  # first, what a killed server was sending is due again
    try:
        [got] = wait_until(lambda: receiver.at("/q"), timeout=30, what="the delivery")
    finally:
        notifier.stop()
    assert webhooks.verify(KEY.encode(), got.headers["muster-signature"], got.body)
    told = got.json()
    assert told["kind"] == "node-quarantined" and told["text"].startswith("node n1")
    assert told["link"] == f"https://m.example/trials/{ids['trial']}"
    with store.session_scope() as s:
        row = s.scalars(select(NotificationOutbox)).one()
        assert (row.state, row.tries) == ("delivered", 2)
        assert got.key == f"muster-{row.event_id}-{config_key(entry)}"


def test_a_removed_target_fails_for_good_and_a_failing_one_is_given_up(
        store: Store, receiver: Receiver, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MUSTER_UNIT_KEY", KEY)
    ids = _world(store)
    entry = _entry(f"{receiver.url}/down", secret="env:MUSTER_UNIT_KEY",
                   events=["trial-failed"])
    Router([entry]).install(store)
    gone = _subscribe(store, ids["alice"], f"{receiver.url}/alice",
                      NotificationKind.TRIAL_FAILED)
    _fail_trial(store, ids["trial"])
    with store.session_scope() as s:
        s.delete(s.get_one(NotificationSubscription, gone))
    receiver.answer("/down", *[503] * MAX_TRIES)
    notifier = Notifier(store, [entry])
    for _ in range(MAX_TRIES):
        with store.session_scope() as s:  # every backoff over at once
            s.execute(update(NotificationOutbox).values(next_at=0.0))
        notifier.deliver_due()
    with store.session_scope() as s:
        rows = {r.target: r for r in s.scalars(select(NotificationOutbox))}
        logged = s.scalars(select(NotificationDelivery)).all()
        assert rows[f"user:{gone}"].state == "failed"
        assert rows[f"user:{gone}"].tries == 1
        assert "subscription was removed" in (rows[f"user:{gone}"].last_error or "")
        down = rows[config_key(entry)]
        assert (down.state, down.tries) == ("failed", MAX_TRIES)
        assert "503" in (down.last_error or "")
        assert len(logged) == MAX_TRIES + 1
    assert len(receiver.at("/down")) == MAX_TRIES
    assert receiver.at("/alice") == []


def test_an_apprise_url_is_parsed_before_it_is_kept() -> None:
    with pytest.raises(TargetError, match="not a URL Apprise can send to"):
        check_user_url("slack://only-one-token", admin=False, allowed_hosts=())
    with pytest.raises(TargetError, match="not a URL Apprise can send to"):
        check_user_url("nosuchservice://x", admin=True, allowed_hosts=())
