"""The artifact collector on real files: which files a config's patterns take from a
working directory, and what it never takes (a link, a file of another account, a stale file
of an earlier attempt, more than the limit)."""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

import pytest

from muster.artifacts import ArtifactsTooLarge, collect, matcher

SINCE = 1_000_000.0  # the final attempt's start, in the tests' files' clock


def write(workdir: Path, relative: str, data: bytes = b"x", mtime: float = SINCE + 5) -> Path:
    path = workdir / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    os.utime(path, (mtime, mtime))
    return path


@pytest.mark.parametrize(("pattern", "taken", "left"), [
    ("model.pt", ["model.pt"], ["sub/model.pt", "model.pts"]),
    ("eval/*.json", ["eval/a.json"], ["eval/deep/b.json", "eval/a.jsonl"]),
    ("eval/**/*.json", ["eval/a.json", "eval/deep/b.json"], ["other/c.json"]),
    ("**/*.png", ["a.png", "plots/x/b.png"], ["a.pngx"]),
    ("plots/", ["plots/x/b.png", "plots/c.csv"], ["plotsy/d.csv"]),
    ("run-?.log", ["run-1.log"], ["run-12.log"]),
    ("ckpt-[0-9].pt", ["ckpt-3.pt"], ["ckpt-a.pt"]),
    ("ckpt-[!0-9].pt", ["ckpt-a.pt"], ["ckpt-3.pt"]),
])
def test_patterns(pattern: str, taken: list[str], left: list[str]) -> None:
    matches = matcher([pattern])
    assert [p for p in taken + left if matches(p)] == taken


def test_the_final_attempts_files_are_copied_and_hashed(tmp_path: Path) -> None:
    work = tmp_path / "work"
    write(work, "model.pt", b"weights" * 1000)
    write(work, "eval/report.json", b'{"acc": 0.9}')
    write(work, "eval/old.json", b"{}", mtime=SINCE - 60)  # a killed attempt's
    write(work, "notes.txt", b"not asked for")

    found = collect(work, ["model.pt", "eval/*.json"], tmp_path / "artifacts", trial_id=7,
                    attempt=2, since=SINCE, limit=1 << 20)

    assert found.path == tmp_path / "artifacts" / "attempt-2"
    assert sorted(found.files) == ["eval/report.json", "model.pt"]
    for relative, digest in found.files.items():
        copied = (found.path / relative).read_bytes()
        assert copied == (work / relative).read_bytes()
        assert hashlib.sha256(copied).hexdigest() == digest
    document = json.loads((found.path / "metadata.json").read_text())
    assert (document["kind"], document["trial_id"], document["attempt"]) == ("artifacts", 7, 2)
    assert document["files"] == found.files and document["size"] == found.size == 7012
    assert found.skipped == ("eval/old.json: not written by the final attempt (older than "
                             "its start): a stale file",)
    assert [p.name for p in (tmp_path / "artifacts").iterdir()] == ["attempt-2"]  # no tmp


def test_links_are_never_followed(tmp_path: Path) -> None:
    """A job that links a server file, or a directory above its own, into a matched name
    gets neither copied: the link is named and left."""
    secret = write(tmp_path, "server/token", b"the server's token")
    work = tmp_path / "work"
    write(work, "model.pt")
    (work / "eval").mkdir()
    (work / "eval" / "token.json").symlink_to(secret)
    (work / "plots").symlink_to(tmp_path / "server")  # a directory link: not walked into

    found = collect(work, ["model.pt", "eval/*.json", "plots/", "**/token"],
                    tmp_path / "artifacts", trial_id=1, attempt=1, since=SINCE, limit=1 << 20)

    assert list(found.files) == ["model.pt"]
    assert found.path is not None
    assert not any(b"server's token" in p.read_bytes() for p in found.path.rglob("*")
                   if p.is_file())
    assert "eval/token.json: a link, not followed" in found.skipped


def test_a_file_another_account_owns_is_not_copied(tmp_path: Path) -> None:
    """With jobs run as their owners, a file the job's account does not own (a hard link to
    one of the server's, here owned by root) is named and left."""
    work = tmp_path / "work"
    mine = write(work, "model.pt")
    theirs = write(work, "eval/theirs.json")
    os.chown(mine, 12345, 12345)  # the job's account (the tests run as root)

    found = collect(work, ["model.pt", "eval/*.json"], tmp_path / "artifacts", trial_id=1,
                    attempt=1, since=SINCE, limit=1 << 20, owner=12345)

    assert list(found.files) == ["model.pt"]
    assert found.skipped == (f"eval/theirs.json: owned by uid {theirs.stat().st_uid}, not by "
                             "the job's account: not copied",)


def test_over_the_limit_nothing_is_stored_and_the_sizes_are_named(tmp_path: Path) -> None:
    work = tmp_path / "work"
    write(work, "a.bin", b"a" * 3000)
    write(work, "b.bin", b"b" * 3000)

    with pytest.raises(ArtifactsTooLarge, match=r"the artifacts hold 2 files of 5.9 KiB, more "
                                                r"than artifacts_limit \(4 KiB\)"):
        collect(work, ["*.bin"], tmp_path / "artifacts", trial_id=1, attempt=1, since=SINCE,
                limit=4096)

    assert not (tmp_path / "artifacts").exists() or not any((tmp_path / "artifacts").iterdir())


def test_nothing_matched_publishes_no_set(tmp_path: Path) -> None:
    work = tmp_path / "work"
    write(work, "model.pt", mtime=time.time() - 3600)

    found = collect(work, ["model.pt", "missing/*.json"], tmp_path / "artifacts", trial_id=1,
                    attempt=3, since=time.time(), limit=1 << 20)

    assert (found.path, found.files, found.skipped_count) == (None, {}, 1)
