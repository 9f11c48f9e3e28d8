"""`muster user`, `token`, `login`, `logout`, `whoami` and `events`, as subprocesses against
a real server: the JSON contract of each, and what a refusal looks like."""

from __future__ import annotations

import json
import stat
from pathlib import Path
from typing import Any

import pytest

from muster.client import Client
from tests.cli.test_cli import assert_clean_failure, muster, on
from tests.server.experiments import make_context, only_trial, submit, wait_ended
from tests.servers import RunningServer

pytestmark = pytest.mark.lifecycle  # a real server

PASSWORD = "a long enough password"


def as_json(done: Any) -> Any:
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.fixture(scope="module")
def alice(server: RunningServer) -> str:
    """A user with a password; her first token (`user create --json`'s contract)."""
    made = as_json(muster(server.home, server.url, "user", "create", "alice", "--role",
                          "user", "--password-stdin", "--display-name", "Alice Liddell",
                          "--json", stdin=PASSWORD + "\n"))
    assert {"name", "role", "token"} <= set(made)
    assert (made["name"], made["role"], made["has_password"]) == ("alice", "user", True)
    return str(made["token"])


def test_user_create_prints_the_first_token_once(server: RunningServer) -> None:
    made = as_json(on(server, "user", "create", "vera", "--role", "viewer", "--json"))
    assert (made["name"], made["role"], made["token"][:4]) == ("vera", "viewer", "mst_")
    listed = as_json(on(server, "user", "list", "--json"))
    assert {u["name"]: u["role"] for u in listed}["vera"] == "viewer"
    assert all("token" not in u for u in listed)
    again = on(server, "user", "create", "vera", "--role", "user")
    assert "user vera exists already" in assert_clean_failure(again)
    bad = on(server, "user", "create", "Vera Two", "--role", "user")
    assert bad.returncode != 0 and "Traceback" not in bad.stderr


def test_muster_token_overrides_the_home_token_and_whoami_says_who(
    server: RunningServer, alice: str
) -> None:
    assert as_json(on(server, "whoami", "--json"))["name"] == "admin"
    me = as_json(muster(server.home, server.url, "whoami", "--json", token=alice))
    assert (me["name"], me["role"], me["via"]) == ("alice", "user", "token")
    plain = muster(server.home, server.url, "whoami", token=alice)
    assert plain.stdout.startswith("alice (user) at ")


def test_token_create_list_revoke(server: RunningServer, alice: str) -> None:
    made = as_json(muster(server.home, server.url, "token", "create", "--name", "laptop",
                          "--expires", "30d", "--json", token=alice))
    assert {"id", "name", "token"} <= set(made) and made["name"] == "laptop"
    assert made["expires_at"] is not None
    listed = as_json(muster(server.home, server.url, "token", "list", "--json", token=alice))
    assert all({"id", "name", "created_at", "expires_at", "last_used_at"} <= set(t)
               for t in listed)
    assert made["id"] in [t["id"] for t in listed]
    assert all("token" not in t for t in listed)
    works = muster(server.home, server.url, "whoami", token=made["token"])
    assert works.returncode == 0
    done = muster(server.home, server.url, "token", "revoke", made["id"], token=alice)
    assert done.returncode == 0 and "revoked" in done.stdout
    refused = muster(server.home, server.url, "whoami", token=made["token"])
    stderr = assert_clean_failure(refused)
    assert "unknown or revoked API token" in stderr and "$MUSTER_TOKEN" in stderr


def test_a_forbidden_action_exits_non_zero_with_the_sentence(
    server: RunningServer, alice: str, tmp_path: Path
) -> None:
    exp = as_json(on(server, "experiment", "create", str(make_context(tmp_path, "exit0.sh")
                                                          / "experiment.yaml"), "--json"))
    refused = muster(server.home, server.url, "experiment", "kill", str(exp["id"]),
                     token=alice)
    assert assert_clean_failure(refused) == (
        f"error: experiment {exp['id']} belongs to admin; only admin or an admin can kill "
        "it\n")
    refused = muster(server.home, server.url, "user", "deactivate", "admin", token=alice)
    assert "user alice cannot manage users" in assert_clean_failure(refused)


