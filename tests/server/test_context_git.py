"""The git state of a context on a real server (issue 17): sent with the upload by the
client, checked, kept beside the context snapshot, read into the trial snapshot's
`code.git`, inherited by a run again, and shown by `muster trial diff`."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from muster.client import Client, pack_context
from muster.home import Home
from tests.cli.test_cli import on
from tests.git_repos import commit, git, init_repo
from tests.server.experiments import make_context, only_trial, submit, wait_ended
from tests.servers import RunningServer, shared_server

pytestmark = pytest.mark.lifecycle  # a real server and real trials

server = shared_server()

COMMIT = "0b08e936278e6039f9b43ff269aec124775d6e22"


def committed_context(tmp_path: Path) -> tuple[Path, str]:
    """A context directory inside a repository, everything committed; the commit's id."""
    repo = tmp_path / "repo"
    context = make_context(repo, "exit0.sh")
    return context, init_repo(repo)


def code_of(client: Client, experiment: dict[str, Any]) -> dict[str, Any]:
    """The trial snapshot's code part of the experiment's only trial."""
    code: dict[str, Any] = client.trial_snapshot(only_trial(experiment)["id"])["trial"]["code"]
    return code


def test_a_clean_context_records_its_commit_and_branch(server: RunningServer,
                                                       tmp_path: Path) -> None:
    context, head = committed_context(tmp_path)
    with server.client() as client:
        experiment = submit(client, context)
        code = code_of(client, experiment)
    assert code["git"] == {"commit": head, "branch": "main", "dirty": False,
                           "diff_sha256": None}
    assert not Home(server.home).context_diff_file(experiment["uuid"]).exists()


def test_a_dirty_context_records_its_diff(server: RunningServer, tmp_path: Path) -> None:
    context, head = committed_context(tmp_path)
    with (context / "exit0.sh").open("a") as script:
        script.write("# changed after the commit\n")
    (context / "untracked.txt").write_text("not added\n")
    with server.client() as client:
        experiment = submit(client, context)
        code = code_of(client, experiment)
    kept = Home(server.home).context_diff_file(experiment["uuid"]).read_bytes()
    assert code["git"] == {"commit": head, "branch": "main", "dirty": True,
                           "diff_sha256": hashlib.sha256(kept).hexdigest()}
    assert b"+# changed after the commit" in kept and b"untracked.txt" not in kept
    assert kept.decode() == git(context, "diff", "HEAD", "--binary", "--full-index", "--",
                                ".") + "\n"


def test_a_context_outside_a_repository_has_no_git_state(server: RunningServer,
                                                         tmp_path: Path) -> None:
    with server.client() as client:
        experiment = submit(client, make_context(tmp_path, "exit0.sh"))
        assert code_of(client, experiment)["git"] is None
    assert not Home(server.home).context_git_file(experiment["uuid"]).exists()


def test_a_run_again_keeps_the_git_state_of_the_snapshot_it_reuses(server: RunningServer,
                                                                   tmp_path: Path) -> None:
    context, _ = committed_context(tmp_path)
    (context / "exit0.sh").write_text("exit 0\n")
    home = Home(server.home)
    with server.client() as client:
        first = submit(client, context)
        again = client.create_experiment((context / "experiment.yaml").read_text(), None,
                                         context_from=first["id"])
        assert code_of(client, again)["git"] == code_of(client, first)["git"]
        assert code_of(client, again)["git"]["dirty"] is True
    assert (home.context_diff_file(again["uuid"]).read_bytes()
            == home.context_diff_file(first["uuid"]).read_bytes())


def git_field(**values: Any) -> str:
    return json.dumps({"commit": COMMIT, "branch": "main", "dirty": False, **values})


@pytest.mark.parametrize(("multipart", "fields", "status", "words"), [
    (True, {"git": git_field(commit="HEAD")}, 400, "the `git` field's `commit` must be"),
    (False, {"git": git_field(commit="HEAD")}, 400, "the `git` field's `commit` must be"),
    (True, {"git": git_field(dirty="no")}, 400, "the `git` field's `dirty` must be true"),
    (True, {"git": "{not json"}, 400, "the `git` field is not JSON text"),
    (True, {"git": [git_field(), git_field()]}, 400, "the form has the field `git` twice"),
    (False, {"git": [git_field(), git_field()]}, 400, "the form has the field `git` twice"),
    (True, {"git": git_field(dirty=True, diff="x" * (1200 * 1024))}, 413,
     "the `git` field is larger than 1.1 MiB"),
    (False, {"git": git_field(dirty=True, diff="x" * (1200 * 1024))}, 413,
     "the `git` field is larger than 1.1 MiB"),
    (False, {"git": git_field(), "context_from": "1"}, 400,
     "the form has both `git` and `context_from`"),
], ids=["bad-commit", "urlencoded-bad-commit", "bad-dirty", "not-json", "twice",
        "urlencoded-twice", "oversized", "urlencoded-oversized", "with-context-from"])
def test_a_malformed_git_field_is_a_4xx_naming_it(
        server: RunningServer, tmp_path: Path, multipart: bool, fields: dict[str, Any],
        status: int, words: str) -> None:
    context = make_context(tmp_path, "exit0.sh")
    files = ({"context": ("context.tar.gz", pack_context(context), "application/gzip")}
             if multipart else None)
    with server.client() as client:
        # By id: an earlier test's experiment may end meanwhile (the server is shared).
        before = [e["id"] for e in client.list_experiments()]
        response = httpx.post(
            f"{server.url}/api/v1/experiments", timeout=30, files=files,
            data={"config": (context / "experiment.yaml").read_text(), **fields},
            headers={"Authorization": f"Bearer {server.token}"})
        assert response.status_code == status, response.text
        assert words in response.json()["message"] and "Traceback" not in response.text
        assert [e["id"] for e in client.list_experiments()] == before


def test_trial_diff_shows_contexts_that_differ_only_in_their_commit(
        server: RunningServer, tmp_path: Path) -> None:
    context, first = committed_context(tmp_path)
    with server.client() as client:
        a = submit(client, context)
        second = commit(context.parent, "nothing changed")
        b = submit(client, context)
        for experiment in (a, b):
            wait_ended(client, experiment["id"])
    done = on(server, "trial", "diff", str(only_trial(a)["id"]), str(only_trial(b)["id"]),
              "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["differences"] == [
        {"group": "code", "field": "code.git.commit", "a": first, "b": second, "rank": None}]
