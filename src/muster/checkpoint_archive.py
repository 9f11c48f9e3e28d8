"""A checkpoint as one download: a tar of its files, written as they are read and checked
against metadata.json, and unpacked into a new directory that is judged like any checkpoint.

The archive is a plain tar (pax format, uncompressed; `trial-<id>-<name>.tar`): a checkpoint
is mostly tensors, which gzip barely shrinks at a high CPU cost, and a plain tar's length is
known before its first byte is written, so a download cut short is seen as broken by every
client. It holds `<name>/metadata.json` first, then `<name>/<path>` for each file that
metadata.json lists, sorted: regular files only, mode 0644. Anything else in the directory
(metadata.json does not vouch for it) is left out.

Writing (the server): `CheckpointFolder` holds the directory open and reads everything
through that descriptor, never through a link. `plan_archive` checks, before anything is
sent, what is on disk against metadata.json and against what registration counted (the
cheap check: which files, their sizes). `archive_chunks` hashes each file as it sends it
and holds back the file's last piece until its sha256 matches, so a file that changed
meanwhile ends the download short of its announced length, never as a complete archive.

Reading (the client): `unpack_checkpoint` extracts into a new directory beside the target,
taking only regular files under `<name>/` (no links, devices, absolute paths or `..`), judges
it with `checkpoint_files.inspect`, the one integrity rule, and gives it the target's name
only when it is intact.
"""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import io
import json
import os
import posixpath
import shutil
import stat
import tarfile
import zlib
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, BinaryIO

from muster.checkpoint_files import MAX_PROBLEMS_SHOWN, METADATA_FILE, Inspection, inspect
from muster.errors import Conflict, InvalidRequest, ServerError

__all__ = ["CHUNK_BYTES", "MEDIA_TYPE", "ArchivePlan", "CheckpointFolder", "FoundFile",
           "Member", "Registered", "archive_chunks", "archive_name", "check_target",
           "plan_archive", "rename_into_place", "unpack_checkpoint", "unpack_files"]

CHUNK_BYTES = 1024**2
MEDIA_TYPE = "application/x-tar"
_FILE_MODE = 0o644
_END_OF_ARCHIVE = bytes(2 * tarfile.BLOCKSIZE)
_OPEN_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_OPEN_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def archive_name(trial_id: int, name: str) -> str:
    """The file name a download of trial `trial_id`'s checkpoint `name` is saved as."""
    return f"trial-{trial_id}-{name}.tar"


# -- writing -------------------------------------------------------------------------------


@dataclass(frozen=True)
class FoundFile:
    """A file below a checkpoint directory (a link or other non-directory too), as lstat saw it."""

    size: int
    mtime: int
    regular: bool


@dataclass(frozen=True)
class Registered:
    """What registration counted in the directory: every file, metadata.json included."""

    file_count: int
    size_bytes: int


@dataclass(frozen=True)
class Member:
    """One file of the archive: its path in the checkpoint, and what it must hold."""

    relative: str
    size: int
    mtime: int
    sha256: str | None  # None for metadata.json: it is sent as it was read for the plan


@dataclass(frozen=True)
class ArchivePlan:
    """What one download sends: metadata.json's bytes, then each file it lists."""

    name: str
    metadata: bytes
    members: tuple[Member, ...]  # metadata.json first

    def header(self, member: Member) -> bytes:
        info = tarfile.TarInfo(f"{self.name}/{member.relative}")
        info.size, info.mtime, info.mode = member.size, member.mtime, _FILE_MODE
        return info.tobuf(tarfile.PAX_FORMAT)

    @property
    def size(self) -> int:
        """The archive's length in bytes."""
        members = sum(len(self.header(m)) + _padded(m.size) for m in self.members)
        return members + len(_END_OF_ARCHIVE)


