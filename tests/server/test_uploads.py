"""Safe extraction of uploaded context archives, on real tar.gz files built here."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import httpx
import pytest

from muster.client import Client
from muster.errors import InvalidRequest
from muster.services.uploads import extract_context
from tests.server.experiments import config_text
from tests.servers import RunningServer, shared_server

pytestmark = pytest.mark.lifecycle  # starts real processes

Member = tuple[str, bytes] | tarfile.TarInfo


server = shared_server()


def regular(name: str, data: bytes = b"x") -> tuple[str, bytes]:
    return name, data


def special(name: str, kind: bytes, linkname: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, linkname
    if kind == tarfile.DIRTYPE:
        info.mode = 0o755
    return info


def build_archive(path: Path, members: list[Member]) -> Path:
    """A tar.gz at `path` holding `members` in order: (name, data) files or bare TarInfos."""
    with tarfile.open(path, "w:gz") as tar:
        for member in members:
            if isinstance(member, tarfile.TarInfo):
                tar.addfile(member)
                continue
            name, data = member
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    return path


def rejected(tmp_path: Path, members: list[Member], max_bytes: int | None = None) -> str:
    """Extract an archive of `members` that must be refused; returns the message."""
    archive = build_archive(tmp_path / "context.tar.gz", members)
    dest = tmp_path / "out" / "context"
    with pytest.raises(InvalidRequest) as info:
        if max_bytes is None:
            extract_context(archive, dest)
        else:
            extract_context(archive, dest, max_bytes=max_bytes)
    assert not dest.exists(), "a refused archive must leave nothing behind"
    assert not (tmp_path / "outside").exists()
    return str(info.value)


@pytest.mark.parametrize(
    ("members", "named", "words"),
    [
        ([regular("ok.py"), regular("/tmp/evil.py")], "/tmp/evil.py", "absolute path"),
        ([regular("../outside")], "../outside", "leaves the directory"),
        ([regular("pkg/../../outside")], "pkg/../../outside", "leaves the directory"),
        ([special("passwd", tarfile.SYMTYPE, "/etc/passwd")], "passwd", "outside"),
        ([special("up", tarfile.SYMTYPE, "../x")], "up", "outside"),
        ([special("a/b/up", tarfile.SYMTYPE, "../../../outside")], "a/b/up", "outside"),
        ([special("hard", tarfile.LNKTYPE, "../outside")], "hard", "outside"),
        ([special("hard", tarfile.LNKTYPE, "/etc/passwd")], "hard", "outside"),
        ([special("fifo", tarfile.FIFOTYPE)], "fifo", "device file or FIFO"),
        ([special("tty", tarfile.CHRTYPE)], "tty", "device file or FIFO"),
        ([special("disk", tarfile.BLKTYPE)], "disk", "device file or FIFO"),
    ],
    ids=["absolute", "dotdot", "nested-dotdot", "symlink-etc-passwd", "symlink-up",
         "nested-symlink-up", "hardlink-up", "hardlink-absolute", "fifo", "char-device",
         "block-device"],
)
def test_a_dangerous_member_is_refused_by_name(
    tmp_path: Path, members: list[Member], named: str, words: str
) -> None:
    message = rejected(tmp_path, members)
    assert repr(named) in message
    assert words in message


def test_a_link_that_escapes_through_another_link_is_refused(tmp_path: Path) -> None:
    # Each link on its own stays inside, read as text; together they lead out of it.
    members: list[Member] = [
        special("deep", tarfile.DIRTYPE),
        special("deep/up", tarfile.SYMTYPE, ".."),
        special("escape", tarfile.SYMTYPE, "deep/up/.."),
        regular("escape/outside", b"written outside"),
    ]
    message = rejected(tmp_path, members)
    assert "escape" in message


def test_a_tar_bomb_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    members: list[Member] = [regular("small.txt", b"s" * 100), regular("big.bin", b"\0" * 5000)]
    message = rejected(tmp_path, members, max_bytes=4096)
    assert "'big.bin'" in message
    assert "4096 bytes" in message


def test_a_non_tar_upload_is_refused(tmp_path: Path) -> None:
    archive = tmp_path / "context.tar.gz"
    archive.write_bytes(b"this is not a tar archive\n" * 100)
    dest = tmp_path / "out" / "context"
    with pytest.raises(InvalidRequest, match=r"not a readable tar\.gz archive"):
        extract_context(archive, dest)
    assert not dest.exists()


def test_a_truncated_archive_is_refused(tmp_path: Path) -> None:
    whole = build_archive(tmp_path / "whole.tar.gz", [regular("a.py", bytes(range(256)) * 400)])
    archive = tmp_path / "context.tar.gz"
    archive.write_bytes(whole.read_bytes()[:200])
    with pytest.raises(InvalidRequest, match=r"not a readable tar\.gz archive"):
        extract_context(archive, tmp_path / "out" / "context")
    assert not (tmp_path / "out" / "context").exists()


def test_a_good_archive_with_nested_dirs_and_inner_links_extracts(tmp_path: Path) -> None:
    members: list[Member] = [
        special(".", tarfile.DIRTYPE),
        special("./pkg", tarfile.DIRTYPE),
        special("./pkg/sub", tarfile.DIRTYPE),
        regular("./pkg/sub/model.py", b"MODEL = 1\n"),
        regular("./train.py", b"print('train')\n"),
        special("./pkg/model_link.py", tarfile.SYMTYPE, "sub/model.py"),
        special("./pkg/sub/train_link.py", tarfile.SYMTYPE, "../../train.py"),
        special("./train_copy.py", tarfile.LNKTYPE, "./train.py"),
    ]
    archive = build_archive(tmp_path / "context.tar.gz", members)
    dest = tmp_path / "out" / "context"
    assert extract_context(archive, dest) == 3
    assert (dest / "pkg" / "sub" / "model.py").read_bytes() == b"MODEL = 1\n"
    link = dest / "pkg" / "model_link.py"
    assert link.is_symlink() and link.read_bytes() == b"MODEL = 1\n"
    assert (dest / "pkg" / "sub" / "train_link.py").read_bytes() == b"print('train')\n"
    assert (dest / "train_copy.py").read_bytes() == b"print('train')\n"


def test_a_bad_archive_is_a_400_and_stores_nothing(
    server: RunningServer, client: Client, tmp_path: Path
) -> None:
    archive = build_archive(tmp_path / "context.tar.gz", [
        regular("train.py"),
        special("deep", tarfile.DIRTYPE),
        special("deep/up", tarfile.SYMTYPE, ".."),
        special("escape", tarfile.SYMTYPE, "deep/up/.."),
    ])
    token = (server.home / "token").read_text().strip()
    stored = stored_state(client, server)
    for upload in (archive.read_bytes(), b"not a tar at all"):
        response = httpx.post(
            f"{server.url}/api/v1/experiments",
            data={"config": config_text(["python", "train.py"])},
            files={"context": ("context.tar.gz", upload, "application/gzip")},
            headers={"Authorization": f"Bearer {token}"},
        )
        assert response.status_code == 400, response.text
        body = response.json()
        assert body["error"] == "InvalidRequest" and "context" in body["message"]
        assert "Traceback" not in response.text
    assert stored_state(client, server) == stored


def stored_state(client: Client, server: RunningServer) -> tuple[object, ...]:
    """Everything a created experiment leaves: rows, context snapshots, run directories."""
    home = server.home
    return (client.list_experiments(), sorted((home / "experiments").iterdir()),
            sorted((home / "runs").iterdir()))
