"""Quotas on a real server (issue 36, deliverable 2): three real users submit at once
through the SDK, their trials run as real processes, and a sampler reads what runs over and
over (the API's jobs, and the processes' own marker files) and finds no quota ever passed;
a create past `max_queued_trials` is a 429 that names the quota, over HTTP and in the CLI,
also under concurrent requests; `muster quota`, `muster group`, `cluster status` and
`job list` show and change them."""

from __future__ import annotations

import json
import threading
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from muster.client import Client
from muster.errors import QuotaExceeded
from muster.home import Home
from tests.cli.test_cli import assert_clean_failure, muster, on
from tests.servers import RunningServer, serving
from tests.waiting import wait_until

pytestmark = [pytest.mark.lifecycle, pytest.mark.timeout(300)]

CLUSTER_YAML = """\
gpus:
  - {index: 0, name: Fake-A100, memory: 40GiB, type: a100}
  - {index: 1, name: Fake-A100, memory: 40GiB, type: a100}
  - {index: 2, name: Fake-A100, memory: 40GiB, type: a100}
  - {index: 3, name: Fake-A100, memory: 40GiB, type: a100}
quotas:
  users:
    alice: {max_gpus: 2}
    bob: {max_running_trials: 2}
    dave: {max_queued_trials: 2, max_running_trials: 0}
    erin: {max_queued_trials: 3, max_running_trials: 0}
  groups:
    team: {max_slots: 3}
"""
# Runs for `seconds`, holding a marker file named for its owner while it does.
HOLD = """\
import os, sys, time
marker = os.path.join(sys.argv[1], f"{sys.argv[2]}.{os.getpid()}")
open(marker, "w").close()
time.sleep(float(sys.argv[3]))
os.unlink(marker)
"""
ACTIVE = {"STARTING", "RUNNING", "RESTARTING"}
USERS = ("alice", "bob", "carol", "dave", "erin")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    config = tmp_path_factory.mktemp("config") / "cluster.yaml"
    config.write_text(CLUSTER_YAML)
    with serving(tmp_path_factory.mktemp("server") / "home",
                 options=["--min-free-disk", "0", "--cluster-config", str(config)]) as running:
        yield running


@pytest.fixture(scope="module")
def tokens(server: RunningServer) -> dict[str, str]:
    """Each user's API token; bob and carol are the group `team`."""
    with server.client() as admin:
        made = {name: admin.create_user(name, "user")["token"] for name in USERS}
        admin.create_group("team", "bob and carol")
        admin.add_group_members("team", ["bob", "carol"])
    return made


def as_user(server: RunningServer, tokens: dict[str, str], name: str) -> Client:
    return Client(url=server.url, token=tokens[name], home=Home(server.home))


def hold_context(parent: Path, markers: Path, owner: str, seconds: float,
                 gpus: int = 0) -> Path:
    context = parent / f"{owner}-{len(list(parent.iterdir()))}"
    context.mkdir()
    (context / "hold.py").write_text(HOLD)
    config = {"name": f"{owner}-hold",
              "entrypoint": ["python", "hold.py", str(markers), owner, str(seconds)],
              "resources": {"gpus_per_replica": gpus}, "failure_policy": {"stop_grace": "2s"}}
    (context / "experiment.yaml").write_text(json.dumps(config))
    return context


@dataclass
class Sampler:
    """Reads what runs, again and again, until told to stop: each user's and the group's
    GPUs, slots and trials holding resources (the API's jobs), and each user's live trial
    processes (their marker files). Keeps the most of each it saw and the queue reasons."""

    client: Client
    markers: Path
    most: Counter[str] = field(default_factory=Counter)
    reasons: set[str] = field(default_factory=set)
    samples: int = 0
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        while not self.stop.is_set():
            self.sample()

    def sample(self) -> None:
        now: Counter[str] = Counter()
        for job in self.client.list_jobs():
            owner = job["owner"]
            if job["state"] in ACTIVE:
                gpus = job["replicas"] * job["gpus_per_replica"]
                slots = 0 if gpus else job["replicas"]
                now.update({f"{owner} gpus": gpus, f"{owner} slots": slots,
                            f"{owner} trials": 1})
                if owner in ("bob", "carol"):
                    now["team slots"] += slots
            elif job["queue_reason"]:
                self.reasons.add(job["queue_reason"])
        for marker in self.markers.iterdir():
            owner = marker.name.split(".")[0]
            now[f"{owner} processes"] += 1
            now["team processes"] += owner in ("bob", "carol")
        for key, value in now.items():
            self.most[key] = max(self.most[key], value)
        self.samples += 1


