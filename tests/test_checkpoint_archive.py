"""A checkpoint as a download (`muster.checkpoint_archive`): the plan's verdicts as a table,
the archive written from real files (and broken off when one changes), and unpacking that
keeps nothing it should not."""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
from pathlib import Path
from typing import Any

import pytest

from muster.checkpoint_archive import (
    ArchivePlan,
    CheckpointFolder,
    FoundFile,
    Registered,
    archive_chunks,
    plan_archive,
    unpack_checkpoint,
)
from muster.errors import Conflict, InvalidRequest, ServerError

NAME = "step-000000000003-0badcafe"


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def files_under(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes()
            for p in sorted(folder.rglob("*")) if p.is_file()}


# -- the plan -------------------------------------------------------------------------------

FILES = {"model.bin": sha(b"weights")}
METADATA = json.dumps({"step": 3, "files": FILES}).encode()
ON_DISK = {"metadata.json": FoundFile(len(METADATA), 1, True), "model.bin": FoundFile(7, 2, True)}
AS_REGISTERED = Registered(2, len(METADATA) + 7)


@pytest.mark.parametrize(("metadata", "found", "registered", "problem"), [
    (METADATA, ON_DISK, AS_REGISTERED, None),
    (b"{not json", ON_DISK, AS_REGISTERED, "metadata.json is no longer valid JSON"),
    (b"[]", ON_DISK, AS_REGISTERED, 'no longer has a "files" object'),
    (json.dumps({"files": {"a": 1}}).encode(), ON_DISK, AS_REGISTERED, 'no longer has a "files"'),
    (json.dumps({"files": {"../x": "0"}}).encode(), ON_DISK, AS_REGISTERED,
     "lists '../x', which is not a path inside"),
    (json.dumps({"files": {"/etc/x": "0"}}).encode(), ON_DISK, AS_REGISTERED,
     "lists '/etc/x'"),
    (METADATA, {"metadata.json": ON_DISK["metadata.json"]}, AS_REGISTERED, "model.bin is missing"),
    (METADATA, {**ON_DISK, "model.bin": FoundFile(7, 2, False)}, AS_REGISTERED,
     "model.bin is not a regular file"),
    (METADATA, {**ON_DISK, "model.bin": FoundFile(8, 2, True)}, AS_REGISTERED,
     f"it holds 2 files of {len(METADATA) + 8:,} bytes, not the 2 files of"),
    (METADATA, {**ON_DISK, "extra": FoundFile(0, 2, True)}, AS_REGISTERED, "it holds 3 files"),
], ids=["intact", "not-json", "not-an-object", "a-digest-not-a-string", "dotdot", "absolute",
        "missing", "not-regular", "grown", "added"])
def test_the_plan_sends_only_what_still_matches(
    metadata: bytes, found: dict[str, FoundFile], registered: Registered, problem: str | None
) -> None:
    if problem is None:
        plan = plan_archive(NAME, metadata, found, registered)
        assert [(m.relative, m.size, m.sha256) for m in plan.members] == [
            ("metadata.json", len(METADATA), None), ("model.bin", 7, FILES["model.bin"])]
    else:
        with pytest.raises(Conflict) as refused:
            plan_archive(NAME, metadata, found, registered)
        assert problem in str(refused.value)


# -- writing from real files ----------------------------------------------------------------


def make_checkpoint(folder: Path, files: dict[str, bytes]) -> Registered:
    """A checkpoint directory as the harness leaves it; what registration would count."""
    for path, data in files.items():
        (folder / path).parent.mkdir(parents=True, exist_ok=True)
        (folder / path).write_bytes(data)
    metadata = json.dumps({"step": 3, "files": {p: sha(d) for p, d in files.items()}}).encode()
    (folder / "metadata.json").write_bytes(metadata)
    return Registered(len(files) + 1, sum(map(len, files.values())) + len(metadata))


def planned(folder: Path, registered: Registered) -> tuple[ArchivePlan, CheckpointFolder]:
    opened = CheckpointFolder(folder)
    return plan_archive(NAME, opened.read("metadata.json"), opened.files(), registered), opened


