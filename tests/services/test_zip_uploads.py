"""Zip contexts (what a browser's "compress folder" makes): extracted by the tar rules, with
the same limits, from real zip files made here (the hostile ones byte by byte)."""

from __future__ import annotations

import re
import stat
import struct
import zipfile
from pathlib import Path

import pytest

from muster.errors import InvalidRequest, PayloadTooLarge
from muster.services.uploads import extract_context

MiB = 1024**2


def zip_of(path: Path, members: dict[str, bytes], *, method: int = zipfile.ZIP_DEFLATED,
           modes: dict[str, int] | None = None) -> Path:
    with zipfile.ZipFile(path, "w", compression=method) as zipped:
        for name, data in members.items():
            info = zipfile.ZipInfo(name)
            info.compress_type = method
            info.external_attr = (modes or {}).get(name, 0o100644) << 16
            zipped.writestr(info, data)
    return path


def refused(tmp_path: Path, archive: Path, kind: type[Exception] = InvalidRequest,
            **limits: int) -> str:
    dest = tmp_path / "out" / "context"
    with pytest.raises(kind) as caught:
        extract_context(archive, dest, **limits)  # type: ignore[arg-type]
    assert not dest.exists(), "a refused archive leaves nothing behind"
    return str(caught.value)


def test_a_zip_extracts_with_its_folders_and_its_executables(tmp_path: Path) -> None:
    archive = zip_of(tmp_path / "c.zip", {"project/": b"", "project/train.py": b"print(1)\n",
                                          "project/run.sh": b"#!/bin/sh\n",
                                          "data/a/1.png": b"\x89PNG"},
                     modes={"project/": 0o040755, "project/run.sh": 0o100755})
    dest = tmp_path / "context"
    assert extract_context(archive, dest) == 3
    assert (dest / "project" / "train.py").read_text() == "print(1)\n"
    assert stat.S_IMODE((dest / "project" / "run.sh").stat().st_mode) == 0o755
    assert stat.S_IMODE((dest / "project" / "train.py").stat().st_mode) == 0o644
    assert (dest / "data" / "a" / "1.png").read_bytes() == b"\x89PNG"


@pytest.mark.parametrize(("name", "why"), [
    ("../escape.py", r"leaves the directory \(\.\.\)"),
    ("/etc/cron.d/x", "absolute path"),
    ("a/../../b", r"leaves the directory"),
])
def test_a_name_that_leaves_the_directory_is_refused(tmp_path: Path, name: str,
                                                     why: str) -> None:
    archive = zip_of(tmp_path / "c.zip", {"ok.py": b"1", name: b"2"})
    assert re.search(why, refused(tmp_path, archive))


def test_links_encrypted_and_other_methods_are_refused(tmp_path: Path) -> None:
    link = zip_of(tmp_path / "link.zip", {"passwd": b"/etc/passwd"},
                  modes={"passwd": 0o120777})
    assert "is a link; zip contexts keep files and directories only" in refused(
        tmp_path, link)
    bzip = zip_of(tmp_path / "bz.zip", {"a.txt": b"a" * 100}, method=zipfile.ZIP_BZIP2)
    assert "only stored and deflated members" in refused(tmp_path, bzip)
    encrypted = zip_of(tmp_path / "enc.zip", {"a.txt": b"secret"},
                       method=zipfile.ZIP_STORED)
    data = bytearray(encrypted.read_bytes())
    for header in (b"PK\x03\x04", b"PK\x01\x02"):  # set the "encrypted" flag bit in both
        at = data.find(header)
        flags_at = at + (6 if header == b"PK\x03\x04" else 8)
        data[flags_at] |= 0x1
    encrypted.write_bytes(bytes(data))
    assert "is encrypted" in refused(tmp_path, encrypted)


def test_a_name_twice_is_refused(tmp_path: Path) -> None:
    archive = tmp_path / "twice.zip"
    with pytest.warns(UserWarning), zipfile.ZipFile(archive, "w") as zipped:
        zipped.writestr("a.py", b"1")
        zipped.writestr("a.py", b"2")
    assert "appears twice" in refused(tmp_path, archive)


def test_a_zip_bomb_stops_at_the_byte_limit(tmp_path: Path) -> None:
    archive = tmp_path / "bomb.zip"
    with (zipfile.ZipFile(archive, "w", compression=zipfile.ZIP_DEFLATED) as zipped,
          zipped.open("zeros.bin", "w", force_zip64=True) as member):
        for _ in range(64):
            member.write(bytes(MiB))
    assert archive.stat().st_size < MiB
    # The claimed size (64 MiB) is over an 8 MiB limit before a byte is written; a member
    # whose header lies (claims little) is stopped as it inflates, by the same count.
    assert "expands to more than 8 MiB" in refused(tmp_path, archive, PayloadTooLarge,
                                                   max_bytes=8 * MiB)
    lying = bytearray(archive.read_bytes())
    at = lying.rfind(b"PK\x01\x02")  # the central directory's entry: its claimed size
    lying[at + 24:at + 28] = struct.pack("<I", 10)
    (tmp_path / "lying.zip").write_bytes(bytes(lying))
    message = refused(tmp_path, tmp_path / "lying.zip", InvalidRequest, max_bytes=8 * MiB)
    assert "zip" in message  # zipfile itself refuses a size that does not match


def test_more_entries_than_members_allowed_are_refused_before_reading(tmp_path: Path) -> None:
    archive = zip_of(tmp_path / "many.zip", {f"f{i}.txt": b"" for i in range(30)})
    assert "more than 20 members" in refused(tmp_path, archive, PayloadTooLarge,
                                             max_members=20)


def test_a_file_that_only_starts_like_a_zip_is_refused(tmp_path: Path) -> None:
    fake = tmp_path / "fake.zip"
    fake.write_bytes(b"PK\x03\x04" + bytes(100))
    assert "not a readable zip archive" in refused(tmp_path, fake)