class CheckpointFolder:
    """A checkpoint directory held open: whatever becomes of its name meanwhile, its files
    are read from this directory, and never through a link (under `run_as` the job owns
    it, and a link it plants must not make the server send another file)."""

    def __init__(self, path: Path) -> None:
        """Raises:
            OSError: `path` is missing, not a directory, or a link (ELOOP).
        """
        self.path = path
        self._fd = os.open(path, _OPEN_DIR)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def files(self) -> dict[str, FoundFile]:
        """Everything below the directory but directories, by relative POSIX path."""
        found: dict[str, FoundFile] = {}

        def fail(exc: OSError) -> None:
            raise exc

        for top, _dirs, names, top_fd in os.fwalk(".", onerror=fail, dir_fd=self._fd):
            for name in names:
                info = os.stat(name, dir_fd=top_fd, follow_symlinks=False)
                found[posixpath.normpath(posixpath.join(top, name))] = FoundFile(
                    info.st_size, int(info.st_mtime), stat.S_ISREG(info.st_mode))
        return found

    def read(self, relative: str) -> bytes:
        with self.open(relative) as stream:
            return stream.read()

    def open(self, relative: str) -> BinaryIO:
        """The regular file at `relative`, reached without following any link.

        Raises:
            OSError: it is missing, a link (ELOOP) or not a regular file (EINVAL).
        """
        *folders, name = relative.split("/")
        opened: list[int] = []
        try:
            parent = self._fd
            for folder in folders:
                parent = os.open(folder, _OPEN_DIR, dir_fd=parent)
                opened.append(parent)
            fd = os.open(name, _OPEN_FILE, dir_fd=parent)
        finally:
            for each in opened:
                os.close(each)
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise OSError(errno.EINVAL, "not a regular file", relative)
        return os.fdopen(fd, "rb", buffering=0)


def plan_archive(
    name: str, metadata: bytes, found: Mapping[str, FoundFile], registered: Registered
) -> ArchivePlan:
    """What to send for checkpoint `name`, once what is on disk (`found`, and metadata.json's
    bytes) is checked against metadata.json and what registration counted.

    Raises:
        Conflict: it no longer matches; the message says how.
    """
    listed, problems = _listed_files(metadata)
    problems += _file_problems(listed, found)
    problems += _count_problems(found, registered)
    if problems:
        more = len(problems) - MAX_PROBLEMS_SHOWN
        raise Conflict("; ".join(problems[:MAX_PROBLEMS_SHOWN])
                       + (f"; and {more} more" if more > 0 else ""))
    written = found.get(METADATA_FILE)
    members = [Member(METADATA_FILE, len(metadata), written.mtime if written else 0, None)]
    members += [Member(path, found[path].size, found[path].mtime, digest)
                for path, digest in sorted(listed.items())]
    return ArchivePlan(name, metadata, tuple(members))


def _listed_files(metadata: bytes) -> tuple[dict[str, str], list[str]]:
    """metadata.json's "files" (relative path → sha256), or the problem with it."""
    try:
        document = json.loads(metadata)
    except (ValueError, RecursionError) as exc:
        return {}, [f"{METADATA_FILE} is no longer valid JSON ({exc})"]
    files = document.get("files") if isinstance(document, dict) else None
    if not isinstance(files, dict) or not all(isinstance(v, str) for v in files.values()):
        return {}, [f'{METADATA_FILE} no longer has a "files" object of sha256 sums']
    if outside := sorted(path for path in files if not _is_plain_relative(path)):
        return {}, [f"{METADATA_FILE} lists {outside[0]!r}, which is not a path inside the "
                    "checkpoint directory"]
    return files, []


def _file_problems(listed: Mapping[str, str], found: Mapping[str, FoundFile]) -> list[str]:
    problems = []
    for path in sorted(listed):
        file = found.get(path)
        if file is None:
            problems.append(f"{path} is missing")
        elif not file.regular:
            problems.append(f"{path} is not a regular file")
    return problems


def _count_problems(found: Mapping[str, FoundFile], registered: Registered) -> list[str]:
    count, size = len(found), sum(f.size for f in found.values())
    if (count, size) == (registered.file_count, registered.size_bytes):
        return []
    return [f"it holds {count} files of {size:,} bytes, not the {registered.file_count} files "
            f"of {registered.size_bytes:,} bytes it held when it was registered"]


def archive_chunks(plan: ArchivePlan, folder: CheckpointFolder) -> Iterator[bytes]:
    """The archive of `plan`, `plan.size` bytes in chunks of about CHUNK_BYTES, each file
    read from `folder` and hashed as it goes.

    Raises:
        Conflict: a file no longer has its size or its sha256, or cannot be read: the
            archive stops before that file's last piece.
    """
    buffer = bytearray()
    for piece in _pieces(plan, folder):
        buffer += piece
        if len(buffer) >= CHUNK_BYTES:
            yield bytes(buffer)
            buffer.clear()
    yield bytes(buffer)


