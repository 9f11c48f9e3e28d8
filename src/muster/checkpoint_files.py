"""A checkpoint on disk: its directory name, its metadata.json, and the one integrity rule.

The harness writes a checkpoint as `checkpoints/step-<step:012d>-<8 hex>/` holding the
user's files and `metadata.json` (docs/run-directory.md); `.tmp-*` directories are saves
still in progress and are never read. Three readers judge checkpoints with `inspect`, so
they can never disagree about whether one is intact: the harness's `restore()`, the
server's registration of new checkpoints, and verification when a trial exits 0.

A save in progress names its attempt (`in_progress_name`, `sharded_name`), so whoever finds
one can tell whether a process may still be writing into it (`abandoned`); a sharded save,
which every rank writes into, holds one part file per rank that has finished with it
(`PartDocument`), and is complete only when every rank's part is written (`sharded_progress`).

Intact means: metadata.json is a JSON object whose "files" maps relative paths inside the
directory to sha256 hex digests; each of those is a regular file with that digest; its
"step" (else the one in the directory's name) is an int that agrees with the name; and its
"trial_id", when the caller knows the trial, is that trial's.

Standard library only: the harness imports this inside the user's training process.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import stat
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, NamedTuple, NotRequired, TypedDict, TypeGuard

from muster.atomic import open_regular, read_regular
from muster.rundir import Hparams

METADATA_FILE = "metadata.json"
NAME_PREFIX = "step-"
TMP_PREFIX = ".tmp-"
# torch.distributed.checkpoint's files: its coordinator writes `.metadata` once every rank's
# `*.distcp` shards are written.
DCP_METADATA = ".metadata"
DCP_SHARD_SUFFIX = ".distcp"
# What the harness writes is `step-<12 digits>-<8 hex>`; a shorter `step-<n>` is accepted
# so that a checkpoint copied in by hand is judged rather than ignored.
NAME = re.compile(r"step-(\d+)(?:-[^/]*)?")
# A save in progress: one process's, `.tmp-step-<step:012d>-attempt-<n>-<8 hex>`, or the k-th
# sharded save of attempt n, `.tmp-step-<step:012d>-attempt-<n>-sharded-<k>`, which every
# rank writes into. Any other `.tmp-*` name (an older harness's) has no known attempt.
IN_PROGRESS = re.compile(r"\.tmp-step-\d+-attempt-(\d+)-(?:[0-9a-f]{8}|(sharded)-\d+)")
# A rank's part file in a sharded save in progress: written once the rank is done with it.
PART = re.compile(r"\.muster-part-rank-(\d+)\.json")
MAX_PROBLEMS_SHOWN = 5

# What the training code passed as save(metadata=...): free JSON, its own keys.
Metadata = dict[str, Any]


class CheckpointDocument(TypedDict):
    """metadata.json as the harness writes it. A reader takes it as unchecked JSON
    (`Inspection.document`): a checkpoint copied in by hand may hold anything."""

    step: int
    time: float  # unix seconds, when it was saved
    trial_id: int | None  # None off the platform
    attempt: int
    rank: int  # the rank that saved it
    hparams: Hparams
    metadata: Metadata
    files: dict[str, str]  # relative POSIX path → sha256 hex digest
    world_size: NotRequired[int]  # a sharded save's: how many ranks wrote it


@dataclass(frozen=True)
class Inspection:
    """A checkpoint directory as found on disk, and what is wrong with it (nothing if intact)."""

    path: Path
    step: int  # metadata.json's, else the name's; -1 when neither gives one
    document: dict[str, object]  # metadata.json as parsed, unchecked; {} when unreadable
    file_sizes: dict[str, int]  # every file under the directory: relative POSIX path → bytes
    problems: tuple[str, ...] = field(default=())

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def intact(self) -> bool:
        return not self.problems

    @property
    def problem(self) -> str | None:
        """The problems in one line (the first few, then a count); None when intact."""
        if not self.problems:
            return None
        shown = "; ".join(self.problems[:MAX_PROBLEMS_SHOWN])
        more = len(self.problems) - MAX_PROBLEMS_SHOWN
        return f"{shown}; and {more} more" if more > 0 else shown

    @property
    def saved_at(self) -> float | None:
        """metadata.json's "time" (unix seconds), when it is a finite number."""
        value = self.document.get("time")
        if _is_number(value) and value - value == 0:
            return float(value)
        return None

    @property
    def user_metadata(self) -> object:
        """What the training code passed as save(metadata=...); {} when absent (any JSON
        value in a checkpoint muster did not write)."""
        value = self.document.get("metadata")
        return {} if value is None else value

    def recorded_int(self, key: str) -> int | None:
        """metadata.json's `key` (e.g. "attempt", "rank") when it is an int."""
        value = self.document.get(key)
        return value if _is_int(value) else None

    @property
    def size_bytes(self) -> int:
        return sum(self.file_sizes.values())

    @property
    def order(self) -> tuple[int, float, str]:
        """Sort key, best last: highest step, then saved latest, then name."""
        return self.step, self.saved_at or 0.0, self.name


