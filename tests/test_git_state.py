"""A context's git state (`muster.git_state`): captured from real repositories, the form's
field checked strictly, and the record kept beside the context snapshot."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from muster import git_state
from muster.errors import InvalidRequest, PayloadTooLarge
from muster.git_state import MAX_DIFF_BYTES, MAX_FIELD_BYTES, GitState, capture, parse_field
from muster.home import Home
from tests.git_repos import commit, git, init_repo

COMMIT = "0b08e936278e6039f9b43ff269aec124775d6e22"
SHA = hashlib.sha256(b"x").hexdigest()


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A repository whose `ctx/` is the context, with a file outside it too."""
    init_repo(tmp_path / "repo", {"ctx/train.py": "print('hi')\n", "ctx/.gitignore": "out/\n",
                                  "elsewhere.txt": "outside\n"})
    return tmp_path / "repo"


def diff_of(repo: Path) -> bytes:
    return subprocess.run(["git", "diff", "HEAD", "--binary", "--full-index", "--", "ctx"],
                          cwd=repo, check=True, capture_output=True).stdout


# -- capture ---------------------------------------------------------------------------


def test_a_clean_context_has_its_commit_and_branch(repo: Path) -> None:
    (repo / "elsewhere.txt").write_text("changed outside the context\n")
    (repo / "ctx" / "out").mkdir()
    (repo / "ctx" / "out" / "ignored.bin").write_bytes(b"\0ignored")
    assert capture(repo / "ctx") == GitState(git(repo, "rev-parse", "HEAD"), "main", False)


def test_a_changed_tracked_file_is_dirty_with_its_diff(repo: Path) -> None:
    (repo / "ctx" / "train.py").write_text("print('changed')\n")
    state = capture(repo / "ctx")
    assert state is not None and state.dirty and not state.diff_truncated
    assert state.diff is not None and state.diff.encode() == diff_of(repo)
    assert "a/ctx/train.py" in state.diff and "+print('changed')" in state.diff
    assert state.diff_sha256 == hashlib.sha256(diff_of(repo)).hexdigest()
    assert parse_field(state.field().encode()) == state


def test_the_diff_applies_to_a_checkout_of_the_commit(repo: Path, tmp_path: Path) -> None:
    (repo / "ctx" / "train.py").write_text("print('changed')\n")
    (repo / "ctx" / "weights.bin").write_bytes(b"\0\1\2binary")
    git(repo, "add", "ctx/weights.bin")
    state = capture(repo / "ctx")
    assert state is not None and state.diff is not None
    clone = tmp_path / "clone"
    git(tmp_path, "clone", "-q", str(repo), str(clone))
    (tmp_path / "the.diff").write_bytes(state.diff.encode())
    git(clone, "apply", str(tmp_path / "the.diff"))
    assert (clone / "ctx" / "weights.bin").read_bytes() == b"\0\1\2binary"
    assert (clone / "ctx" / "train.py").read_text() == "print('changed')\n"


def test_an_untracked_file_is_dirty_without_a_diff(repo: Path) -> None:
    (repo / "ctx" / "notes.txt").write_text("not added\n")
    state = capture(repo / "ctx")
    assert state is not None and state.dirty
    assert (state.diff, state.diff_sha256, state.diff_truncated) == (None, None, False)


def test_a_detached_head_has_no_branch(repo: Path) -> None:
    first = git(repo, "rev-parse", "HEAD")
    commit(repo, "second")
    git(repo, "checkout", "-q", "--detach", first)
    assert capture(repo / "ctx") == GitState(first, None, False)