def _pieces(plan: ArchivePlan, folder: CheckpointFolder) -> Iterator[bytes]:
    for member in plan.members:
        yield plan.header(member)
        if member.sha256 is None:
            yield plan.metadata
        else:
            yield from _checked_file(folder, member, member.sha256)
        yield bytes(_padded(member.size) - member.size)
    yield _END_OF_ARCHIVE


def _checked_file(folder: CheckpointFolder, member: Member, sha256: str) -> Iterator[bytes]:
    """The file's `member.size` bytes; the last piece only once they match `sha256`."""
    digest, held, left = hashlib.sha256(), b"", member.size
    try:
        with folder.open(member.relative) as stream:
            while left:
                data = stream.read(min(CHUNK_BYTES, left))
                if not data:
                    raise Conflict(f"{member.relative} shrank to {member.size - left:,} bytes "
                                   f"while it was being sent ({member.size:,} before)")
                digest.update(data)
                left -= len(data)
                if held:
                    yield held
                held = data
    except OSError as exc:
        raise Conflict(f"{member.relative} cannot be read ({exc.strerror or exc})") from exc
    if digest.hexdigest() != sha256:
        raise Conflict(f"{member.relative} no longer matches its sha256 in {METADATA_FILE}: "
                       "it changed after the checkpoint was registered")
    yield held