def step_in_name(name: str) -> int | None:
    """The step in a published checkpoint's directory name, or None for any other name."""
    match = NAME.fullmatch(name)
    return int(match[1]) if match else None


def published(directory: Path) -> list[Path]:
    """The published checkpoint directories in `directory` (none when it does not exist)."""
    try:
        entries = list(os.scandir(directory))
    except (FileNotFoundError, NotADirectoryError):
        return []
    return sorted(Path(e.path) for e in entries
                  if NAME.fullmatch(e.name) and e.is_dir(follow_symlinks=False))


def inspect(path: Path, trial_id: int | None = None) -> Inspection:
    """Read the checkpoint at `path` and check every file its metadata.json lists.

    Raises:
        FileNotFoundError: `path` is not a directory (e.g. deleted meanwhile).
        OSError: the directory itself cannot be listed.
    """
    sizes, irregular = _files(path)
    document, problems = _read_document(path / METADATA_FILE)
    files = document.get("files")
    if isinstance(files, dict):
        problems += _check_files(path, files, sizes, irregular)
    elif document:
        problems.append(f'{METADATA_FILE} has no "files" object of sha256 sums')
    step, step_problem = _step(path.name, document.get("step"))
    problems += [step_problem] if step_problem else []
    problems += _trial_mismatch(document.get("trial_id"), trial_id)
    return Inspection(path, step, document, sizes, tuple(problems))


def inspect_all(directory: Path, trial_id: int | None = None) -> list[Inspection]:
    """`inspect` each published checkpoint in `directory`, best last (see `Inspection.order`).

    One deleted while being read is left out.
    """
    found = []
    for path in published(directory):
        try:
            found.append(inspect(path, trial_id))
        except FileNotFoundError:
            continue  # deleted since the listing: there is nothing left to judge
    return sorted(found, key=lambda c: c.order)


def latest_intact(
    directory: Path,
    preferred: Path | None = None,
    on_corrupt: Callable[[Inspection], None] | None = None,
    trial_id: int | None = None,
) -> Inspection | None:
    """The best intact checkpoint: `preferred` when it is intact, else the highest step.

    Checkpoints are hashed best first and the search stops at the first intact one, so a
    trial with many checkpoints pays for one (plus any corrupt ones above it).
    `on_corrupt` is called with each corrupt one passed over.
    """
    candidates: list[Path] = [preferred] if preferred is not None else []
    others = _best_first(published(directory))
    candidates += [p for p in others if preferred is None or not _same(p, preferred)]
    for path in candidates:
        try:
            found = inspect(path, trial_id)
        except FileNotFoundError:
            continue  # deleted since the listing (or `preferred` is gone): the next one
        if found.intact:
            return found
        if on_corrupt is not None:
            on_corrupt(found)
    return None


