"""A venv changing hands during a build under `run_as` (`muster.environments.ownership`),
on real files; as root, with a uid no account needs to have."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from muster.environments.ownership import OwnershipError, give, require_directories, seal, take
from muster.launch.accounts import Account

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="changing owners needs root")

ACCOUNT = Account(name="builder", uid=54321, gid=54321, groups=(54321,), home="/")


def venv(tmp_path: Path) -> Path:
    top = tmp_path / "venv"
    (top / "bin").mkdir(parents=True)
    (top / "lib" / "python3.11" / "site-packages").mkdir(parents=True)
    (top / "bin" / "python").symlink_to("/usr/bin/python3")
    (top / "pyvenv.cfg").write_text("home = /usr/bin\n")
    return top


def owners(top: Path) -> set[int]:
    found = {top.lstat().st_uid}
    for folder, dirs, files in os.walk(top):
        found |= {os.lstat(os.path.join(folder, name)).st_uid for name in dirs + files}
    return found


def test_take_then_give_hands_the_whole_tree_over_links_not_followed(tmp_path: Path) -> None:
    top = venv(tmp_path)
    outside = tmp_path / "outside"
    outside.write_text("not the venv's")
    (top / "lib" / "elsewhere").symlink_to(outside)
    give(top, ACCOUNT)
    assert owners(top) == {ACCOUNT.uid}
    take(top)
    assert owners(top) == {0}
    assert outside.stat().st_uid == 0  # the link's target was never handed over
    give(top, ACCOUNT)
    assert outside.stat().st_uid == 0


def test_take_refuses_a_hard_link(tmp_path: Path) -> None:
    top = venv(tmp_path)
    other = tmp_path / "other-file"
    other.write_text("someone else's")
    os.link(other, top / "lib" / "linked")
    with pytest.raises(OwnershipError, match="hard link"):
        take(top)


def test_a_link_on_the_way_to_where_root_writes_is_refused(tmp_path: Path) -> None:
    top = venv(tmp_path)
    require_directories(top, ("bin", "lib/python3.11/site-packages"))
    real = tmp_path / "elsewhere"
    (real / "site-packages").mkdir(parents=True)
    os.rename(top / "lib" / "python3.11", tmp_path / "moved")
    (top / "lib" / "python3.11").symlink_to(real)
    with pytest.raises(OwnershipError, match=r"python3\.11 is something else than a directory"):
        require_directories(top, ("bin", "lib/python3.11/site-packages"))


def test_seal_makes_the_top_root_s_and_replaces_a_planted_record(tmp_path: Path) -> None:
    top = venv(tmp_path)
    secret = tmp_path / "secret"
    secret.mkdir()
    (top / ".muster").symlink_to(secret)
    give(top, ACCOUNT)
    seal(top, top / ".muster")
    assert top.lstat().st_uid == 0 and (top / "bin").lstat().st_uid == ACCOUNT.uid
    record = (top / ".muster").lstat()
    assert not (top / ".muster").is_symlink() and record.st_uid == 0
    assert secret.is_dir() and not list(secret.iterdir())  # nothing written through it
    (top / ".muster" / "x").write_text("x")
    os.rename(top / "bin", top / "bin.old")
    (top / "bin").symlink_to("/usr/bin")
    with pytest.raises(OwnershipError, match="bin is something else"):
        seal(top, top / ".muster")
