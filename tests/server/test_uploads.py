"""Context uploads against hostile clients: safe extraction and its limits on real archives
built here, and the upload route's limits on a real server (a bare socket where a test
must see when the server answers)."""

from __future__ import annotations

import gzip
import io
import itertools
import json
import posixpath
import select
import socket
import stat
import tarfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from muster.client import Client
from muster.errors import InvalidRequest, PayloadTooLarge
from muster.server.upload_form import MAX_REQUEST_BYTES, MAX_URLENCODED_BYTES
from muster.services.uploads import (
    MAX_EXTRACTED_BYTES,
    MAX_LINK_HOPS,
    MAX_MEMBERS,
    MAX_UPLOAD_BYTES,
    extract_context,
)
from tests.server.experiments import config_text
from tests.servers import RunningServer, shared_server

pytestmark = pytest.mark.lifecycle  # starts real processes

Member = tuple[str, bytes] | tarfile.TarInfo
MiB = 1024**2


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
    assert extract_context(archive, dest) == 5  # the links are copies now
    assert (dest / "pkg" / "sub" / "model.py").read_bytes() == b"MODEL = 1\n"
    link = dest / "pkg" / "model_link.py"
    assert not link.is_symlink() and link.read_bytes() == b"MODEL = 1\n"
    assert (dest / "pkg" / "sub" / "train_link.py").read_bytes() == b"print('train')\n"
    assert (dest / "train_copy.py").read_bytes() == b"print('train')\n"
    assert not any(path.is_symlink() for path in dest.rglob("*"))


def test_a_bad_archive_is_a_400_and_stores_nothing(
    server: RunningServer, client: Client, tmp_path: Path
) -> None:
    archive = build_archive(tmp_path / "context.tar.gz", [
        regular("train.py"),
        special("deep", tarfile.DIRTYPE),
        special("deep/up", tarfile.SYMTYPE, ".."),
        special("escape", tarfile.SYMTYPE, "deep/up/.."),
    ])
    token = server.token
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



# Limits against hostile clients: what an archive may cost the server, and links.

def gzip_bomb(path: Path, mib: int, broken_after: int | None = None) -> Path:
    """A tar.gz of one file of `mib` MiB of zeros, written a MiB at a time as concatenated
    gzip members (gzip reads them as one stream), each the same compressed MiB: about 1 KiB
    on disk per MiB unpacked. With `broken_after`, bytes that are not gzip follow that many
    MiB of the file: whoever reads the archive through to its end fails there."""
    info = tarfile.TarInfo("zeros.bin")
    info.size, info.mode = mib * MiB, 0o644
    compressed_mib = gzip.compress(bytes(MiB))
    with path.open("wb") as out:
        out.write(gzip.compress(info.tobuf(format=tarfile.GNU_FORMAT)))
        for _ in range(mib if broken_after is None else broken_after):
            out.write(compressed_mib)
        out.write(gzip.compress(bytes(2 * tarfile.BLOCKSIZE)) if broken_after is None
                  else b"not gzip" * 64)
    return path


def refusal(tmp_path: Path, archive: Path, **limits: Any) -> str:
    """Extract `archive`, which must be refused as too large; returns the message."""
    dest = tmp_path / "out" / "context"
    with pytest.raises(PayloadTooLarge) as info:
        extract_context(archive, dest, **limits)
    assert not dest.exists(), "a refused archive must leave nothing behind"
    return str(info.value)


@pytest.mark.parametrize("mode", ["w:bz2", "w:xz", "w"], ids=["bzip2", "xz", "bare-tar"])
def test_only_a_gzip_archive_is_unpacked(tmp_path: Path, mode: str) -> None:
    archive = tmp_path / "context.tar.gz"
    with tarfile.open(archive, mode) as tar:
        info = tarfile.TarInfo("zeros.bin")
        info.size = 4 * MiB
        tar.addfile(info, io.BytesIO(bytes(info.size)))
    dest = tmp_path / "out" / "context"
    with pytest.raises(InvalidRequest, match=r"must be a tar\.gz archive \(gzip\)"):
        extract_context(archive, dest)
    assert not dest.exists()