SAVED = {"model.bin": bytes(range(256)) * 9_000 + b"!", "sub/dir/opt.bin": b"x" * 513,
         "empty": b"", "long-" + "n" * 150 + ".bin": b"a long name"}


def test_the_archive_is_the_planned_size_and_holds_each_file(tmp_path: Path) -> None:
    plan, folder = planned(tmp_path, make_checkpoint(tmp_path, SAVED))
    chunks = list(archive_chunks(plan, folder))
    folder.close()
    data = b"".join(chunks)
    assert len(data) == plan.size and max(map(len, chunks)) <= 2 * 1024**2
    read = {}
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as archive:
        for member in archive:
            source = archive.extractfile(member)
            assert member.isreg() and member.mode == 0o644 and source is not None
            read[member.name] = source.read()
    assert list(read) == [f"{NAME}/{p}" for p in ["metadata.json", *sorted(SAVED)]]
    assert read == {f"{NAME}/{p}": d for p, d in files_under(tmp_path).items()}


def test_a_file_changed_after_the_plan_breaks_the_archive_before_its_last_piece(
    tmp_path: Path
) -> None:
    plan, folder = planned(tmp_path, make_checkpoint(tmp_path, SAVED))
    changed = bytearray(SAVED["model.bin"])
    changed[5] ^= 1  # in its first piece: the rest of it is sent, its last piece is not
    (tmp_path / "model.bin").write_bytes(bytes(changed))
    sent = bytearray()
    with pytest.raises(Conflict, match=r"model\.bin no longer matches its sha256"):
        for chunk in archive_chunks(plan, folder):
            sent += chunk
    folder.close()
    assert bytes(changed) not in sent and len(sent) < plan.size


@pytest.mark.parametrize("swap", ["file", "folder"])
def test_a_link_put_in_a_files_place_is_not_followed(tmp_path: Path, swap: str) -> None:
    checkpoint = tmp_path / "ckpt"
    checkpoint.mkdir()
    plan, folder = planned(checkpoint, make_checkpoint(checkpoint, SAVED))
    secret = tmp_path / "secret"
    (secret / "dir").mkdir(parents=True)
    (secret / "dir" / "opt.bin").write_bytes(b"x" * 513)  # the same bytes: only a link tells
    if swap == "file":
        (checkpoint / "sub" / "dir" / "opt.bin").unlink()
        (checkpoint / "sub" / "dir" / "opt.bin").symlink_to(secret / "dir" / "opt.bin")
    else:
        (checkpoint / "sub" / "dir" / "opt.bin").unlink()
        (checkpoint / "sub" / "dir").rmdir()
        (checkpoint / "sub" / "dir").symlink_to(secret / "dir")
    with pytest.raises(Conflict, match=r"sub/dir/opt\.bin cannot be read"):
        b"".join(archive_chunks(plan, folder))
    folder.close()