def sha256_of(path: Path) -> str:
    with os.fdopen(open_regular(path), "rb") as stream:  # never through a link
        return hashlib.file_digest(stream, "sha256").hexdigest()


def new_name(step: int) -> str:
    """The name a save of `step` is published under (its suffix tells two saves apart)."""
    return f"{NAME_PREFIX}{step:012d}-{os.urandom(4).hex()}"


# -- saves in progress ---------------------------------------------------------------------


def in_progress_name(step: int, attempt: int) -> str:
    """The directory one process writes a save of `step` into before publishing it."""
    return f"{TMP_PREFIX}{NAME_PREFIX}{step:012d}-attempt-{attempt}-{os.urandom(4).hex()}"


def sharded_name(step: int, attempt: int, number: int) -> str:
    """The directory every rank writes the attempt's `number`-th sharded save into: the same
    on every rank without their talking (they save in the same order), new for each save."""
    return f"{TMP_PREFIX}{NAME_PREFIX}{step:012d}-attempt-{attempt}-sharded-{number}"


@dataclass(frozen=True)
class SaveInProgress:
    """A `.tmp-*` directory among the checkpoints: a save not published (yet)."""

    path: Path
    attempt: int | None  # the attempt whose processes write it; None: a name without one
    sharded: bool  # every rank of the attempt writes into it


def in_progress(directory: Path) -> list[SaveInProgress]:
    """The saves in progress in `directory` (none when it does not exist)."""
    try:
        entries = list(os.scandir(directory))
    except (FileNotFoundError, NotADirectoryError):
        return []
    found = []
    for entry in sorted(entries, key=lambda e: e.name):
        if entry.name.startswith(TMP_PREFIX) and entry.is_dir(follow_symlinks=False):
            match = IN_PROGRESS.fullmatch(entry.name)
            found.append(SaveInProgress(Path(entry.path), int(match[1]) if match else None,
                                        bool(match and match[2])))
    return found


class PartDocument(TypedDict):
    """A rank's part file in a sharded save: written once the rank is done with it."""

    rank: int
    world_size: int
    ok: bool  # its part is written; False: it gave up, `error` says why
    error: str | None
    time: float  # unix seconds


def part_file(directory: Path, rank: int) -> Path:
    """Where `rank` says it is done with the sharded save in `directory` (see `PART`)."""
    return directory / f".muster-part-rank-{rank}.json"


def read_parts(directory: Path) -> dict[int, PartDocument | None]:
    """Every part file in `directory` by rank; None for one that is no valid `PartDocument`."""
    try:
        names = [e.name for e in os.scandir(directory)]
    except (FileNotFoundError, NotADirectoryError):
        return {}
    parts: dict[int, PartDocument | None] = {}
    for name in names:
        if match := PART.fullmatch(name):
            parts[int(match[1])] = _part_document(directory / name, int(match[1]))
    return parts


def remove_parts(directory: Path) -> None:
    """Remove the part files, which are no file of the checkpoint, before it is hashed."""
    for rank in read_parts(directory):
        part_file(directory, rank).unlink(missing_ok=True)


class ShardedProgress(NamedTuple):
    """How far the ranks other than 0 (which publishes) are with a sharded save."""

    waiting_for: tuple[int, ...]  # ranks whose part file is not there yet
    problem: str | None  # why it can never be published (a rank gave up, a file is missing)


def sharded_progress(directory: Path, world_size: int) -> ShardedProgress:
    """Rank 0's view of the sharded save in `directory` of `world_size` ranks.

    It is complete when neither waits nor has a problem: every other rank's part file says
    its part is written (with the same world size), and, when the directory holds
    torch.distributed.checkpoint's shards, the `.metadata` DCP writes last is there.
    """
    parts = read_parts(directory)
    problems = [p for rank, document in sorted(parts.items()) if rank != 0
                for p in _part_problems(rank, document, world_size)]
    waiting = tuple(rank for rank in range(1, world_size) if rank not in parts)
    if not problems and not waiting:
        problems = _dcp_problems(directory)
    return ShardedProgress(waiting, "; ".join(problems) or None)