def test_login_keeps_a_token_for_the_url_and_logout_revokes_it(
    server: RunningServer, alice: str, tmp_path: Path
) -> None:
    config = {"XDG_CONFIG_HOME": str(tmp_path / "xdg")}
    other_home = tmp_path / "laptop-home"  # no server token here: a remote user's laptop
    done = muster(other_home, None, "login", server.url, "--user", "alice",
                  "--password-stdin", stdin=PASSWORD + "\n", env=config)
    assert done.returncode == 0, done.stderr
    assert f"logged in to {server.url} as alice (user)" in done.stdout
    kept = tmp_path / "xdg" / "muster" / "credentials"
    assert stat.S_IMODE(kept.stat().st_mode) == 0o600
    assert stat.S_IMODE(kept.parent.stat().st_mode) == 0o700
    token = json.loads(kept.read_text())["servers"][server.url]["token"]
    me = as_json(muster(other_home, server.url, "whoami", "--json", env=config))
    assert me["name"] == "alice" and me["token_id"] is not None
    wrong = muster(other_home, None, "login", server.url, "--user", "alice",
                   "--password-stdin", stdin="not her password\n", env=config)
    assert "wrong user name or password" in assert_clean_failure(wrong)

    out = muster(other_home, server.url, "logout", env=config)
    assert out.returncode == 0 and f"logged out of {server.url}" in out.stdout
    assert server.url not in json.loads(kept.read_text())["servers"]
    with Client(url=server.url, token=token) as revoked, pytest.raises(Exception,
                                                                       match="revoked"):
        revoked.whoami()
    nothing = muster(other_home, server.url, "whoami", env=config)
    assert "no API token to send" in assert_clean_failure(nothing)
    kept_token = muster(other_home, None, "login", server.url, "--token-stdin",
                        stdin=alice + "\n", env=config)
    assert kept_token.returncode == 0 and "as alice (user)" in kept_token.stdout
    assert as_json(muster(other_home, server.url, "whoami", "--json", env=config))[
        "token_id"] is not None


def test_events_show_who_did_what(server: RunningServer, alice: str, tmp_path: Path) -> None:
    with Client(url=server.url, token=alice) as as_alice:
        exp = wait_ended(as_alice, submit(as_alice, make_context(tmp_path, "exit0.sh"))["id"])
    events = as_json(on(server, "events", "--experiment", str(exp["id"]), "--json"))
    assert all({"actor", "kind", "at", "message"} <= set(e) for e in events)
    actors = {(e["actor"], e["kind"]) for e in events}
    assert ("alice", "created") in actors
    assert ("system:supervisor", "launching") in actors
    by_alice = as_json(on(server, "events", "--user", "alice", "--json"))
    assert by_alice and {e["actor"] for e in by_alice} == {"alice"}
    trial_id = only_trial(exp)["id"]
    assert {e["trial_id"] for e in as_json(on(server, "events", "--trial", str(trial_id),
                                              "--json"))} == {trial_id}


def test_experiment_list_mine_and_by_owner(server: RunningServer, alice: str,
                                           tmp_path: Path) -> None:
    with Client(url=server.url, token=alice) as as_alice:
        mine = submit(as_alice, make_context(tmp_path, "exit0.sh"))
    listed = as_json(muster(server.home, server.url, "experiment", "list", "--mine", "--json",
                            token=alice))
    assert listed and {e["owner"] for e in listed} == {"alice"}
    assert mine["id"] in [e["id"] for e in listed]
    admins = as_json(on(server, "experiment", "list", "--owner", "admin", "--json"))
    assert mine["id"] not in [e["id"] for e in admins]
    table = on(server, "experiment", "list")
    assert "alice" in table.stdout and "Owner" in table.stdout
    unknown = on(server, "experiment", "list", "--owner", "nobody")
    assert "user 'nobody' does not exist" in assert_clean_failure(unknown)
