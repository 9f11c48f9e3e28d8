"""What a user can make the server read, write or run (issue 29: F1, F2, C1, R4's allow-list,
R5, D1), on a real server with a cluster config's allow-lists, real users and real jobs.

Each attack is refused with a 403 that names the key and the rule, before the server reads,
writes, connects to or runs anything it names; the legitimate use beside it still works.
"""

from __future__ import annotations

import hashlib
import json
import socket
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from muster.client import Client
from muster.errors import ConfigError, Forbidden
from muster.home import Home
from tests.server.experiments import only_trial, wait_ended, write_context
from tests.servers import RunningServer, serving

pytestmark = [pytest.mark.lifecycle, pytest.mark.timeout(180)]

ALLOWED_VALUE = "shared-wandb-key-0123456789"
ALLOWED_ENV = "allowed-env-value-98765"


@dataclass
class Site:
    """A server whose cluster config allows a few places, and its users' clients."""

    server: RunningServer
    base: Path
    tokens: dict[str, str] = field(default_factory=dict)

    def client(self, who: str) -> Client:
        return Client(url=self.server.url, token=self.tokens[who], home=Home(self.server.home))

    @property
    def home(self) -> Path:
        return self.server.home

    def context(self, config: dict[str, Any], script: str = "pass\n") -> Path:
        context = write_context(self.base / "contexts", ["python", "job.py"],
                                files={"job.py": script})
        written = json.loads((context / "experiment.yaml").read_text())
        (context / "experiment.yaml").write_text(json.dumps({**written, **config}))
        return context

    def submit(self, who: str, config: dict[str, Any], script: str = "pass\n",
               secrets: dict[str, str] | None = None) -> dict[str, Any]:
        context = self.context(config, script)
        with self.client(who) as c:
            return c.create_experiment((context / "experiment.yaml").read_text(), context,
                                       secrets=secrets)

    def refused(self, who: str, config: dict[str, Any]) -> str:
        """The message of a refused submission; nothing was created."""
        with self.client("admin") as c:
            before = len(c.list_experiments())
        with pytest.raises(Forbidden) as caught:
            self.submit(who, config)
        with self.client("admin") as c:
            assert len(c.list_experiments()) == before
        return str(caught.value)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    base = tmp_path_factory.mktemp("allowances")
    shared = base / "shared"
    shared.mkdir()
    (shared / "wandb").write_text(ALLOWED_VALUE + "\n")
    (shared / "passwd-link").symlink_to("/etc/passwd")
    (base / "outside").write_text("not shared\n")
    (base / "datasets" / "digits").mkdir(parents=True)
    (base / "datasets" / "digits" / "a.txt").write_text("1")
    (base / "checkpoints").mkdir()
    home = base / "home"
    home.mkdir()
    (home / "cluster.yaml").write_text(json.dumps({
        "secret_sources": [f"file:{shared}/*", "env:ALLOWED_VAR"],
        "data_roots": [str(base / "datasets")],
        "storage_paths": [str(base / "checkpoints")],
        "interpreters": [sys.executable, str(base / "user-python")],
    }))
    env = {"ALLOWED_VAR": ALLOWED_ENV, "FORBIDDEN_VAR": "not-for-jobs"}
    with serving(home, env=env) as server:
        site = Site(server, base, {"admin": server.token})
        with site.client("admin") as admin:
            for name in ("alice", "bob"):
                site.tokens[name] = admin.create_user(name, "user")["token"]
        yield site


def test_a_user_cannot_make_the_server_read_its_files_or_variables(site: Site) -> None:
    """F1: `file:` and `env:` sources outside `secret_sources` are refused for users, with
    the key and the rule; a pattern is no way out (`..`, a link); nobody, not even an
    admin, makes a job read the server's home."""
    shared = site.base / "shared"
    for source in ("file:/etc/shadow", "env:MUSTER_HOME", "env:FORBIDDEN_VAR",
                   f"file:{shared}/../outside", f"file:{shared}/passwd-link"):
        message = site.refused("alice", {"environment": {"secrets": {"X": source}}})
        assert "environment.secrets.X" in message, message
        assert "secret_sources" in message and "submit" in message, message
    token = site.home / "secrets" / "token"
    for who in ("alice", "admin"):
        message = site.refused(who, {"environment": {"secrets": {"X": f"file:{token}"}}})
        assert "environment.secrets.X" in message and "$MUSTER_HOME" in message, message
    message = site.refused("alice", {"checkpoint_storage": {
        "type": "s3", "bucket": "ckpts", "access_key": "file:/etc/shadow",
        "secret_key": "env:FORBIDDEN_VAR"}})
    assert "checkpoint_storage.access_key" in message, message
    assert "checkpoint_storage.secret_key" in message, message