def every_part_ended(parts: Mapping[int, PartDocument | None]) -> bool:
    """Whether every rank has finished with a sharded save, its part written or given up."""
    sizes = {document["world_size"] for document in parts.values() if document is not None}
    return len(sizes) == 1 and all(rank in parts for rank in range(sizes.pop()))


def abandoned(save: SaveInProgress, latest_attempt: int | None,
              live_attempts: Collection[int], parts: Mapping[int, PartDocument | None]) -> bool:
    """Whether no process can be writing into `save` any more, so it may be removed.

    True when its attempt has ended (one up to `latest_attempt` that is not live: muster
    starts an attempt only once the one before it ended), when its name gives no attempt and
    none is live, or when it is a sharded save every rank has finished with (`parts`: rank 0
    writes its own only when it gives up; a published save was renamed away).
    """
    if save.attempt is None:
        return not live_attempts
    if (latest_attempt is not None and save.attempt <= latest_attempt
            and save.attempt not in live_attempts):
        return True
    return save.sharded and every_part_ended(parts)


def remove_abandoned(
    directory: Path, latest_attempt: int | None, live_attempts: Collection[int], *,
    idle_for: float = 0.0, keep: Collection[Path] = (),
) -> list[Path]:
    """Remove the saves in progress in `directory` that are `abandoned` and in which nothing
    changed for `idle_for` seconds, except those in `keep`; the paths removed."""
    removed = []
    for save in in_progress(directory):
        parts = read_parts(save.path) if save.sharded else {}
        if (save.path in keep or not abandoned(save, latest_attempt, live_attempts, parts)
                or (idle_for > 0 and _idle_seconds(save.path) < idle_for)):
            continue
        shutil.rmtree(save.path, ignore_errors=True)
        if not save.path.exists():
            removed.append(save.path)
    return removed


def _best_first(paths: Iterable[Path]) -> list[Path]:
    """Order by step, then metadata.json's time, best first, reading only metadata.json."""
    def key(path: Path) -> tuple[int, float, str]:
        document, _ = _read_document(path / METADATA_FILE)
        recorded = document.get("step")
        step = recorded if _is_int(recorded) else (step_in_name(path.name) or 0)
        saved_at = document.get("time")
        return step, float(saved_at) if _is_number(saved_at) else 0.0, path.name
    return sorted(paths, key=key, reverse=True)