def test_a_checkpoint_directory_that_is_a_link_is_not_opened(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    with pytest.raises(OSError):
        CheckpointFolder(tmp_path / "link")


# -- unpacking what arrives -----------------------------------------------------------------
def regular(name: str, data: bytes) -> tuple[tarfile.TarInfo, bytes | None]:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    return info, data


def special(name: str, kind: bytes, target: str = "") -> tuple[tarfile.TarInfo, bytes | None]:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, target
    return info, None


def archive(*members: tuple[tarfile.TarInfo, bytes | None]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return buffer.getvalue()


def checkpoint_members(files: dict[str, bytes]) -> list[tuple[tarfile.TarInfo, bytes | None]]:
    """A checkpoint's metadata.json and files as archive members, all intact."""
    metadata = json.dumps({"step": 3, "files": {
        path: hashlib.sha256(data).hexdigest() for path, data in files.items()}}).encode()
    return [regular(f"{NAME}/metadata.json", metadata),
            *(regular(f"{NAME}/{path}", data) for path, data in files.items())]


def test_an_intact_archive_unpacks_into_a_new_directory(tmp_path: Path) -> None:
    files = {"model.bin": os.urandom(3 * 1024**2 + 1), "sub/dir/opt.bin": b"x" * 513}
    data = archive(*checkpoint_members(files))
    pieces = [data[i:i + 1000] for i in range(0, len(data), 1000)]  # as a network delivers
    found = unpack_checkpoint(pieces, tmp_path / "new" / "ckpt", NAME, trial_id=None)
    assert found.intact and found.path == tmp_path / "new" / "ckpt" and found.step == 3
    assert {k: v for k, v in files_under(found.path).items() if k != "metadata.json"} == files
    assert sorted(p.name for p in (tmp_path / "new").iterdir()) == ["ckpt"]


@pytest.mark.parametrize(("members", "words"), [
    ([regular(f"{NAME}/../evil", b"x")], "not a path inside"),
    ([regular(f"{NAME}/a/../../evil", b"x")], "not a path inside"),
    ([regular("/etc/evil", b"x")], "not a path inside"),
    ([regular("other/evil", b"x")], "not a path inside"),
    ([regular(f"{NAME}//evil", b"x")], "not a path inside"),
    ([special(f"{NAME}/link", tarfile.SYMTYPE, "/etc/passwd")], "not a regular file"),
    ([special(f"{NAME}/hard", tarfile.LNKTYPE, f"{NAME}/metadata.json")],
     "not a regular file"),
    ([special(f"{NAME}/dev", tarfile.CHRTYPE)], "not a regular file"),
    ([special(f"{NAME}/sub", tarfile.DIRTYPE)], "not a regular file"),
    ([regular(f"{NAME}/model.bin", b"again")], "gives 'model.bin' twice"),
    ([regular(f"{NAME}/model.bin/under", b"x")], "under a file's name"),
    ([regular(f"{NAME}/extra.bin", b"x")], "extra.bin is not listed in metadata.json"),
], ids=["dotdot", "dotdot-inside", "absolute", "other-folder", "empty-part", "symlink",
        "hardlink", "device", "directory", "twice", "under-a-file", "unlisted"])
def test_an_archive_that_escapes_or_adds_is_refused_and_nothing_is_kept(
    tmp_path: Path, members: list[tuple[tarfile.TarInfo, bytes | None]], words: str
) -> None:
    data = archive(*checkpoint_members({"model.bin": b"weights"}), *members)
    with pytest.raises(ServerError, match="nothing was kept") as refused:
        unpack_checkpoint([data], tmp_path / "ckpt", NAME)
    assert words in str(refused.value)
    assert list(tmp_path.iterdir()) == []
    assert not (tmp_path.parent / "evil").exists()


def test_a_changed_or_cut_archive_is_refused_and_nothing_is_kept(tmp_path: Path) -> None:
    metadata = checkpoint_members({"model.bin": b"weights"})[0]
    changed = archive(metadata, regular(f"{NAME}/model.bin", b"WEIGHTS"))
    with pytest.raises(ServerError, match=r"model\.bin does not match its sha256"):
        unpack_checkpoint([changed], tmp_path / "ckpt", NAME)
    whole = archive(metadata, regular(f"{NAME}/model.bin", b"weights"))
    data_at = whole.index(b"weights")
    with pytest.raises(ServerError, match="not a complete tar"):
        unpack_checkpoint([whole[:data_at + 3]], tmp_path / "ckpt", NAME)
    with pytest.raises(ServerError, match=r"model\.bin is missing"):
        unpack_checkpoint([whole[:data_at - 400]], tmp_path / "ckpt", NAME)
    assert list(tmp_path.iterdir()) == []


def test_a_checkpoint_of_another_trial_is_refused(tmp_path: Path) -> None:
    metadata = json.dumps({"step": 3, "trial_id": 8, "files": {}}).encode()
    data = archive(regular(f"{NAME}/metadata.json", metadata))
    with pytest.raises(ServerError, match="names trial 8"):
        unpack_checkpoint([data], tmp_path / "ckpt", NAME, trial_id=9)
    assert list(tmp_path.iterdir()) == []


def test_a_target_in_the_way_is_refused_before_anything_is_read(tmp_path: Path) -> None:
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    (tmp_path / "link").symlink_to(tmp_path / "elsewhere")

    def never() -> Any:
        raise AssertionError("read the archive")
        yield b""

    for target in ("full", "link"):
        with pytest.raises(InvalidRequest, match="choose"):
            unpack_checkpoint(never(), tmp_path / target, NAME)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["full", "link"]