def test_a_gzip_bomb_is_refused_at_the_limit_before_the_rest_is_read(tmp_path: Path) -> None:
    archive = gzip_bomb(tmp_path / "context.tar.gz", 8, broken_after=4)
    message = refusal(tmp_path, archive, max_bytes=MiB)
    assert "expands to more than 1 MiB" in message and "'zeros.bin'" in message
    assert "keep data sets and environments out of the context directory" in message


def test_header_bytes_count_not_only_the_sizes_headers_claim(tmp_path: Path) -> None:
    # Four one-byte files, each behind a 100 KiB pax record: 4 bytes claimed, 400 KiB unpacked.
    archive = tmp_path / "context.tar.gz"
    with tarfile.open(archive, "w:gz", format=tarfile.PAX_FORMAT) as tar:
        for n in range(4):
            info = tarfile.TarInfo(f"f{n}.txt")
            info.size, info.pax_headers = 1, {"comment": "x" * (100 * 1024)}
            tar.addfile(info, io.BytesIO(b"x"))
    assert "expands to more than 262144 bytes" in refusal(tmp_path, archive,
                                                          max_bytes=256 * 1024)


def test_a_header_too_big_to_hold_is_refused_before_it_is_read_whole(tmp_path: Path) -> None:
    archive = tmp_path / "context.tar.gz"
    with tarfile.open(archive, "w:gz", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo("train.py")
        info.pax_headers = {"comment": "x" * (4 * MiB)}
        tar.addfile(info, io.BytesIO(b""))
    assert "more than 1 MiB of headers" in refusal(tmp_path, archive)


def test_more_members_than_the_cap_are_refused(tmp_path: Path) -> None:
    archive = build_archive(tmp_path / "context.tar.gz",
                            [regular(f"f{n}", b"") for n in range(MAX_MEMBERS + 1)])
    message = refusal(tmp_path, archive)
    assert f"more than {MAX_MEMBERS} members" in message
    assert "keep data sets and environments out of the context directory" in message


def test_an_extraction_past_its_deadline_is_refused(tmp_path: Path) -> None:
    archive = build_archive(tmp_path / "context.tar.gz", [regular("train.py")])
    assert "took more than 0 s to extract" in refusal(tmp_path, archive, timeout_s=0)


def test_links_to_files_become_copies_resolved_by_name_in_the_archive(tmp_path: Path) -> None:
    members: list[Member] = [
        special("early.py", tarfile.SYMTYPE, "pkg/model.py"),  # before what it names
        regular("pkg/model.py", b"MODEL = 1\n"),
        special("pkg/again.py", tarfile.SYMTYPE, "../early.py"),  # a link to a link
        special("hard.py", tarfile.LNKTYPE, "pkg/again.py"),  # a hard link to that
    ]
    dest = tmp_path / "out" / "context"
    assert extract_context(build_archive(tmp_path / "context.tar.gz", members), dest) == 4
    for name in ("early.py", "pkg/again.py", "hard.py"):
        copy = dest / name
        assert not copy.is_symlink() and copy.read_bytes() == b"MODEL = 1\n"
        assert copy.stat().st_ino != (dest / "pkg" / "model.py").stat().st_ino


@pytest.mark.parametrize(
    ("members", "named", "words"),
    [
        ([special("pkg", tarfile.DIRTYPE), special("lib", tarfile.SYMTYPE, "pkg")], "lib",
         "a directory"),
        ([special("here", tarfile.SYMTYPE, ".")], "here", "a directory"),
        ([special("gone.py", tarfile.SYMTYPE, "missing.py")], "gone.py", "not in the archive"),
        ([special("hard.py", tarfile.LNKTYPE, "missing.py")], "hard.py", "not in the archive"),
        ([special("a", tarfile.SYMTYPE, "b"), special("b", tarfile.SYMTYPE, "a")], "a",
         f"more than {MAX_LINK_HOPS} links"),
        ([regular("x.py"), special("twice.py", tarfile.SYMTYPE, "x.py"),
          regular("twice.py", b"written through the link")], "twice.py", "appears twice"),
    ],
    ids=["to-a-directory", "to-itself-dir", "to-a-missing-file", "hard-to-a-missing-file",
         "a-loop", "a-file-over-a-link"],
)
def test_a_link_that_leads_to_no_file_is_refused(
    tmp_path: Path, members: list[Member], named: str, words: str
) -> None:
    message = rejected(tmp_path, members)
    assert repr(named) in message
    assert words in message


def test_files_keep_their_exec_bit_and_lose_special_and_shared_write_bits(
    tmp_path: Path,
) -> None:
    archive = tmp_path / "context.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        for name, mode in (("run.sh", 0o6777), ("data.txt", 0o1666)):
            info = tarfile.TarInfo(name)
            info.size, info.mode = 2, mode
            tar.addfile(info, io.BytesIO(b"x\n"))
    dest = tmp_path / "out" / "context"
    extract_context(archive, dest)
    script, data = (stat.S_IMODE((dest / name).stat().st_mode) for name in ("run.sh", "data.txt"))
    assert script & stat.S_IXUSR and not script & ~0o755
    assert not data & ~0o644


def cve_2025_4517_members(victim: str, created: str) -> list[Member]:
    """After the published proof of concept of CVE-2025-4517: directories nested near
    PATH_MAX, a chain of symlinks through them that os.path.realpath() stops expanding, a
    link out of the destination through it (`escape`, two levels up), then a hard link to
    the file `victim` outside, a file written over that hard link, and one through `escape`."""
    component, steps = "d" * 247, "abcdefghijklmnop"
    members: list[Member] = []
    path = ""
    for step in steps:
        members.append(special(posixpath.join(path, component), tarfile.DIRTYPE))
        members.append(special(posixpath.join(path, step), tarfile.SYMTYPE, component))
        path = posixpath.join(path, component)
    top = posixpath.join(*steps, "l" * 254)
    members += [
        special(top, tarfile.SYMTYPE, "../" * len(steps)),
        special("escape", tarfile.SYMTYPE, top + "/../.."),
        special("victimlink", tarfile.LNKTYPE, f"escape/{victim}"),
        regular("victimlink", b"overwritten\n"),
        regular(f"escape/{created}", b"created outside\n"),
    ]
    return members


def test_the_cve_2025_4517_link_chain_writes_nothing_outside(tmp_path: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_bytes(b"original\n")
    archive = build_archive(tmp_path / "context.tar.gz",
                            cve_2025_4517_members("victim.txt", "created.txt"))
    dest = tmp_path / "out" / "context"
    with pytest.raises(InvalidRequest, match="which is a link, not a directory"):
        extract_context(archive, dest)
    assert victim.read_bytes() == b"original\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["context.tar.gz", "out", "victim.txt"]
    assert not dest.exists()


# Over HTTP: the body is read only after the token, and only up to its limit.

ANSWER_TIMEOUT = 60  # generous: an answer that waits for the whole body never comes here


def raw_post(server: RunningServer, headers: dict[str, str], body: Iterable[bytes]
             ) -> tuple[int, dict[str, Any], int]:
    """POST /experiments on a bare socket: the headers, then `body` chunk by chunk until the
    server answers. Its status, its JSON body, and how many body bytes were sent by then.
    (Unlike httpx, a socket can stop sending once the answer has come.)"""
    lines = "".join(f"{key}: {value}\r\n" for key, value in headers.items())
    with socket.create_connection(("127.0.0.1", server.port), timeout=ANSWER_TIMEOUT) as sock:
        sock.sendall(f"POST /api/v1/experiments HTTP/1.1\r\nHost: muster\r\n{lines}\r\n"
                     .encode())
        sent = 0
        for chunk in body:
            if select.select([sock], [], [], 0)[0]:
                break  # it has answered
            sock.sendall(chunk)
            sent += len(chunk)
        return (*read_answer(sock), sent)


def read_answer(sock: socket.socket) -> tuple[int, dict[str, Any]]:
    data = b""
    while b"\r\n\r\n" not in data:
        data += receive(sock)
    head, _, body = data.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    length = next(int(line.split(":", 1)[1]) for line in header_lines
                  if line.lower().startswith("content-length:"))
    while len(body) < length:
        body += receive(sock)
    return int(status_line.split()[1]), json.loads(body[:length])


def receive(sock: socket.socket) -> bytes:
    data = sock.recv(65536)
    if not data:
        raise AssertionError("the server closed the connection without answering")
    return data


def chunked(pieces: Iterable[bytes]) -> Iterator[bytes]:
    """`pieces` in HTTP/1.1 chunked transfer encoding (never ended: the test stops first)."""
    for piece in pieces:
        yield b"%x\r\n%s\r\n" % (len(piece), piece)


def form_part(name: str, filename: str | None = None) -> bytes:
    disposition = f'form-data; name="{name}"' + (f'; filename="{filename}"' if filename else "")
    return f"--{BOUNDARY}\r\nContent-Disposition: {disposition}\r\n\r\n".encode()


BOUNDARY = "muster-test-boundary"
FORM = f"multipart/form-data; boundary={BOUNDARY}"


def bearer(server: RunningServer) -> dict[str, str]:
    return {"Authorization": f"Bearer {server.token}"}


def test_an_anonymous_upload_is_refused_before_its_body_is_sent(
    server: RunningServer, client: Client
) -> None:
    stored = stored_state(client, server)
    part = form_part("context", "context.tar.gz")  # then 64 MiB of it: a well-formed start
    announced = len(part) + 64 * MiB
    status, body, sent = raw_post(
        server, {"Content-Type": FORM, "Content-Length": str(announced)},
        itertools.chain([part], itertools.repeat(bytes(MiB), 64)))
    assert (status, body["error"]) == (401, "Unauthorized"), body
    # The answer came while most of the body was unsent: none of it was read or spooled.
    assert sent < announced
    assert stored_state(client, server) == stored


def test_an_upload_announced_over_the_limit_is_refused_unread(server: RunningServer) -> None:
    status, body, _ = raw_post(
        server, {**bearer(server), "Content-Type": FORM,
                 "Content-Length": str(MAX_REQUEST_BYTES + 1)}, [])
    assert (status, body["error"]) == (413, "PayloadTooLarge"), body
    assert f"larger than {MAX_REQUEST_BYTES // MiB} MiB" in body["message"]
    assert "keep data sets and environments out of the context directory" in body["message"]


def test_an_upload_without_a_length_is_cut_off_at_the_limit(
    server: RunningServer, client: Client
) -> None:
    stored = stored_state(client, server)
    total = MAX_UPLOAD_BYTES + 64 * MiB
    status, body, sent = raw_post(
        server, {**bearer(server), "Content-Type": FORM, "Transfer-Encoding": "chunked"},
        chunked(itertools.chain([form_part("context", "context.tar.gz")],
                                itertools.repeat(bytes(MiB), total // MiB))))
    assert (status, body["error"]) == (413, "PayloadTooLarge"), body
    assert f"larger than {MAX_UPLOAD_BYTES // MiB} MiB" in body["message"]
    assert sent < total  # it stopped reading at the limit, not at the end
    assert stored_state(client, server) == stored


def test_a_gzip_bomb_upload_is_a_413_and_stores_nothing(
    server: RunningServer, client: Client, tmp_path: Path
) -> None:
    # Over the real limit, and broken past it: a server that read on would fail there.
    limit = MAX_EXTRACTED_BYTES // MiB
    bomb = gzip_bomb(tmp_path / "bomb.tar.gz", limit + 64, broken_after=limit + 32)
    assert bomb.stat().st_size < 2 * MiB
    stored = stored_state(client, server)
    response = httpx.post(
        f"{server.url}/api/v1/experiments", headers=bearer(server), timeout=ANSWER_TIMEOUT,
        data={"config": config_text(["python", "train.py"])},
        files={"context": ("context.tar.gz", bomb.read_bytes(), "application/gzip")})
    assert response.status_code == 413, response.text
    body = response.json()
    assert body["error"] == "PayloadTooLarge" and "'zeros.bin'" in body["message"]
    assert f"expands to more than {MAX_EXTRACTED_BYTES // MiB} MiB" in body["message"]
    assert stored_state(client, server) == stored


CONFIG_PART = form_part("config") + config_text(["python", "train.py"]).encode() + b"\r\n"
SECRETS_PART = form_part("secrets") + b"{}\r\n"
END = f"--{BOUNDARY}--\r\n".encode()


@pytest.mark.parametrize(
    ("content_type", "body", "words"),
    [
        (FORM, form_part("config") + b"#" * (MiB + 1) + b"\r\n" + END,
         "the `config` field is larger than 1 MiB"),
        ("application/x-www-form-urlencoded", b"config=" + b"%23" * (MiB + 1),
         "the `config` field is larger than 1 MiB"),
        ("application/x-www-form-urlencoded", b"config=" + b"a" * (MAX_URLENCODED_BYTES + 1),
         f"the request is larger than {MAX_URLENCODED_BYTES // MiB} MiB"),
    ],
    ids=["multipart", "urlencoded", "urlencoded-body"],
)
def test_a_config_over_its_limit_is_a_413(
    server: RunningServer, content_type: str, body: bytes, words: str
) -> None:
    response = httpx.post(f"{server.url}/api/v1/experiments", content=body,
                          headers={**bearer(server), "Content-Type": content_type})
    assert response.status_code == 413, response.text
    assert response.json()["error"] == "PayloadTooLarge" and words in response.json()["message"]


@pytest.mark.parametrize(
    ("content_type", "body", "status", "words"),
    [
        ("application/json", b'{"config": "name: x"}', 400, "not a form"),
        ("multipart/form-data", CONFIG_PART + END, 400, "has no boundary"),
        (FORM, form_part("context", "c.tar.gz") + b"x\r\n" + END, 422, "body.config"),
        (FORM, CONFIG_PART, 400, "ends before its closing boundary"),
        (FORM, CONFIG_PART + SECRETS_PART + SECRETS_PART + END, 400,
         "the field `secrets` twice"),
        (FORM, b"this is no multipart form\r\n", 400, "not a readable multipart form"),
        ("application/x-www-form-urlencoded", b"config=a&secrets=%7B%7D&secrets=%7B%7D", 400,
         "`secrets` twice"),
        ("application/x-www-form-urlencoded", b"config=%ff", 400, "not a readable urlencoded"),
        ("application/x-www-form-urlencoded", b"name=x", 422, "body.config"),
    ],
    ids=["json", "no-boundary", "no-config", "cut-off", "secrets-twice", "garbage",
         "urlencoded-secrets-twice", "urlencoded-not-utf8", "urlencoded-no-config"],
)
def test_a_malformed_form_is_a_4xx_that_says_what_to_send(
    server: RunningServer, content_type: str, body: bytes, status: int, words: str
) -> None:
    response = httpx.post(f"{server.url}/api/v1/experiments", content=body,
                          headers={**bearer(server), "Content-Type": content_type})
    assert response.status_code == status, response.text
    answer = response.json()
    assert answer["error"] == "InvalidRequest" and words in answer["message"]
    assert "multipart/form-data with the fields `config` and `context`" in answer["message"]
    assert "Traceback" not in response.text


def test_the_openapi_document_describes_the_upload_form(server: RunningServer) -> None:
    spec = httpx.get(f"{server.url}/openapi.json").json()
    operation = spec["paths"]["/api/v1/experiments"]["post"]
    schema = operation["requestBody"]["content"]["multipart/form-data"]["schema"]
    assert schema["required"] == ["config"]
    assert schema["properties"]["config"]["type"] == "string"
    assert schema["properties"]["context"] == {**schema["properties"]["context"],
                                               "type": "string", "format": "binary"}
    assert {"400", "401", "413", "422"} <= set(operation["responses"])
    assert "application/x-www-form-urlencoded" in operation["requestBody"]["content"]