def _same(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve()
    except OSError:
        return False


def _files(path: Path) -> tuple[dict[str, int], set[str]]:
    """Sizes of everything under `path` (symlinks not followed), and which are not regular
    files."""
    if not path.is_dir():
        raise FileNotFoundError(path)
    sizes: dict[str, int] = {}
    irregular: set[str] = set()

    def fail(exc: OSError) -> None:
        raise exc

    for folder, _dirs, names in os.walk(path, onerror=fail):
        for name in names:
            full = Path(folder, name)
            relative = full.relative_to(path).as_posix()
            info = full.lstat()
            sizes[relative] = info.st_size
            if not stat.S_ISREG(info.st_mode):
                irregular.add(relative)
    return sizes, irregular


def _read_document(path: Path) -> tuple[dict[str, object], list[str]]:
    try:
        document = json.loads(read_regular(path))
    except FileNotFoundError:
        return {}, [f"{METADATA_FILE} is missing"]
    except OSError as exc:
        return {}, [f"{METADATA_FILE} cannot be read ({exc.strerror or exc})"]
    except (ValueError, RecursionError) as exc:
        return {}, [f"{METADATA_FILE} is not valid JSON ({exc})"]
    if not isinstance(document, dict):
        return {}, [f"{METADATA_FILE} is not a JSON object"]
    return document, []


def _check_files(
    folder: Path, files: dict[str, object], sizes: dict[str, int], irregular: set[str]
) -> list[str]:
    problems = []
    for relative, expected in sorted(files.items()):
        if not _inside(relative):
            problems.append(f"{METADATA_FILE} lists {relative!r}, which is outside the "
                            "checkpoint directory")
        elif relative not in sizes:
            problems.append(f"{relative} is missing")
        elif relative in irregular:
            problems.append(f"{relative} is not a regular file")
        elif not isinstance(expected, str):
            problems.append(f"{relative} has no sha256 in {METADATA_FILE}")
        else:
            problems += _digest_problem(folder, relative, expected)
    return problems


def _digest_problem(folder: Path, relative: str, expected: str) -> list[str]:
    try:
        actual = sha256_of(folder / relative)
    except FileNotFoundError:
        return [f"{relative} is missing"]
    except OSError as exc:
        return [f"{relative} cannot be read ({exc.strerror or exc})"]
    return [] if actual == expected else [f"{relative} does not match its sha256 in "
                                          f"{METADATA_FILE}"]


def _inside(relative: str) -> bool:
    where = PurePosixPath(relative)
    return bool(where.parts) and not where.is_absolute() and ".." not in where.parts


def _step(name: str, recorded: object) -> tuple[int, str | None]:
    """The checkpoint's step (metadata.json's, else the name's), and a problem if they differ."""
    named = step_in_name(name)
    if not _is_int(recorded):
        if named is None:
            return -1, f"neither {METADATA_FILE} nor the name {name!r} gives a step"
        return named, None
    if named is not None and named != recorded:
        return recorded, f"{METADATA_FILE} says step {recorded} but the directory is {name}"
    return recorded, None


def _trial_mismatch(recorded: object, trial_id: int | None) -> list[str]:
    if trial_id is None or recorded is None or str(recorded) == str(trial_id):
        return []
    return [f"{METADATA_FILE} names trial {recorded}, but the checkpoint is in trial "
            f"{trial_id}'s run directory"]


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _part_document(path: Path, rank: int) -> PartDocument | None:
    try:
        document = json.loads(read_regular(path))
    except (OSError, ValueError, RecursionError):  # gone meanwhile, a link, not JSON
        return None
    valid = (isinstance(document, dict) and document.get("rank") == rank
             and _is_int(document.get("world_size")) and document["world_size"] > rank
             and isinstance(document.get("ok"), bool)
             and isinstance(document.get("error"), str | None)
             and _is_number(document.get("time")))
    return PartDocument(rank=rank, world_size=document["world_size"], ok=document["ok"],
                        error=document["error"], time=float(document["time"])) if valid else None


def _part_problems(rank: int, document: PartDocument | None, world_size: int) -> list[str]:
    if rank >= world_size:
        return [f"rank {rank} wrote a part, but the save has {world_size} ranks"]
    if document is None:
        return [f"rank {rank}'s part file is unreadable"]
    if not document["ok"]:
        return [f"rank {rank} failed: {document['error']}"]
    if document["world_size"] != world_size:
        return [f"rank {rank} saved with world size {document['world_size']}, rank 0 with "
                f"{world_size}"]
    return []


def _dcp_problems(directory: Path) -> list[str]:
    names = {e.name for e in os.scandir(directory)}
    if DCP_METADATA in names or not any(n.endswith(DCP_SHARD_SUFFIX) for n in names):
        return []
    return [f"torch.distributed.checkpoint's {DCP_METADATA} is missing beside its shards: "
            "the save did not finish"]


def _idle_seconds(path: Path) -> float:
    """Seconds since anything at or below `path` last changed (0 when it cannot be read)."""
    try:
        newest = path.lstat().st_mtime
        for folder, directories, files in os.walk(path):
            for name in [*directories, *files]:
                newest = max(newest, Path(folder, name).lstat().st_mtime)
    except OSError:
        return 0.0
    return time.time() - newest
