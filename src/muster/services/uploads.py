"""Safe extraction of an uploaded context directory: a tar.gz (or a zip) from a client we do
not trust.

Extraction is muster's own loop over a streamed `tarfile` (mode `r|`), not `extractall`:
the `data` filter of Python 3.11.7 can be walked around (CVE-2025-4517), and `getmembers()`
decompresses the whole archive before the first check can run. Refused, with a message
that names the member where there is one:

- anything but gzip (bzip2, xz, a bare tar): one decompressor, counted byte by byte;
- more than `max_bytes` decompressed. Each header's claimed size is checked before its
  file is written, and every byte gzip actually yields (tar headers and padding too) is
  counted as it is read, so a bomb stops at the limit; copies made for links count too.
  Over MAX_HEADER_BYTES of headers before one member (pax records, long names, sparse
  maps: tarfile reads those whole into memory);
- more than `max_members` members, or more than `timeout_s` seconds of extraction;
- absolute paths, `..` components, NUL bytes, a name given twice, a member under a name
  that is a file or a link;
- device files, FIFOs and sparse files;
- a link that leads outside the directory, to a directory or to a name the archive lacks,
  or through more than MAX_LINK_HOPS links.

Nothing written is a link and no link on disk is ever followed: a link to a regular file
of the archive, resolved by name in the archive's own namespace (never through the file
system), becomes a copy of that file. Directories are made here; files are created with
O_EXCL | O_NOFOLLOW, mode 0644 or 0755 (no setuid, no group or world write), only where
the parent's realpath is inside `dest`. On any refusal or error `dest` is removed whole.

A zip (what a browser's "compress folder" makes) goes through the same checks and limits,
member by member (`_ZipExtraction`): its central directory is bounded before it is read
(at most `max_members` entries and MAX_ZIP_DIRECTORY_BYTES), only stored and deflated
members are taken, every byte inflated is counted as it is written, and encrypted members
and links are refused.
"""

from __future__ import annotations

import errno
import gzip
import io
import os
import posixpath
import shutil
import stat
import struct
import tarfile
import time
import zipfile
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import BinaryIO

from muster.errors import InvalidRequest, PayloadTooLarge

MAX_UPLOAD_BYTES = 256 * 1024**2  # the compressed archive
MAX_EXTRACTED_BYTES = 1024**3  # decompressed: the tar stream, plus the copies made for links
MAX_MEMBERS = 10_000  # files, directories and links
EXTRACT_TIMEOUT_S = 60.0
MAX_HEADER_BYTES = 1024**2  # the headers of one member (pax records, long names)
MAX_LINK_HOPS = 32

_GZIP_MAGIC = b"\x1f\x8b"
_ZIP_MAGIC = b"PK\x03\x04"
_ZIP_END = b"PK\x05\x06"  # the end of central directory record
_ZIP_END_SEARCH = 22 + 65_535  # the record and the longest comment it may carry
MAX_ZIP_DIRECTORY_BYTES = 16 * 1024**2
_READ_AHEAD = 64 * 1024  # tarfile's read buffer: it may have read this much past its use
_CHUNK = 1024**2
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_UNREADABLE = (tarfile.TarError, EOFError, zlib.error, gzip.BadGzipFile, zipfile.BadZipFile)
_KEEP_OUT = "keep data sets and environments out of the context directory and read them by path"


def extract_context(
    archive: Path, dest: Path, max_bytes: int = MAX_EXTRACTED_BYTES, *,
    max_members: int = MAX_MEMBERS, timeout_s: float = EXTRACT_TIMEOUT_S,
) -> int:
    """Extract the tar.gz `archive` into the new directory `dest`; the number of files made.

    Raises:
        InvalidRequest: the archive is not a readable tar.gz, or a member is refused.
        PayloadTooLarge: it passes the byte, member or time limit.
    """
    is_zip = _check_format(archive)
    budget = _Budget(max_bytes, max_members, timeout_s)
    dest.mkdir(parents=True, exist_ok=False)
    try:
        if is_zip:
            return _ZipExtraction(dest, budget).run(archive)
        with gzip.open(archive, "rb") as unzipped:
            return _Extraction(dest, budget).run(_CountingReader(unzipped, budget))
    except _UNREADABLE as exc:
        shutil.rmtree(dest, ignore_errors=True)
        raise InvalidRequest(
            f"the context upload is not a readable {'zip' if is_zip else 'tar.gz'} archive "
            f"({exc}); upload the directory with `muster experiment create CONFIG DIR`"
        ) from exc
    except BaseException:
        shutil.rmtree(dest, ignore_errors=True)
        raise


