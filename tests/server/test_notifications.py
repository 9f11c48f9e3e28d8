"""Notifications from a real server to a real HTTP receiver (`tests.receivers`) on a loopback
port: muster's signed webhook for each event kind a run makes (an experiment's end with its
counts and best, a SUSPECT trial, a FAILED one, a STALLED one with its stacks, a model
version registered and staged, the disk guard), Apprise's `json://` to the same receiver,
retries with backoff after 500s under one idempotency key, references (`env:`, `file:`) in
the cluster config, users' own subscriptions held to their own work and to the URLs they may
name, and exactly one delivery acted on per event after the server is SIGKILLed while the
receiver holds a delivery."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select
from typer.testing import CliRunner

from muster import webhooks
from muster.cli import app
from muster.client import Client
from muster.errors import InvalidRequest
from muster.store import NotificationDelivery, NotificationOutbox
from tests.receivers import Received, Receiver
from tests.server.experiments import only_trial, wait_ended, wait_trial
from tests.servers import RunningServer, serving
from tests.waiting import wait_until

pytestmark = [pytest.mark.lifecycle, pytest.mark.timeout(300)]

HOOK_KEY = "hook-signing-key-0123456789"
FLAKY_KEY = "flaky-signing-key-from-a-file"
ENDED = {"SUCCEEDED", "SUSPECT", "FAILED", "CANCELED"}

TRAIN = """\
import sys

import muster.harness as mh

with mh.init() as ctx:
    length = ctx.max_length or 3
    stop = int(sys.argv[1]) if len(sys.argv) > 1 else length
    for step in range(1, stop + 1):
        ctx.report_training(step, {"loss": 1.0 / step})
        ctx.report_validation(step, {"val_loss": 2.0 / step})
    with ctx.checkpoint.save(stop) as path:
        (path / "w.txt").write_text(f"step {stop}")