@pytest.mark.parametrize("content", [b"\xe9t\xe9\n" * 10, "é\n".encode() * (MAX_DIFF_BYTES // 2),
                                     b"\x01" * (MAX_DIFF_BYTES // 4)],
                         ids=["not-utf8", "over-1MiB", "over-the-field-once-escaped"])
def test_a_diff_that_cannot_go_as_text_goes_as_its_sha256(repo: Path, content: bytes) -> None:
    (repo / "ctx" / "train.py").write_bytes(content)
    state = capture(repo / "ctx")
    assert state is not None and state.dirty and state.diff_truncated and state.diff is None
    assert state.diff_sha256 == hashlib.sha256(diff_of(repo)).hexdigest()
    assert len(state.field().encode()) <= MAX_FIELD_BYTES
    assert parse_field(state.field().encode()) == state


def test_no_state_outside_a_work_tree_or_before_the_first_commit(tmp_path: Path) -> None:
    assert capture(tmp_path) is None
    git(tmp_path, "init", "-q")
    assert capture(tmp_path) is None  # no commit yet
    assert capture(tmp_path / ".git") is None  # inside the repository, not its work tree


def test_no_state_without_git(repo: Path, monkeypatch: pytest.MonkeyPatch,
                              tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert capture(repo / "ctx") is None


def test_a_git_that_hangs_is_given_up_on_in_time(repo: Path, monkeypatch: pytest.MonkeyPatch,
                                                 tmp_path: Path,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "git").write_text("#!/bin/sh\nexec sleep 30\n")
    (bin_dir / "git").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(git_state, "GIT_TIMEOUT_S", 0.5)
    with caplog.at_level(logging.WARNING, logger="muster.git_state"):
        assert capture(repo / "ctx") is None
    assert "its git state is not recorded" in caplog.text and "timed out" in caplog.text


# -- the form's field ------------------------------------------------------------------


def field(**values: Any) -> bytes:
    return json.dumps({"commit": COMMIT, "branch": "main", "dirty": False, **values}).encode()


def test_a_well_formed_field_is_read() -> None:
    assert parse_field(field()) == GitState(COMMIT, "main", False)
    assert parse_field(b'{"commit": "' + b"a" * 64 + b'", "dirty": true}') == GitState(
        "a" * 64, None, True)
    diff = "diff --git a/x b/x\n"
    digest = hashlib.sha256(diff.encode()).hexdigest()
    assert parse_field(field(dirty=True, diff=diff)) == GitState(COMMIT, "main", True, diff,
                                                                 digest)
    assert parse_field(field(dirty=True, diff_sha256=SHA, diff_truncated=True)) == GitState(
        COMMIT, "main", True, None, SHA, True)


@pytest.mark.parametrize(("raw", "words"), [
    (b"not json", "the `git` field is not JSON text"),
    (b"\xff", "the `git` field is not JSON text"),
    (b"[" * 100_000 + b"]" * 100_000, "the `git` field is not JSON text"),
    (b'["a list"]', "the `git` field must be a JSON object"),
    (field(commit="ABC"), "the `git` field's `commit` must be a git object id"),
    (field(commit=COMMIT.upper()), "`commit` must be a git object id"),
    (field(commit=COMMIT[:39]), "`commit` must be a git object id"),
    (field(commit=None), "`commit` must be a git object id (40 or 64 lowercase hex digits, "
                         "`git rev-parse HEAD`), missing"),
    (field(branch="b" * 256), "`branch` must be a branch name of at most 255 characters"),
    (field(branch="a\nb"), "`branch` must be a branch name"),
    (field(branch=""), "`branch` must be a branch name"),
    (field(branch=3), "`branch` must be a branch name"),
    (field(dirty=1), "the `git` field's `dirty` must be true or false, got 1"),
    (field(dirty=None), "`dirty` must be true or false, missing"),
    (field(diff_truncated="yes"), "`diff_truncated` must be true or false"),
    (field(diff="d"), "has a diff, yet `dirty` is false"),
    (field(dirty=True, diff=""), "`diff` must be the diff as text of at most 1 MiB"),
    (field(dirty=True, diff="x" * (MAX_DIFF_BYTES + 1)), "`diff` must be the diff as text"),
    (field(dirty=True, diff="\ud800"), "`diff` must be the diff as text"),
    (field(dirty=True, diff="d", diff_sha256=SHA), "`diff_sha256` is not the sha256 of its"),
    (field(dirty=True, diff_sha256="F" * 64), "`diff_sha256` must be a sha256"),
    (field(dirty=True, diff_sha256=SHA), "has a `diff_sha256` without its `diff`"),
    (field(dirty=True, diff_truncated=True), "`diff_truncated` is true, so `diff` must be"),
    (field(dirty=True, diff="d", diff_sha256=hashlib.sha256(b"d").hexdigest(),
           diff_truncated=True), "`diff_truncated` is true"),
    (field(path="ctx"), "the `git` field has the unknown key 'path'"),
], ids=lambda value: None if isinstance(value, bytes) else value[:48])
def test_a_malformed_field_is_refused_naming_what_is_wrong(raw: bytes, words: str) -> None:
    with pytest.raises(InvalidRequest) as refused:
        parse_field(raw)
    assert type(refused.value) is InvalidRequest and words in str(refused.value)


def test_an_oversized_field_is_refused_unread() -> None:
    with pytest.raises(PayloadTooLarge, match=r"the `git` field is larger than 1\.1 MiB"):
        parse_field(b"{" + b" " * MAX_FIELD_BYTES + b"}")


# -- kept beside the context snapshot ----------------------------------------------------


def test_the_record_and_its_diff_are_kept_and_copied(tmp_path: Path) -> None:
    home = Home(tmp_path / "home").ensure()
    for uuid in ("first", "again"):
        home.context_dir(uuid).mkdir(parents=True)
    state = parse_field(field(dirty=True, diff="diff --git a/x b/x\n"))
    git_state.save(home, "first", state)
    kept = home.context_diff_file("first").read_bytes()
    assert hashlib.sha256(kept).hexdigest() == state.diff_sha256
    assert "diff" not in json.loads(home.context_git_file("first").read_text())
    assert git_state.load(home, "first") == GitState(COMMIT, "main", True, None,
                                                      state.diff_sha256)
    git_state.copy(home, "first", "again")
    assert git_state.load(home, "again") == git_state.load(home, "first")
    assert home.context_diff_file("again").read_bytes() == kept
    assert oct(home.context_git_file("again").stat().st_mode & 0o777) == "0o600"


def test_no_record_or_a_bad_one_is_none(tmp_path: Path,
                                        caplog: pytest.LogCaptureFixture) -> None:
    home = Home(tmp_path / "home").ensure()
    home.context_dir("u").mkdir(parents=True)
    assert git_state.load(home, "u") is None
    git_state.copy(home, "missing", "u")
    assert not home.context_git_file("u").exists()
    home.context_git_file("u").write_text('{"commit": "nope", "dirty": false}')
    with caplog.at_level(logging.WARNING, logger="muster.git_state"):
        assert git_state.load(home, "u") is None
    assert "cannot be read" in caplog.text and "`commit`" in caplog.text