def _check_format(archive: Path) -> bool:
    """True for a zip, False for a gzip; anything else is refused."""
    with archive.open("rb") as head:
        magic = head.read(len(_ZIP_MAGIC))
    if magic == _ZIP_MAGIC:
        return True
    if magic[:len(_GZIP_MAGIC)] != _GZIP_MAGIC:
        raise InvalidRequest(
            f"the context upload is not a readable tar.gz archive (it starts with "
            f"{magic[:2]!r}, not gzip's 1f 8b): the context must be a tar.gz archive (gzip) "
            "or a zip, not bzip2, xz or a bare tar; upload the directory with `muster "
            "experiment create CONFIG DIR`"
        )
    return False


def _size(n: int) -> str:
    return f"{n // 1024**2} MiB" if n >= 1024**2 else f"{n} bytes"


class _Budget:
    """What one extraction may still use: decompressed bytes, members, header bytes, time."""

    def __init__(self, max_bytes: int, max_members: int, timeout_s: float) -> None:
        self.max_bytes, self.max_members, self.timeout_s = max_bytes, max_members, timeout_s
        self.deadline = time.monotonic() + timeout_s
        self.decompressed = 0  # every byte gzip has yielded
        self.copied = 0  # bytes written for links, which the archive does not hold
        self.members = 0
        self.header_bytes = 0  # read, outside a file's data, since the last member began
        self.in_data = False
        self.at = "its first member"  # where the extraction is, for messages

    def charge(self, n: int) -> None:
        """`n` more bytes came out of gzip."""
        self.decompressed += n
        if not self.in_data:
            self.header_bytes += n
            if self.header_bytes > MAX_HEADER_BYTES + _READ_AHEAD:
                raise PayloadTooLarge(
                    f"context archive has more than {_size(MAX_HEADER_BYTES)} of headers "
                    f"(pax records, long names) for one member, after {self.at}; pack the "
                    "directory with `muster experiment create CONFIG DIR` or a plain `tar czf`"
                )
        self._check_bytes(self.decompressed + self.copied - _READ_AHEAD)
        self.check_time()

    def enter(self, member: tarfile.TarInfo) -> None:
        """Count `member` and check its claimed size, before anything of it is written."""
        self.at = f"member {member.name!r}"
        self.members += 1
        self.header_bytes = 0
        if self.members > self.max_members:
            raise PayloadTooLarge(
                f"context archive has more than {self.max_members} members (files, "
                f"directories and links; at {self.at}); {_KEEP_OUT}"
            )
        claimed = member.size if member.isreg() else 0
        self._check_bytes(member.offset_data + claimed + self.copied)
        self.check_time()

    def enter_zip(self, name: str, claimed: int) -> None:
        """Count a zip's member and check its claimed size, before it is written."""
        self.at = f"member {name!r}"
        self.members += 1
        if self.members > self.max_members:
            raise PayloadTooLarge(
                f"context archive has more than {self.max_members} members (files and "
                f"directories; at {self.at}); {_KEEP_OUT}"
            )
        self._check_bytes(self.copied + claimed)
        self.check_time()

    def copy(self, link: str, n: int) -> None:
        """`n` more bytes written for the link (or the zip member) `link`."""
        self.at = f"member {link!r}"
        self.copied += n
        self._check_bytes(self.decompressed + self.copied - _READ_AHEAD)
        self.check_time()

    @contextmanager
    def reading_data(self) -> Iterator[None]:
        """While a file's data is read (it counts towards the bytes, not the headers)."""
        self.in_data = True
        try:
            yield
        finally:
            self.in_data = False

    def check_time(self) -> None:
        if time.monotonic() >= self.deadline:
            raise PayloadTooLarge(
                f"context archive took more than {self.timeout_s:g} s to extract (at "
                f"{self.at}); {_KEEP_OUT}"
            )

    def _check_bytes(self, total: int) -> None:
        if total > self.max_bytes:
            raise PayloadTooLarge(
                f"context archive expands to more than {_size(self.max_bytes)} (at {self.at}); "
                f"{_KEEP_OUT}"
            )


class _CountingReader(io.RawIOBase):
    """The decompressed archive as tarfile reads it, every byte charged to the budget."""

    def __init__(self, source: gzip.GzipFile, budget: _Budget) -> None:
        super().__init__()
        self._source, self._budget = source, budget

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1, /) -> bytes:
        data = self._source.read(size)
        self._budget.charge(len(data))
        return data


class _Kind(Enum):
    FILE = "a file"
    DIR = "a directory"


@dataclass(frozen=True)
class _Link:
    name: str  # normalized
    target: str  # as the archive gives it
    hard: bool  # a hard link's target is relative to the archive's root, not its directory


_Entry = _Kind | _Link