"""
FAIL = "import sys\nprint('about to fail', flush=True)\nsys.exit(3)\n"
STALL = "import time\nprint('started', flush=True)\ntime.sleep(600)\n"


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    with Receiver() as running:
        yield running


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, receiver: Receiver
           ) -> Iterator[RunningServer]:
    """A server that tells every event to /hook (signed), experiments' ends to /apprise
    (Apprise's json://), and registrations to the URL in $MUSTER_TEST_FLAKY_URL (signed
    with the key in a file)."""
    top = tmp_path_factory.mktemp("notify")
    key_file = top / "flaky.key"
    key_file.write_text(FLAKY_KEY + "\n")
    host = receiver.url.removeprefix("http://")
    config = top / "cluster.yaml"
    config.write_text(json.dumps({
        "notifications": [
            {"url": f"{receiver.url}/hook", "secret": "env:MUSTER_TEST_HOOK_KEY"},
            {"url": f"json://{host}/apprise", "events": ["experiment-ended"]},
            {"url": "env:MUSTER_TEST_FLAKY_URL", "secret": f"file:{key_file}",
             "events": ["model-registered"]},
        ],
        "notification_hosts": ["127.0.0.1"],
        "public_url": "https://muster.test",
    }))
    env = {"MUSTER_TEST_HOOK_KEY": HOOK_KEY, "MUSTER_TEST_FLAKY_URL": f"{receiver.url}/flaky"}
    with serving(top / "home", options=["--min-free-disk", "0", "--cluster-config",
                                        str(config)], env=env) as running:
        yield running


@pytest.fixture(scope="module")
def client(server: RunningServer) -> Iterator[Client]:
    with server.client() as made:
        yield made


def _submit(client: Client, parent: Path, script: str, entrypoint: list[str],
            **config: Any) -> dict[str, Any]:
    context = parent / f"context-{len(list(parent.iterdir()))}"
    context.mkdir()
    (context / entrypoint[1]).write_text(script)
    body = {"name": "notify", "entrypoint": entrypoint,
            "failure_policy": {"stop_grace": "2s", "replica_restarts": 0, "trial_retries": 0},
            **config}
    return client.create_experiment(json.dumps(body), context)


def _harness(client: Client, parent: Path, *args: str) -> dict[str, Any]:
    return _submit(client, parent, TRAIN, ["python", "train.py", *args], harness=True,
                   searcher={"name": "single", "metric": "val_loss", "max_length": 3})


def _told(receiver: Receiver, path: str, kind: str, **event: Any) -> Received:
    """The one notification of `kind` at `path` whose event has these fields."""
    def found() -> list[Received]:
        return [r for r in receiver.at(path) if r.status == 200
                and r.json().get("kind") == kind
                and all(r.json()["event"].get(k) == v for k, v in event.items())]
    [one] = wait_until(found, timeout=90, what=f"a {kind} notification at {path} ({event})")
    return one


def _signed(received: Received, key: str) -> dict[str, Any]:
    header = received.headers["muster-signature"]
    assert webhooks.verify(key.encode(), header, received.body), header
    assert not webhooks.verify(b"another key", header, received.body)
    payload: dict[str, Any] = received.json()
    assert received.key == f"muster-{payload['event']['id']}-" + received.key.split("-", 2)[2]
    return payload


def test_an_ended_experiment_is_told_with_its_counts_best_and_link(
        client: Client, receiver: Receiver, tmp_path: Path) -> None:
    exp = _harness(client, tmp_path)
    ended = wait_ended(client, exp["id"], timeout=90)
    trial = only_trial(ended)
    assert (ended["state"], trial["state"], trial["verified"]) == (
        "COMPLETED", "SUCCEEDED", True)

    told = _signed(_told(receiver, "/hook", "experiment-ended", entity_id=exp["id"]), HOOK_KEY)
    assert told["title"] == f"muster: experiment {exp['id']} COMPLETED"
    assert told["link"] == f"https://muster.test/experiments/{exp['id']}"
    assert told["details"]["trials"] == {"SUCCEEDED": 1}
    assert told["details"]["best"] == {"trial_id": trial["id"], "metric": "val_loss",
                                       "value": pytest.approx(2.0 / 3)}
    assert told["owner"] == "admin" and told["event"]["to_state"] == "COMPLETED"

    [apprise] = wait_until(lambda: [r for r in receiver.at("/apprise")
                                    if f"experiment {exp['id']} " in r.json()["title"]],
                           timeout=60, what="the Apprise json:// notification")
    body = apprise.json()
    assert body["title"] == told["title"] and "1 SUCCEEDED" in body["message"]
    assert apprise.key is not None and apprise.key.startswith(f"muster-{told['event']['id']}-")


def test_suspect_and_failed_trials_are_told_with_why(
        client: Client, receiver: Receiver, tmp_path: Path) -> None:
    short = only_trial(_harness(client, tmp_path, "1"))
    failing = only_trial(_submit(client, tmp_path, FAIL, ["python", "fail.py"]))
    assert wait_trial(client, short["id"], ENDED, timeout=90)["state"] == "SUSPECT"
    failed = wait_trial(client, failing["id"], ENDED, timeout=90)
    assert failed["state"] == "FAILED"

    suspect = _signed(_told(receiver, "/hook", "trial-suspect", entity_id=short["id"]),
                      HOOK_KEY)
    assert "completed" in suspect["text"] and "awaiting review" in suspect["title"]
    assert f"muster trial review {short['id']}" in suspect["text"]
    assert suspect["link"] == f"https://muster.test/trials/{short['id']}"

    told = _signed(_told(receiver, "/hook", "trial-failed", entity_id=failing["id"]), HOOK_KEY)
    assert told["details"]["class"] == client.get_trial(failing["id"])["reason"]
    assert told["text"].startswith(f"Trial {failing['id']} of experiment ")
    assert "failed: " in told["text"] and "non-zero status of 3" in told["text"], told["text"]


def test_a_stalled_trial_is_told_with_its_stacks(
        client: Client, receiver: Receiver, tmp_path: Path) -> None:
    trial = only_trial(_submit(client, tmp_path, STALL, ["python", "stall.py"],
                               failure_policy={"stop_grace": "2s", "replica_restarts": 0,
                                               "trial_retries": 0, "silence_timeout": "2s"}))
    assert wait_trial(client, trial["id"], ENDED, timeout=120)["state"] == "FAILED"
    told = _signed(_told(receiver, "/hook", "trial-stalled", trial_id=trial["id"]), HOOK_KEY)
    assert told["title"] == f"muster: trial {trial['id']} STALLED"
    assert "stall.py" in (told["details"]["stack_summary"] or ""), told["details"]


def test_registration_is_retried_after_500s_under_one_key(
        client: Client, receiver: Receiver, tmp_path: Path) -> None:
    receiver.answer("/flaky", 500, 500)
    exp = _harness(client, tmp_path)
    trial = only_trial(wait_ended(client, exp["id"], timeout=90))
    client.create_model("notified")
    client.register_model_version("notified", trial["id"])
    client.set_model_stage("notified@1", "staging")

    tries = wait_until(lambda: r if len(r := receiver.at("/flaky")) >= 3 else [],
                       timeout=90, what="three tries at /flaky")
    assert [r.status for r in tries] == [500, 500, 200]
    assert len({r.key for r in tries}) == 1  # one notification, one key
    assert [_signed(r, FLAKY_KEY)["kind"] for r in tries] == ["model-registered"] * 3
    assert len({r.body for r in tries}) == 1  # rendered once: every try sends the same body
    staged = _signed(_told(receiver, "/hook", "model-staged"), HOOK_KEY)
    assert staged["event"]["entity"] == "model" and "staging" in staged["text"]
    assert staged["link"] == "https://muster.test/models/notified"
    assert staged["details"] == {"model": "notified"}

    log = client.notification_log(limit=100)
    [row] = [n for n in log if n["kind"] == "model-registered"
             and n["url"] == "env:MUSTER_TEST_FLAKY_URL"]  # the reference, never its value
    assert (row["state"], row["tries"], row["last_error"]) == ("delivered", 3, None)
    assert len(client.notification_log(limit=1)) == 1


def test_users_are_told_of_their_own_work_at_urls_they_may_name(
        server: RunningServer, client: Client, receiver: Receiver, tmp_path: Path) -> None:
    alice_token = client.create_user("alice", "user")["token"]
    alice = Client(url=server.url, token=alice_token)
    bob = Client(url=server.url, token=client.create_user("bob", "user")["token"])
    with pytest.raises(InvalidRequest, match="only an admin may use them"):
        alice.add_notification("env:MUSTER_TEST_HOOK_KEY")
    with pytest.raises(InvalidRequest, match="json:// is not one a user may add"):
        alice.add_notification(f"json://{receiver.url.removeprefix('http://')}/x")
    with pytest.raises(InvalidRequest, match=r"10\.1\.2\.3 is not a public address"):
        alice.add_notification("https://10.1.2.3/hook")
    made = alice.add_notification(f"{receiver.url}/alice", ["trial-failed"])
    assert made["signed"] and made["secret"] is not None and len(made["secret"]) == 64
    assert made["url"] == f"{receiver.url}/…" and made["events"] == ["trial-failed"]

    hers = only_trial(_submit(alice, tmp_path, FAIL, ["python", "fail.py"]))
    his = only_trial(_submit(bob, tmp_path, FAIL, ["python", "fail.py"]))
    for trial in (hers, his):
        wait_trial(client, trial["id"], ENDED, timeout=90)
    told = _signed(_told(receiver, "/alice", "trial-failed", entity_id=hers["id"]),
                   made["secret"])
    assert told["owner"] == "alice"
    _told(receiver, "/hook", "trial-failed", entity_id=his["id"])  # the config's saw bob's
    assert all(r.json()["event"]["entity_id"] != his["id"] for r in receiver.at("/alice"))
    assert [n["target"] for n in alice.notification_log()] == [f"user:{made['id']}"]
    assert bob.notification_log() == [] and bob.list_notifications() == []

    listed = CliRunner().invoke(app, ["notify", "list", "--json", "--url", server.url],
                                env={"MUSTER_TOKEN": alice_token})
    assert listed.exit_code == 0, listed.output
    assert [row["id"] for row in json.loads(listed.stdout)] == [made["id"]]
    with pytest.raises(Exception, match="not one of yours"):
        bob.remove_notification(made["id"])
    assert alice.remove_notification(made["id"])["id"] == made["id"]
    assert alice.list_notifications() == []
    alice.close()
    bob.close()


def test_a_delivery_cut_by_a_server_sigkill_is_made_again_and_acted_on_once(
        tmp_path: Path) -> None:
    with Receiver() as receiver:
        release = receiver.hold("/held")
        config = tmp_path / "cluster.yaml"
        config.write_text(json.dumps({"notifications": [
            {"url": f"{receiver.url}/held", "secret": "env:MUSTER_TEST_HOOK_KEY",
             "events": ["disk-guard"]}]}))
        options = ["--cluster-config", str(config)]
        with serving(tmp_path / "home", options=["--min-free-disk", "1000TiB", *options],
                     env={"MUSTER_TEST_HOOK_KEY": HOOK_KEY}) as running:
            with running.client() as c:
                exp = _submit(c, tmp_path, FAIL, ["python", "fail.py"])
            assert receiver.held("/held").wait(60), "no delivery of the disk guard came"
            running.kill()  # mid-delivery: the receiver never answered
            release.set()
            running.start_with(["--min-free-disk", "0", *options])
            again = wait_until(lambda: [r for r in receiver.at("/held") if r.status == 200],
                               timeout=90, what="the delivery made again")
            with running.client() as c:
                wait_ended(c, exp["id"], timeout=90)
            with running.store() as store, store.session_scope() as s:
                [row] = s.scalars(select(NotificationOutbox)).all()
                tries = s.scalars(select(NotificationDelivery)).all()
                assert (row.state, row.tries) == ("delivered", 2)
                assert [t.ok for t in tries] == [True]  # the cut try left no outcome
        first, second = receiver.at("/held")[0], again[0]
        assert first.status == 0 and first.key == second.key
        assert first.body == second.body  # the same notification, rendered once
        assert list(receiver.acted) == [second.key]  # acted on once
        told = _signed(second, HOOK_KEY)
        assert told["kind"] == "disk-guard" and "disk guard engaged" in told["text"]


def test_a_bad_notification_url_in_the_cluster_config_stops_the_server_with_why(
        tmp_path: Path) -> None:
    config = tmp_path / "cluster.yaml"
    config.write_text(json.dumps({"notifications": [{"url": "https://hooks.example/x"}]}))
    said = CliRunner().invoke(app, ["up", "--home", str(tmp_path / "home"),
                                    "--cluster-config", str(config)])
    assert said.exit_code != 0
    assert "add `secret: env:NAME`" in said.output + str(said.exception)