def test_three_users_submitting_at_once_never_hold_more_than_their_quotas(
        server: RunningServer, tokens: dict[str, str], tmp_path: Path) -> None:
    """alice may hold 2 GPUs (of 4 free), bob run 2 trials, and bob and carol together (the
    group team) 3 slots (of 4): each submits 6 trials at once, from a thread of their own."""
    markers = tmp_path / "markers"
    markers.mkdir()
    plans = {"alice": 1, "bob": 0, "carol": 0}  # GPUs per trial
    start = threading.Barrier(len(plans))

    def submit(owner: str) -> list[int]:
        (tmp_path / owner).mkdir()
        contexts = [hold_context(tmp_path / owner, markers, owner, 1.0, plans[owner])
                    for _ in range(6)]
        with as_user(server, tokens, owner) as c:
            start.wait()
            return [c.create_experiment((ctx / "experiment.yaml").read_text(), ctx)
                    ["trials"][0]["id"] for ctx in contexts]

    with server.client() as admin:
        sampler = Sampler(admin, markers)
        watching = threading.Thread(target=sampler.run, daemon=True)
        watching.start()
        try:
            with ThreadPoolExecutor(len(plans)) as pool:
                trial_ids = [i for ids in pool.map(submit, plans) for i in ids]
            wait_until(lambda: all(admin.get_trial(i)["state"] == "SUCCEEDED"
                                   for i in trial_ids),
                       timeout=180, what="18 trials to succeed", interval=0.5)
        finally:
            sampler.stop.set()
            watching.join(timeout=30)
    most = sampler.most
    assert sampler.samples > 20
    # Never past a quota, as the API shows it and as the processes show it ...
    assert most["alice gpus"] <= 2 and most["alice processes"] <= 2, most
    assert most["bob trials"] <= 2 and most["bob processes"] <= 2, most
    assert most["team slots"] <= 3 and most["team processes"] <= 3, most
    # ... and the quotas, not the capacity, are what held them: each was reached.
    assert most["alice gpus"] == 2 and most["team slots"] == 3, most
    assert any("alice's quota: 2 of 2 GPUs in use" in r for r in sampler.reasons), \
        sampler.reasons
    assert any("group team's quota: 3 of 3 slots in use" in r for r in sampler.reasons), \
        sampler.reasons


def test_a_create_past_max_queued_trials_is_a_429_that_names_the_quota(
        server: RunningServer, tokens: dict[str, str], tmp_path: Path) -> None:
    markers = tmp_path / "markers"
    markers.mkdir()
    (tmp_path / "dave").mkdir()
    with as_user(server, tokens, "dave") as dave:
        for _ in range(2):
            ctx = hold_context(tmp_path / "dave", markers, "dave", 0.1)
            made = dave.create_experiment((ctx / "experiment.yaml").read_text(), ctx)
        with pytest.raises(QuotaExceeded) as refused:
            dave.create_experiment((ctx / "experiment.yaml").read_text(), ctx)
        # The reason is the scheduler's, written on its next pass after the create.
        reason = wait_until(
            lambda: dave.get_trial(made["trials"][0]["id"])["queue_reason"],
            what="the queued trial's reason")
    assert str(refused.value).startswith(
        "dave's quota: 2 of 2 queued trials, and this submission queues 1 more; wait for "
        "some to start or end, kill some (muster job list), or ask an admin to raise it "
        "(muster quota set --user dave --max-queued-trials N)")
    assert reason is not None and reason.startswith("dave's quota allows 0 running trials")

    done = muster(server.home, server.url, "experiment", "create",
                  str(ctx / "experiment.yaml"), str(ctx), token=tokens["dave"])
    stderr = assert_clean_failure(done)
    assert stderr.startswith("error: dave's quota: 2 of 2 queued trials"), stderr


def test_concurrent_creates_over_http_queue_no_more_than_the_quota(
        server: RunningServer, tokens: dict[str, str], tmp_path: Path) -> None:
    """Six creates of erin's at once, through the server: three are made (her quota), three
    are 429s."""
    markers = tmp_path / "markers"
    markers.mkdir()
    (tmp_path / "erin").mkdir()
    contexts = [hold_context(tmp_path / "erin", markers, "erin", 0.1) for _ in range(6)]
    start = threading.Barrier(len(contexts))

    def create(ctx: Path) -> object:
        with as_user(server, tokens, "erin") as erin:
            start.wait()
            try:
                return erin.create_experiment((ctx / "experiment.yaml").read_text(), ctx)
            except QuotaExceeded as exc:
                return exc

    with ThreadPoolExecutor(len(contexts)) as pool:
        results = list(pool.map(create, contexts))
    assert sum(isinstance(r, dict) for r in results) == 3, results
    assert sum(isinstance(r, QuotaExceeded) for r in results) == 3, results
    with as_user(server, tokens, "erin") as erin:
        in_use = erin.user_quotas("erin")["quotas"][0]["in_use"]
    assert in_use is not None and in_use["queued_trials"] == 3