class _Extraction:
    """One archive streamed into `dest`: every name it has given, and the links to copy."""

    def __init__(self, dest: Path, budget: _Budget) -> None:
        self.root = os.path.realpath(dest)
        self.budget = budget
        self.entries: dict[str, _Entry] = {".": _Kind.DIR}
        self.links: list[_Link] = []
        self.files = 0

    def run(self, stream: _CountingReader) -> int:
        with tarfile.open(fileobj=stream, mode="r|", bufsize=_READ_AHEAD) as tar:
            for member in tar:
                self.budget.enter(member)
                self._take(tar, member)
        # After the last member: a symlink may name a file that comes after it.
        for link in self.links:
            self._copy(link, self._resolve(link))
        return self.files

    def _take(self, tar: tarfile.TarFile, member: tarfile.TarInfo) -> None:
        name = _checked_name(member.name)
        if member.issparse():
            raise InvalidRequest(f"context archive member {name!r} is a sparse file; "
                                 "pack the directory without --sparse")
        if member.isdir():
            self._add_dir(name)
        elif member.isreg():
            self._add_file(name, tar, member)
        elif member.issym() or member.islnk():
            self._add_link(name, member)
        else:
            raise InvalidRequest(
                f"context archive member {name!r} is a device file or FIFO; only regular "
                "files, directories and links to files inside the directory are allowed"
            )

    def _add_dir(self, name: str) -> None:
        if self.entries.get(name) is _Kind.DIR:
            return
        self._claim(name, _Kind.DIR)
        self._mkdir(name)

    def _add_file(self, name: str, tar: tarfile.TarFile, member: tarfile.TarInfo) -> None:
        self._claim(name, _Kind.FILE)
        source = tar.extractfile(member)
        if source is None:
            raise InvalidRequest(f"context archive member {name!r} could not be read")
        mode = 0o755 if member.mode & 0o100 else 0o644
        with source, self.budget.reading_data(), self._create(name, mode) as out:
            shutil.copyfileobj(source, out, _CHUNK)
        self.files += 1

    def _add_link(self, name: str, member: tarfile.TarInfo) -> None:
        if "\0" in member.linkname:
            raise InvalidRequest(f"context archive member {name!r} links to a name with a "
                                 "NUL byte")
        link = _Link(name, member.linkname, hard=member.islnk())
        self._claim(name, link)
        self.links.append(link)

    def _claim(self, name: str, entry: _Entry) -> None:
        """Record `name` as `entry`: a new name, under directories only (made as needed)."""
        parts = name.split("/")
        for depth in range(1, len(parts)):
            parent = "/".join(parts[:depth])
            found = self.entries.get(parent)
            if found is None:
                self.entries[parent] = _Kind.DIR
                self._mkdir(parent)
            elif found is not _Kind.DIR:
                what = "a link" if isinstance(found, _Link) else found.value
                raise InvalidRequest(f"context archive member {name!r} is inside {parent!r}, "
                                     f"which is {what}, not a directory")
        if name in self.entries:
            raise InvalidRequest(f"context archive member {name!r} appears twice; "
                                 "pack each path once")
        self.entries[name] = entry

    def _resolve(self, link: _Link) -> str:
        """The regular file `link` leads to, following links by name in the archive."""
        here = [] if link.hard else link.name.split("/")[:-1]
        pending = _steps(link, link)
        hops = 0
        while pending:
            step = pending.pop()
            if step in ("", "."):
                continue
            if step == "..":
                if not here:
                    raise _leads_outside(link)
                here.pop()
                continue
            here.append(step)
            found = self.entries.get("/".join(here))
            if isinstance(found, _Link):
                hops += 1
                if hops > MAX_LINK_HOPS:
                    raise InvalidRequest(f"context archive member {link.name!r} leads through "
                                         f"more than {MAX_LINK_HOPS} links")
                here = [] if found.hard else here[:-1]
                pending += _steps(link, found)
        return self._file_named("/".join(here) or ".", link)

    def _file_named(self, name: str, link: _Link) -> str:
        found = self.entries.get(name)
        if found is _Kind.FILE:
            return name
        if found is _Kind.DIR:
            raise InvalidRequest(
                f"context archive member {link.name!r} links to {link.target!r}, a directory; "
                "only links to files are kept (as copies): put the directory itself there, "
                "or remove the link"
            )
        raise InvalidRequest(f"context archive member {link.name!r} links to "
                             f"{link.target!r}, which is not in the archive")

    def _copy(self, link: _Link, target: str) -> None:
        with _naming(link.name):
            fd = os.open(self._inside(target), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as source, \
                self._create(link.name, os.fstat(fd).st_mode & 0o755) as out:
            while chunk := source.read(_CHUNK):
                self.budget.copy(link.name, len(chunk))
                out.write(chunk)
        self.files += 1

    def _mkdir(self, name: str) -> None:
        with _naming(name):
            os.mkdir(self._inside(name), 0o755)

    def _create(self, name: str, mode: int) -> BinaryIO:
        with _naming(name):
            return os.fdopen(os.open(self._inside(name), _CREATE, mode), "wb")

    def _inside(self, name: str) -> str:
        """Where `name` goes, once its directory is known to resolve inside `dest`."""
        path = os.path.join(self.root, name)
        parent = os.path.realpath(os.path.dirname(path))
        if os.path.commonpath([parent, self.root]) != self.root:
            raise InvalidRequest(f"context archive member {name!r} would be written outside "
                                 "the context directory")
        return path


class _ZipExtraction:
    """A zip written into `dest` by the tar extraction's own rules: the same names, the same
    directories and files (its `_claim`, `_add_dir`, `_create`), the same budget."""

    def __init__(self, dest: Path, budget: _Budget) -> None:
        self.into = _Extraction(dest, budget)
        self.budget = budget

    def run(self, archive: Path) -> int:
        _check_zip_directory(archive, self.budget.max_members)
        try:
            with zipfile.ZipFile(archive) as zipped:
                for info in zipped.infolist():
                    self._take_zip(zipped, info)
        except zipfile.BadZipFile as exc:
            raise InvalidRequest(f"the context upload is not a readable zip archive ({exc}); "
                                 "upload a tar.gz or a zip of the directory") from exc
        return self.into.files

    def _take_zip(self, zipped: zipfile.ZipFile, info: zipfile.ZipInfo) -> None:
        name = _checked_name(info.filename.rstrip("/") or ".")
        self.budget.enter_zip(name, info.file_size)
        mode = info.external_attr >> 16
        if stat.S_ISLNK(mode):
            raise InvalidRequest(f"context archive member {name!r} is a link; zip contexts "
                                 "keep files and directories only (a tar.gz keeps links to "
                                 "files, as copies)")
        if info.flag_bits & 0x1:
            raise InvalidRequest(f"context archive member {name!r} is encrypted")
        if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
            raise InvalidRequest(f"context archive member {name!r} is compressed with method "
                                 f"{info.compress_type}; only stored and deflated members "
                                 "are read")
        if info.is_dir():
            if name != ".":
                self.into._add_dir(name)
            return
        self.into._claim(name, _Kind.FILE)
        with zipped.open(info) as source, self.into._create(
                name, 0o755 if mode & 0o100 else 0o644) as out:
            while chunk := source.read(_CHUNK):
                self.budget.copy(name, len(chunk))
                out.write(chunk)
        self.into.files += 1


def _check_zip_directory(archive: Path, max_members: int) -> None:
    """Refuse a zip whose central directory would cost too much to read: more entries than
    members allowed, or more than MAX_ZIP_DIRECTORY_BYTES (zipfile reads it whole)."""
    size = archive.stat().st_size
    with archive.open("rb") as file:
        file.seek(max(0, size - _ZIP_END_SEARCH))
        tail = file.read()
    at = tail.rfind(_ZIP_END)
    if at < 0 or len(tail) - at < 22:
        raise InvalidRequest("the context upload is not a readable zip archive (it has no end "
                             "of central directory record)")
    entries, directory_bytes = struct.unpack("<HI", tail[at + 10:at + 16])
    if entries > max_members:  # 0xFFFF (zip64) included: more than the limit anyway
        raise PayloadTooLarge(f"context archive has more than {max_members} members; "
                              f"{_KEEP_OUT}")
    if directory_bytes > MAX_ZIP_DIRECTORY_BYTES:
        raise PayloadTooLarge(f"context archive's central directory is over "
                              f"{_size(MAX_ZIP_DIRECTORY_BYTES)}; {_KEEP_OUT}")


def _checked_name(name: str) -> str:
    """`name` normalized (`./pkg/` → `pkg`), once it is known to stay inside."""
    if "\0" in name:
        raise InvalidRequest(f"context archive member {name!r} has a NUL byte in its name")
    if name.startswith("/") or posixpath.isabs(name):
        raise InvalidRequest(f"context archive member {name!r} has an absolute path")
    if ".." in name.split("/"):
        raise InvalidRequest(f"context archive member {name!r} leaves the directory (..)")
    return posixpath.normpath(name)


def _steps(link: _Link, through: _Link) -> list[str]:
    """`through`'s target as steps to pop, first step last; `link` names any refusal."""
    if posixpath.isabs(through.target):
        raise _leads_outside(link)
    return through.target.split("/")[::-1]


def _leads_outside(link: _Link) -> InvalidRequest:
    return InvalidRequest(f"context archive member {link.name!r} links to {link.target!r}, "
                          "which leads outside the context directory")


@contextmanager
def _naming(name: str) -> Iterator[None]:
    """File system errors a member's name causes, as refusals that name it."""
    try:
        yield
    except OSError as exc:
        if exc.errno != errno.ENAMETOOLONG:
            raise
        raise InvalidRequest(f"context archive member {name!r} has a path too long for the "
                             "server's file system") from exc
