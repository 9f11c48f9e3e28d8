"""Who may do what, against a real server with real users: an admin, two users (alice and
bob) and a viewer (vera). The table below is the authorisation table of
`muster.services.access`, route by route; every request is a real HTTP request with the
caller's own token. On SQLite and on PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from muster.client import Client
from muster.errors import Forbidden
from muster.home import Home
from tests.conftest import BACKENDS, _fresh_pg_database
from tests.processes import kill_home_processes
from tests.server.experiments import (
    create,
    make_context,
    only_trial,
    submit,
    wait_ended,
    wait_trial,
)
from tests.servers import RunningServer
from tests.waiting import wait_until

pytestmark = pytest.mark.lifecycle  # a real server and real trials

API = "/api/v1"
EVERYONE = frozenset({"admin", "alice", "bob", "vera"})
SUBMITTERS = frozenset({"admin", "alice", "bob"})
OWNER_OR_ADMIN = frozenset({"admin", "alice"})  # alice owns what the table acts on
ADMIN = frozenset({"admin"})


@dataclass
class Team:
    server: RunningServer
    tokens: dict[str, str] = field(default_factory=dict)
    ids: dict[str, int] = field(default_factory=dict)

    def client(self, who: str) -> Client:
        return Client(url=self.server.url, token=self.tokens[who], home=Home(self.server.home))

    def call(self, who: str, method: str, path: str, **kw: Any) -> httpx.Response:
        headers = {"Authorization": f"Bearer {self.tokens[who]}"} if who else {}
        return httpx.request(method, self.server.url + API + path.format(**self.ids),
                             headers=headers, timeout=30, **kw)


@pytest.fixture(scope="module", params=BACKENDS)
def team(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
         ) -> Iterator[Team]:
    """A server with admin, alice and bob (users) and vera (a viewer); alice owns a running
    experiment (`running`, its trial `trial`) and a SUSPECT trial (`suspect`)."""
    home = tmp_path_factory.mktemp("team") / "home"
    home.mkdir()
    with _database(request, home) as db_url:
        server = RunningServer(home=home, db_url=db_url)
        server.start()
        try:
            yield _make_team(server, tmp_path_factory.mktemp("contexts"))
        finally:
            server.stop()
            kill_home_processes(home)


def _database(request: pytest.FixtureRequest, home: Path) -> AbstractContextManager[str]:
    if request.param == "sqlite":
        return nullcontext(f"sqlite:///{home / 'muster.db'}")
    return _fresh_pg_database(request.getfixturevalue("_postgres_server"))


def _make_team(server: RunningServer, parent: Path) -> Team:
    team = Team(server, {"admin": server.token})
    with team.client("admin") as admin:
        for name, role in (("alice", "user"), ("bob", "user"), ("vera", "viewer")):
            team.tokens[name] = admin.create_user(name, role)["token"]
    release = parent / "release"
    with team.client("alice") as alice:
        running = create(alice, parent, "wait_for_file.py", str(release))
        suspect = create(alice, parent, "report_metrics.py", "3")
        team.ids.update(running=running["id"], trial=only_trial(running)["id"],
                        suspect=only_trial(suspect)["id"])
        wait_trial(alice, team.ids["trial"], {"RUNNING"})
        wait_trial(alice, team.ids["suspect"], {"SUSPECT"})
    return team


# (what, method, path, body, who may) in the order they run: each row is sent by vera and
# bob first, then alice, then admin; a row that acts leaves its mark for the next.
TABLE: list[tuple[str, str, str, dict[str, Any] | None, frozenset[str]]] = [
    ("list experiments", "GET", "/experiments", None, EVERYONE),
    ("describe", "GET", "/experiments/{running}", None, EVERYONE),
    ("trials", "GET", "/experiments/{running}/trials", None, EVERYONE),
    ("trials csv", "GET", "/experiments/{running}/trials.csv", None, EVERYONE),
    ("trial", "GET", "/trials/{trial}", None, EVERYONE),
    ("logs", "GET", "/trials/{trial}/logs", None, EVERYONE),
    ("log search", "GET", "/trials/{trial}/logs/search?pattern=x", None, EVERYONE),
    ("metrics", "GET", "/trials/{suspect}/metrics", None, EVERYONE),
    ("checkpoints", "GET", "/trials/{suspect}/checkpoints", None, EVERYONE),
    ("jobs", "GET", "/jobs", None, EVERYONE),
    ("cluster", "GET", "/cluster", None, EVERYONE),
    ("environments", "GET", "/environments", None, EVERYONE),
    ("prometheus", "GET", "/metrics", None, EVERYONE),
    ("events", "GET", "/events?experiment_id={running}", None, EVERYONE),
    ("users", "GET", "/users", None, EVERYONE),
    ("whoami", "GET", "/whoami", None, EVERYONE),
    ("own tokens", "GET", "/tokens", None, EVERYONE),
    ("make a token", "POST", "/tokens", {"name": "table"}, EVERYONE),
    ("alice's tokens", "GET", "/tokens?user=alice", None, OWNER_OR_ADMIN),
    ("trial priority", "POST", "/trials/{trial}/priority", {"priority": 30}, OWNER_OR_ADMIN),
    ("experiment priority", "POST", "/experiments/{running}/priority", {"priority": 31},
     OWNER_OR_ADMIN),
    ("pause", "POST", "/experiments/{running}/pause", None, OWNER_OR_ADMIN),
    ("activate", "POST", "/experiments/{running}/activate", None, OWNER_OR_ADMIN),
    ("review", "POST", "/trials/{suspect}/review", {"decision": "approve", "note": "fine"},
     OWNER_OR_ADMIN),
    ("kill", "POST", "/experiments/{running}/kill", None, OWNER_OR_ADMIN),
    ("prune", "POST", "/environments/prune", {"older_than": "3650d"}, ADMIN),
    ("create a user", "POST", "/users", {"name": "dave", "role": "user"}, ADMIN),
    ("change a user", "PATCH", "/users/dave", {"display_name": "Dave"}, ADMIN),
    ("deactivate", "POST", "/users/dave/deactivate", None, ADMIN),
    ("activate a user", "POST", "/users/dave/activate", None, ADMIN),
]
ORDER = ("vera", "bob", "alice", "admin")


@pytest.mark.timeout(240)
def test_the_authorisation_table(team: Team) -> None:
    answers: dict[tuple[str, str], int] = {}
    for what, method, path, body, allowed in TABLE:
        for who in ORDER:
            response = team.call(who, method, path, json=body)
            answers[what, who] = response.status_code
            if who in allowed:
                assert response.status_code not in (401, 403), (what, who, response.text)
            else:
                assert response.status_code == 403, (what, who, response.text)
                refusal = response.json()
                assert refusal["error"] == "Forbidden" and refusal["message"], refusal
    # What the allowed did, they did: the owner's act first, then the admin's on it.
    assert answers["pause", "alice"] == answers["pause", "admin"] == 200
    assert (answers["review", "alice"], answers["review", "admin"]) == (200, 409)
    # Killing twice is harmless (200), or the first kill has ended it already (409).
    assert answers["kill", "alice"] == 200 and answers["kill", "admin"] in (200, 409)
    assert (answers["create a user", "admin"], answers["make a token", "vera"]) == (201, 201)


def test_refusals_name_the_owner_and_the_role(team: Team) -> None:
    kill = team.call("bob", "POST", "/experiments/{running}/kill")
    assert kill.json()["message"] == (
        f"experiment {team.ids['running']} belongs to alice; only alice or an admin can kill it")
    viewer = team.call("vera", "POST", "/experiments/{running}/pause")
    assert viewer.json()["message"].startswith(
        "viewer vera cannot pause: it takes the admin or user role (the viewer role only "
        "reads)")
    review = team.call("bob", "POST", "/trials/{suspect}/review",
                       json={"decision": "reject", "note": "no"})
    experiment_id = team.call("bob", "GET", "/trials/{suspect}").json()["experiment_id"]
    assert review.json()["message"] == (
        f"trial {team.ids['suspect']} (experiment {experiment_id}) belongs to alice; only "
        "alice or an admin can review it")


def test_a_viewer_cannot_submit_and_a_user_cannot_jump_the_queue(
    team: Team, tmp_path: Path
) -> None:
    context = make_context(tmp_path, "exit0.sh")
    with team.client("vera") as vera, pytest.raises(Forbidden, match="viewer vera cannot "
                                                                     "submit experiments"):
        submit(vera, context)
    jumper = make_context(tmp_path, "exit0.sh")
    config = (jumper / "experiment.yaml").read_text().replace(
        '"name": "test"', '"name": "jumper", "resources": {"priority": 1}')
    (jumper / "experiment.yaml").write_text(config)
    with team.client("bob") as bob:
        with pytest.raises(Forbidden, match=r"resources\.priority 1 is reserved for admins"):
            submit(bob, jumper)
        mine = submit(bob, context)
        assert mine["owner"] == "bob"
        refused = team.call("bob", "POST", f"/trials/{only_trial(mine)['id']}/priority",
                            json={"priority": 9})
        assert refused.status_code == 403 and "reserved for admins" in refused.json()["message"]
        wait_ended(bob, mine["id"])
    with team.client("admin") as admin:
        assert submit(admin, jumper)["priority"] == 1  # an admin may


def test_a_deactivated_user_is_refused_from_the_next_request_and_their_runs_go_on(
    team: Team, tmp_path: Path
) -> None:
    release = tmp_path / "release"
    with team.client("admin") as admin:
        token = admin.create_user("erin", "user")["token"]
    team.tokens["erin"] = token
    with team.client("erin") as erin:
        exp = create(erin, tmp_path, "wait_for_file.py", str(release))
        wait_trial(erin, only_trial(exp)["id"], {"RUNNING"})
    assert team.call("erin", "GET", "/whoami").status_code == 200
    with team.client("admin") as admin:
        admin.deactivate_user("erin")
        refused = team.call("erin", "GET", "/whoami")
        assert refused.status_code == 401
        assert "user erin is deactivated" in refused.json()["message"]
        assert admin.get_experiment(exp["id"])["state"] == "ACTIVE"  # it runs on, visible
        release.touch()
        assert wait_ended(admin, exp["id"])["state"] == "COMPLETED"
        admin.activate_user("erin")
    assert team.call("erin", "GET", "/whoami").json()["name"] == "erin"


def test_revoked_and_expired_tokens_are_refused(team: Team) -> None:
    with team.client("alice") as alice:
        spare = alice.create_token("spare")
        brief = alice.create_token("brief", expires="1s")
    team.tokens.update(spare=spare["token"], brief=brief["token"])
    assert team.call("spare", "GET", "/whoami").status_code == 200
    assert team.call("alice", "DELETE", f"/tokens/{spare['id']}").status_code == 200
    assert team.call("spare", "GET", "/whoami").status_code == 401
    expired = wait_until(lambda: (r := team.call("brief", "GET", "/whoami")).status_code == 401
                         and r, timeout=10, what="the 1 s token to expire")
    assert "has expired" in expired.json()["message"]


def test_every_protected_route_refuses_a_request_without_a_token(team: Team) -> None:
    schema = httpx.get(team.server.url + "/openapi.json", timeout=30).json()
    public = {("post", f"{API}/login"), ("get", f"{API}/health")}
    checked = 0
    for path, operations in schema["paths"].items():
        for method in operations:
            if (method, path) in public:
                assert "security" not in operations[method], path
                continue
            assert operations[method]["security"] == [{"bearer": []}], (method, path)
            concrete = path.replace("{experiment_id}", "1").replace("{trial_id}", "1") \
                .replace("{name}", "alice").replace("{token_id}", "0" * 16) \
                .replace("{prefix}", "abcd")
            response = httpx.request(method, team.server.url + concrete, timeout=30)
            assert response.status_code == 401, (method, path, response.text)
            checked += 1
    assert checked >= 30