def _padded(size: int) -> int:
    """`size` rounded up to whole tar blocks."""
    return -(-size // tarfile.BLOCKSIZE) * tarfile.BLOCKSIZE


def _is_plain_relative(path: str) -> bool:
    """A relative POSIX path without empty, `.` or `..` parts or NUL bytes."""
    return "\0" not in path and all(part not in ("", ".", "..") for part in path.split("/"))


# -- reading -------------------------------------------------------------------------------


def unpack_checkpoint(
    chunks: Iterable[bytes], dest: Path, name: str, trial_id: int | None = None,
    gzipped: bool = False,
) -> Inspection:
    """Unpack the archive of checkpoint `name` (a tar.gz when `gzipped`, its gzip trailer
    checked too) into `dest` and judge it: what `inspect` found there, intact. `dest` must
    not exist or be an empty directory; the files are extracted beside it and take its name
    only once every sha256 matches.

    Raises:
        InvalidRequest: `dest` is in the way (a file, or a directory with files in it).
        ServerError: the archive broke off or is malformed, or what it holds is not intact;
            nothing is left behind.
    """
    check_target(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    unpacking = dest.parent / f".{dest.name}.download-{os.urandom(4).hex()}"
    unpacking.mkdir()
    try:
        raw = _ChunkReader(iter(chunks))
        if gzipped:
            stream = _Gunzipped(raw, f"the archive of {name}")
            _extract(stream, unpacking, name)
            stream.check_whole()
        else:
            _extract(raw, unpacking, name)
        found = _judged(unpacking, name, trial_id)
        rename_into_place(unpacking, dest)
    except BaseException:
        shutil.rmtree(unpacking, ignore_errors=True)
        raise
    return dataclasses.replace(found, path=dest)


def unpack_files(chunks: Iterable[bytes], dest: Path, top: str, what: str) -> None:
    """Unpack a tar.gz of regular files under `top/` into `dest` (new, or an empty
    directory), by the rules `unpack_checkpoint` keeps: beside it first, no link, device,
    absolute path or `..` taken, and `dest` gets the files only once all arrived.

    Raises:
        InvalidRequest: `dest` is in the way (a file, or a directory with files in it).
        ServerError: the archive broke off or is malformed; nothing is left behind.
    """
    check_target(dest, "")
    dest.parent.mkdir(parents=True, exist_ok=True)
    unpacking = dest.parent / f".{dest.name}.download-{os.urandom(4).hex()}"
    unpacking.mkdir()
    try:
        stream = _Gunzipped(_ChunkReader(iter(chunks)), what)
        _extract(stream, unpacking, top, what)
        stream.check_whole()
        rename_into_place(unpacking, dest, what, "")
    except BaseException:
        shutil.rmtree(unpacking, ignore_errors=True)
        raise


def check_target(dest: Path, option: str = " with -o") -> None:
    if dest.is_symlink() or (dest.exists() and not dest.is_dir()):
        raise InvalidRequest(f"{dest} exists and is not a directory; choose another{option}")
    if dest.is_dir() and any(dest.iterdir()):
        raise InvalidRequest(f"{dest} is a directory with files in it; choose an empty or new "
                             f"one{option}")


def rename_into_place(unpacking: Path, dest: Path, what: str = "the checkpoint",
            option: str = " with -o") -> None:
    try:
        os.rename(unpacking, dest)  # over an empty directory too
    except OSError as exc:
        raise InvalidRequest(f"could not put {what} at {dest} ({exc.strerror or exc}); "
                             f"choose an empty or new directory{option}") from exc


def _extract(stream: io.RawIOBase, into: Path, name: str,
             what: str = "the checkpoint archive") -> None:
    """Each member's bytes into a new file below `into` (directories made here, no link
    ever written, so none is ever followed)."""
    try:
        with tarfile.open(fileobj=stream, mode="r|") as archive:
            for member in archive:
                relative = _member_path(member, name)
                source = archive.extractfile(member)
                if source is None:
                    raise ServerError(f"the archive's {member.name!r} has no data")
                with source:
                    _write_new(into, relative, source)
    except (tarfile.TarError, EOFError, zlib.error) as exc:
        raise ServerError(f"{what} is not a complete tar ({exc}); download it again"
                          ) from exc


def _member_path(member: tarfile.TarInfo, name: str) -> str:
    """The member's path inside the checkpoint, once it is a plain file under `name/`."""
    relative = member.name.removeprefix(f"{name}/")
    if relative == member.name or not _is_plain_relative(relative):
        raise ServerError(f"the archive holds {member.name!r}, which is not a path inside "
                          f"{name}/; nothing was kept")
    if not member.isreg() or member.issparse():
        raise ServerError(f"the archive's {member.name!r} is not a regular file; nothing was "
                          "kept")
    return relative


def _write_new(into: Path, relative: str, source: IO[bytes]) -> None:
    target = into.joinpath(*relative.split("/"))
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with os.fdopen(os.open(target, _CREATE, _FILE_MODE), "wb") as out:
            shutil.copyfileobj(source, out, CHUNK_BYTES)
    except (FileExistsError, NotADirectoryError) as exc:
        raise ServerError(f"the archive gives {relative!r} twice, or under a file's name; "
                          "nothing was kept") from exc


def _judged(folder: Path, name: str, trial_id: int | None) -> Inspection:
    """`inspect`'s verdict on the unpacked files, which must be intact and nothing more."""
    found = inspect(folder, trial_id)
    files = found.document.get("files")
    unlisted = sorted(set(found.file_sizes) - set(files if isinstance(files, dict) else {})
                      - {METADATA_FILE})
    problems = [*found.problems, *(f"{path} is not listed in {METADATA_FILE}"
                                   for path in unlisted)]
    if problems:
        raise ServerError(f"checkpoint {name} arrived, but it is not intact: "
                          f"{'; '.join(problems[:MAX_PROBLEMS_SHOWN])}; nothing was kept")
    return found


class _ChunkReader(io.RawIOBase):
    """Chunks of bytes as a stream that `tarfile` reads."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        super().__init__()
        self._chunks, self._pending, self._at = chunks, b"", 0

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1, /) -> bytes:
        while self._at >= len(self._pending):
            chunk = next(self._chunks, None)
            if chunk is None:
                return b""
            self._pending, self._at = chunk, 0
        end = len(self._pending) if size < 0 else self._at + size
        data = self._pending[self._at:end]
        self._at += len(data)
        return data


class _Gunzipped(io.RawIOBase):
    """A gzip stream, inflated as it is read; `check_whole` tells a stream cut short (a tar
    read from it may end at a member's boundary and look complete) from a whole one."""

    def __init__(self, raw: io.RawIOBase, what: str) -> None:
        super().__init__()
        self._raw, self._what = raw, what
        self._inflate = zlib.decompressobj(31)  # 31: the gzip container, trailer checked
        self._pending = b""

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1, /) -> bytes:
        while not self._pending and not self._inflate.eof:
            compressed = self._raw.read(CHUNK_BYTES)
            if not compressed:
                break
            try:
                self._pending = self._inflate.decompress(compressed)
            except zlib.error as exc:
                raise ServerError(f"{self._what} is not gzip data ({exc}); download it "
                                  "again") from exc
        end = len(self._pending) if size < 0 else size
        data, self._pending = self._pending[:end], self._pending[end:]
        return data

    def check_whole(self) -> None:
        """Raises ServerError unless the stream ran to its gzip trailer (its CRC and length
        checked), with nothing after it."""
        while self.read(CHUNK_BYTES):
            pass
        if not self._inflate.eof or self._inflate.unused_data or self._raw.read(1):
            raise ServerError(f"{self._what} broke off before its end; download it again")