def test_quota_and_group_commands_and_where_quotas_show(
        server: RunningServer, tokens: dict[str, str]) -> None:
    done = on(server, "quota", "set", "--user", "carol", "--max-gpus", "1",
              "--max-queued-trials", "none")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == ("carol's quota: 0 of 1 GPU, no limit on queued trials")
    shown = json.loads(on(server, "quota", "show", "carol", "--json").stdout)
    assert shown["groups"] == ["team"]
    assert [(q["subject"], q["name"]) for q in shown["quotas"]] == [("user", "carol"),
                                                                   ("group", "team")]
    assert shown["quotas"][0]["limits"][0] == {"limit": "max_gpus", "value": 1,
                                               "source": "set by an admin"}
    listed = on(server, "quota", "list").stdout
    assert "group team's quota (bob, carol)" in listed and "alice's quota" in listed

    refused = muster(server.home, server.url, "quota", "set", "--user", "carol",
                     "--max-gpus", "9", token=tokens["carol"])
    assert "user carol cannot set quotas: it takes the admin role" in \
        assert_clean_failure(refused)
    bad = on(server, "quota", "set", "--user", "carol", "--max-gpus", "-3")
    assert "--max-gpus must be a count (0 allows none), or `none` for no limit, got '-3'" in \
        assert_clean_failure(bad)
    both = on(server, "quota", "set", "--user", "carol", "--default", "--max-gpus", "1")
    assert "name exactly one of --user NAME, --group NAME or --default" in \
        assert_clean_failure(both)

    status = on(server, "cluster", "status")
    assert "carol's quota" in status.stdout and "0 of 1 GPU" in status.stdout, status.stdout
    assert "group team's quota (bob, carol): 0 of 3 slots" in on(server, "job", "list").stdout
    cleared = on(server, "quota", "clear", "--user", "carol")
    assert cleared.returncode == 0, cleared.stderr
    assert json.loads(on(server, "quota", "list", "--json").stdout) == \
        on_json(server, "cluster", "status")["quotas"]
    assert all(q["name"] != "carol" for q in on_json(server, "quota", "list"))

    groups = on(server, "group", "list").stdout
    assert "team" in groups and "bob, carol" in groups
    assert on(server, "group", "add-user", "team", "nobody").stderr.startswith(
        "error: no user 'nobody'")


def on_json(server: RunningServer, *args: str) -> Any:
    done = on(server, *args, "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_bad_quota_and_group_requests_are_4xx_that_say_what_is_wrong(
        server: RunningServer, tokens: dict[str, str]) -> None:
    admin = {"Authorization": f"Bearer {server.token}"}
    base = f"{server.url}/api/v1"

    def answer(method: str, path: str, headers: dict[str, str] = admin,
               **sent: Any) -> tuple[int, str]:
        got = httpx.request(method, base + path, headers=headers, timeout=30, **sent)
        return got.status_code, got.json()["message"]

    assert answer("PATCH", "/quotas/users/alice", json={"max_gpus": -1})[0] == 422
    code, message = answer("PATCH", "/quotas/users/alice", json={"max_gpu": 1})
    assert code == 422 and "max_gpu" in message
    assert answer("PATCH", "/quotas/users/alice", json={"max_gpus": 10**9})[0] == 422
    assert answer("PATCH", "/quotas/users/alice", json={}) == (
        400, "name a limit to set: max_slots, max_gpus, max_running_trials or "
             "max_queued_trials (null: no limit)")
    assert answer("PATCH", "/quotas/users/nobody", json={"max_gpus": 1}) == (
        404, "no user 'nobody'; `muster user list` shows them")
    assert answer("DELETE", "/quotas/groups/team", params={"limit": "bogus"})[0] == 422
    code, message = answer("PATCH", "/quotas/default", json={"max_gpus": 1},
                           headers={"Authorization": f"Bearer {tokens['alice']}"})
    assert code == 403 and "cannot set quotas: it takes the admin role" in message
    code, message = answer("POST", "/groups", json={"name": "Bad Name"})
    assert code == 422 and "name" in message
    assert answer("POST", "/groups", json={"name": "team"}) == (
        409, "group 'team' exists already (muster group describe team)")
    assert answer("POST", "/groups/team/members", json={"users": []})[0] == 422
    assert answer("POST", "/groups/team/members", json={"users": ["x"] * 1001})[0] == 422