def test_allowed_sources_and_submitted_secrets_reach_the_job(site: Site) -> None:
    """The legitimate uses beside F1: an allow-listed `file:` and `env:` source, and a
    `submit` secret, reach a user's job."""
    script = ("import hashlib, os\n"
              "for name in ('A', 'B', 'C'):\n"
              "    print(name, hashlib.sha256(os.environ[name].encode()).hexdigest(), "
              "flush=True)\n")
    secrets = {"A": f"file:{site.base / 'shared' / 'wandb'}", "B": "env:ALLOWED_VAR",
               "C": "submit"}
    created = site.submit("alice", {"environment": {"secrets": secrets}}, script,
                          secrets={"C": "submitted-by-alice-42"})
    with site.client("alice") as c:
        trial = only_trial(wait_ended(c, created["id"]))
        assert trial["state"] == "SUCCEEDED", trial
        log = c.read_logs(trial["id"]).data.decode()
    for name, value in (("A", ALLOWED_VALUE), ("B", ALLOWED_ENV),
                        ("C", "submitted-by-alice-42")):
        assert f"{name} {hashlib.sha256(value.encode()).hexdigest()}" in log, log


def test_checkpoints_go_only_where_the_cluster_allows(site: Site) -> None:
    """C1 and F2: a user's `checkpoint_storage.path` outside `storage_paths` is refused
    before the server makes it; an `endpoint_url` of the user's choosing is refused before
    the server connects to it; allowed places and an admin's choice still work."""
    elsewhere = site.base / "elsewhere" / "ckpts"
    message = site.refused("alice", {"checkpoint_storage": {"type": "shared_fs",
                                                            "path": str(elsewhere)}})
    assert "checkpoint_storage.path" in message and "storage_paths" in message, message
    assert not elsewhere.parent.exists()

    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        listener.setblocking(False)
        port = listener.getsockname()[1]
        message = site.refused("alice", {"checkpoint_storage": {
            "type": "s3", "bucket": "ckpts", "endpoint_url": f"http://127.0.0.1:{port}",
            "access_key": f"file:{site.home / 'secrets' / 'token'}",
            "secret_key": f"file:{site.home / 'secrets' / 'token'}"}})
        assert "checkpoint_storage.endpoint_url" in message, message
        assert "storage_endpoints" in message and "$MUSTER_HOME" in message, message
        with pytest.raises(BlockingIOError):
            listener.accept()  # nobody connected

    allowed = site.base / "checkpoints" / "alice"
    site.submit("alice", {"checkpoint_storage": {"type": "shared_fs", "path": str(allowed)}})
    assert allowed.is_dir()
    site.submit("admin", {"checkpoint_storage": {"type": "shared_fs", "path": str(elsewhere)}})
    assert elsewhere.is_dir()


def test_a_user_runs_only_interpreters_an_admin_allowed(site: Site) -> None:
    """R4 (the allow-list; the probe's account is tests/environments'): a script a user's
    job wrote is never run by the server as `environment.python`, allow-listed or not."""
    ran = site.base / "the-server-ran-it"
    script = f"#!/bin/sh\ntouch {ran}\nexec {sys.executable} \"$@\"\n"
    for name in ("job-written-python", "user-python"):
        path = site.base / name
        path.write_text(script)
        path.chmod(0o777)  # as a job's own file would be: anyone may change it
        message = site.refused("alice", {"environment": {"python": str(path)}})
        assert "environment.python" in message, message
        if name == "user-python":  # allow-listed, but writable by others
            assert "writable by its group or by everyone" in message, message
        else:
            assert "interpreters" in message, message
    assert not ran.exists()
    created = site.submit("alice", {"environment": {"python": sys.executable}})
    assert created["config"]["environment"]["python"] == sys.executable


def test_data_paths_stay_in_the_context_or_the_data_roots(site: Site) -> None:
    """D1: a user's `data.path` outside `data_roots` is refused before the server looks at
    it (the same answer whether it exists or not), a relative one never leads out of the
    context, and nobody's data is in the server's home."""
    answers = [site.refused("alice", {"data": {"path": path}})
               for path in ("/root", "/no/such/directory")]
    for message in answers:
        assert "data.path" in message and "data_roots" in message, message
    assert answers[0].replace("/root", "X") == answers[1].replace("/no/such/directory", "X")
    with pytest.raises(ConfigError, match=r"data.path: '../..' leads out of the uploaded"):
        site.submit("alice", {"data": {"path": "../.."}})
    message = site.refused("admin", {"data": {"path": str(site.home / "secrets")}})
    assert "$MUSTER_HOME" in message, message
    created = site.submit("alice", {"data": {"path": str(site.base / "datasets" / "digits")}})
    assert created["config"]["data"]["path"].endswith("digits")


def test_a_run_again_reuses_only_ones_own_context(site: Site) -> None:
    """R5: `context_from` another owner's experiment is refused (its code stays its
    owner's); one's own, and an admin's of anyone's, still work."""
    original = site.submit("alice", {})
    text = (site.context({}) / "experiment.yaml").read_text()
    with site.client("bob") as bob, pytest.raises(Forbidden) as caught:
        bob.create_experiment(text, None, context_from=original["id"])
    assert f"experiment {original['id']} belongs to alice" in str(caught.value)
    for who in ("alice", "admin"):
        with site.client(who) as c:
            again = c.create_experiment(text, None, context_from=original["id"])
        assert again["id"] > original["id"]
