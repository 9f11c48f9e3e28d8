"""The uploader SIGKILLed at random moments (issue 16): a restore finds the previous intact
checkpoint or the new complete one, never a partial, and the orphan sweep then leaves no
unreferenced object and no open upload.

Real processes (`tests/fixtures/upload_checkpoint.py`) upload to moto's real S3 API and to
a shared_fs directory. Each is forked by that script's fork server, which made the backend
once and SIGKILLs the uploader when its delay has passed: a fresh interpreter would spend
most of each delay importing boto3, and the kills would land there rather than in the
upload. The kill delays come from a seeded `random.Random`: the seed is printed and recorded
(`kill_seed`), and `MUSTER_KILL_SEED=<seed>` replays the same delays.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import time
import uuid as uuids
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from enum import Enum
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from muster import checkpoint_files
from muster.checkpoint_files import METADATA_FILE
from muster.checkpoint_storage.base import Backend, ObjectMissing
from muster.checkpoint_storage.s3 import S3
from muster.checkpoint_storage.shared_fs import TMP_PREFIX, SharedFs
from muster.checkpoint_storage.sweep import sweep_location
from muster.checkpoint_storage.transfer import fetch_checkpoint, upload_checkpoint
from muster.errors import StorageError
from muster.states import CheckpointState

pytestmark = [pytest.mark.lifecycle, pytest.mark.timeout(300)]

ROUNDS = 100
UPLOADER = Path(__file__).parents[1] / "fixtures" / "upload_checkpoint.py"
S3_PREFIX = "ckpt"  # the `s3` fixture's prefix, which the uploader is given too
SEED_VARIABLE = "MUSTER_KILL_SEED"
CALIBRATIONS = 3  # the delays follow the median time of the last few full uploads,
RECALIBRATE = 20  # and one more is timed every so many rounds: the machine's load drifts
LATE = 1.2  # delays reach this many full uploads, so some kills come after the exit
PREVIOUS = {"config.json": 100, "model.bin": 1000}
# model.bin goes up in three parts on S3 (5, 5 and 2 MiB), between two small files
NEW = {"config.json": 1000, "model.bin": 12 << 20, "optimizer/state.bin": 100_000}


class Restored(Enum):
    NEW = "the new checkpoint"
    PREVIOUS = "the previous checkpoint (the new one was never committed)"


@dataclass(frozen=True)
class Storage:
    """A backend, how the uploader reaches the same place, and a view of it that does not
    go through the backend."""

    backend: Backend
    uploader_args: list[str]
    objects: Callable[[], dict[str, int]]  # key (`<uuid>/<path>`) → size
    open_uploads: Callable[[], list[str]]  # keys of writes begun and never finished
    prefixes: Callable[[], set[str]]  # the first parts of everything stored


class Uploader:
    """The fork server of `UPLOADER`: each `upload` forks a process that uploads a
    checkpoint, SIGKILLed once its delay has passed unless it exited first."""

    def __init__(self, args: list[str], errors: Path) -> None:
        self.errors = errors
        with errors.open("wb") as stderr:
            self.server = subprocess.Popen([sys.executable, str(UPLOADER), "--serve", *args],
                                           stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                           stderr=stderr, text=True)
        assert self._line() == "ready"

    def upload(self, local: Path, uuid: str, delay: float) -> tuple[int, float]:
        """The uploader's return code (-9: killed) and its seconds from fork to exit."""
        assert self.server.stdin is not None
        self.server.stdin.write(f"{local} {uuid} {delay!r}\n")
        self.server.stdin.flush()
        code, seconds = self._line().split()
        return int(code), float(seconds)

    def _line(self) -> str:
        assert self.server.stdout is not None
        line = self.server.stdout.readline()
        assert line, f"the fork server exited: {self.errors.read_text(errors='replace')}"
        return line.strip()

    def close(self) -> None:
        assert self.server.stdin is not None
        self.server.stdin.close()  # it exits at the end of its input
        try:
            self.server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.server.kill()
            self.server.wait()
            raise


@pytest.fixture
def uploader(storage: Storage, tmp_path: Path) -> Iterator[Uploader]:
    running = Uploader(storage.uploader_args, tmp_path / "uploader.stderr")
    try:
        yield running
    finally:
        running.close()


@pytest.fixture
def storage(backend: Backend, request: pytest.FixtureRequest) -> Storage:
    if isinstance(backend, S3):
        endpoint = request.getfixturevalue("s3_endpoint")
        bucket = request.getfixturevalue("s3_bucket")
        client = request.getfixturevalue("s3_client")
        objects = partial(_s3_objects, client, bucket)
        return Storage(backend, ["s3", endpoint, bucket, S3_PREFIX], objects,
                       partial(_s3_open_uploads, client, bucket),
                       lambda: {key.split("/")[0] for key in objects()})
    assert isinstance(backend, SharedFs)
    root = request.getfixturevalue("tmp_path") / "storage"
    return Storage(backend, ["shared_fs", str(root)], partial(_fs_objects, root),
                   partial(_fs_open_uploads, root), partial(_fs_prefixes, root))


def test_a_killed_upload_restores_old_or_new_and_the_sweep_leaves_no_orphans(
        storage: Storage, uploader: Uploader, tmp_path: Path,
        record_property: Callable[[str, Any], None]
) -> None:
    seed = _kill_seed()
    record_property("kill_seed", seed)
    print(f"kill delays seeded with {seed}; {SEED_VARIABLE}={seed} replays them")
    previous = _write_checkpoint(tmp_path / "local" / "step-000000000001-0a0a0a0a", PREVIOUS)
    new = _write_checkpoint(tmp_path / "local" / "step-000000000002-0b0b0b0b", NEW)
    previous_uuid = str(uuids.uuid4())
    upload_checkpoint(storage.backend, previous, previous_uuid)

    outcomes, committed = _kill_rounds(storage, uploader, new, (previous_uuid, previous),
                                       random.Random(seed), tmp_path / "restore")

    assert outcomes[Restored.NEW] and outcomes[Restored.PREVIOUS], (
        f"the kill delays (up to {LATE} full uploads, seed {seed}) never let an upload "
        f"commit, or always did: {dict(outcomes)}")
    _check_sweep(storage, {previous_uuid: _layout(previous)},
                 {u: _layout(new) for u in committed})


def _kill_rounds(storage: Storage, uploader: Uploader, new: Path, previous: tuple[str, Path],
                 rng: random.Random, restores: Path) -> tuple[Counter[Restored], list[str]]:
    """Upload `new` under a fresh uuid and SIGKILL it at a random moment, then restore,
    `ROUNDS` times; how each restore ended, and every uuid `new` was committed under."""
    committed: list[str] = []
    durations = [_full_upload(uploader, new, committed) for _ in range(CALIBRATIONS - 1)]
    outcomes: Counter[Restored] = Counter()
    finished = 0
    started = time.monotonic()
    for round_ in range(ROUNDS):
        if round_ % RECALIBRATE == 0:
            durations.append(_full_upload(uploader, new, committed))
        fraction = rng.uniform(0, LATE)
        delay = fraction * statistics.median(durations[-CALIBRATIONS:])
        new_uuid = str(uuids.uuid4())
        exited = _upload_until_killed(uploader, new, new_uuid, delay)
        where = f"round {round_}, killed after {fraction:.2f} full uploads ({delay:.3f} s)"
        outcome = _restore(storage.backend, (new_uuid, new), previous, restores / str(round_),
                           where)
        assert outcome is Restored.NEW or not exited, f"{where}: the upload ended, yet {outcome}"
        outcomes[outcome] += 1
        finished += exited
        committed += [new_uuid] if outcome is Restored.NEW else []
    print(f"{ROUNDS} rounds in {time.monotonic() - started:.1f} s, full uploads "
          f"{min(durations):.3f} to {max(durations):.3f} s: restored {outcomes[Restored.NEW]} "
          f"new, {outcomes[Restored.PREVIOUS]} previous; {finished} uploads ended before "
          "the kill")
    return outcomes, committed


def _check_sweep(storage: Storage, previous: dict[str, dict[str, int]],
                 new: dict[str, dict[str, int]]) -> None:
    """Every committed prefix is whole; the sweep removes all the rest and nothing more."""
    referenced = previous | new
    by_prefix = _by_prefix(storage.objects())
    committed = {u for u, keys in by_prefix.items() if METADATA_FILE in keys}
    assert committed == set(referenced), "a prefix with metadata.json that no restore found"
    for uuid in committed:
        assert by_prefix[uuid] == referenced[uuid], f"{uuid}/ was committed partial"
    open_before = storage.open_uploads()
    orphans = set(by_prefix) - committed
    print(f"before the sweep: {len(orphans)} uncommitted prefixes, {len(open_before)} "
          "open uploads")
    assert orphans and open_before, "no kill landed after a first file, or inside one"

    states = {uuid: CheckpointState.STORED for uuid in referenced}
    report = sweep_location(storage.backend, states, busy=set(), older_than=0, at=time.time())

    assert storage.open_uploads() == []
    assert _by_prefix(storage.objects()) == referenced
    assert storage.prefixes() == set(referenced)
    assert (report.prefixes_deleted, report.uploads_aborted) == (len(orphans), len(open_before))


def _upload_until_killed(uploader: Uploader, local: Path, uuid: str, delay: float) -> bool:
    """Run an uploader for `delay` seconds, then SIGKILL it; whether it ended first."""
    returncode, _ = uploader.upload(local, uuid, delay)
    assert returncode in (0, -signal.SIGKILL), uploader.errors.read_text(errors="replace")
    return returncode == 0


def _restore(backend: Backend, new: tuple[str, Path], previous: tuple[str, Path], into: Path,
             where: str) -> Restored:
    """The restore rule: the new checkpoint (uuid, local copy) when it was committed, else
    the previous one; each must come back identical to its local copy."""
    (new_uuid, new_local), (previous_uuid, previous_local) = new, previous
    try:
        fetch_checkpoint(backend, new_uuid, into / new_local.name)
    except ObjectMissing:
        left = sorted(os.listdir(into)) if into.exists() else []
        assert left == [], f"{where}: a fetch of nothing left {left}"
        fetch_checkpoint(backend, previous_uuid, into / previous_local.name)
        assert _digests(into / previous_local.name) == _digests(previous_local), where
        return Restored.PREVIOUS
    except StorageError as exc:  # CorruptInStorage above all: a partial copy was committed
        pytest.fail(f"{where}: {exc}")
    assert os.listdir(into) == [new_local.name], where
    restored = _digests(into / new_local.name)
    assert restored == _digests(new_local), f"{where}: restored, but not as it was sent"
    shutil.rmtree(into / new_local.name)  # 12 MiB a round adds up
    return Restored.NEW


def _full_upload(uploader: Uploader, local: Path, done: list[str]) -> float:
    """Upload `local` whole under a new uuid (added to `done`); how long it took, from the
    uploader's fork to its exit."""
    uuid = str(uuids.uuid4())
    returncode, seconds = uploader.upload(local, uuid, delay=60)
    assert returncode == 0, f"the upload did not end: {uploader.errors.read_text()}"
    done.append(uuid)
    return seconds


def _write_checkpoint(directory: Path, sizes: dict[str, int]) -> Path:
    """A checkpoint directory of random files of these sizes, with its metadata.json."""
    files = {}
    for relative, size in sizes.items():
        path = directory / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        data = os.urandom(size)
        path.write_bytes(data)
        files[relative] = hashlib.sha256(data).hexdigest()
    step = checkpoint_files.step_in_name(directory.name)
    document = {"step": step, "time": time.time(), "files": files}
    (directory / METADATA_FILE).write_text(json.dumps(document))
    assert checkpoint_files.inspect(directory).intact
    return directory


def _digests(directory: Path) -> dict[str, str]:
    """Every file under `directory` (metadata.json included) → its sha256."""
    return {p.relative_to(directory).as_posix(): checkpoint_files.sha256_of(p)
            for p in directory.rglob("*") if p.is_file()}


def _layout(directory: Path) -> dict[str, int]:
    """What a whole copy of the checkpoint holds: relative path → size."""
    return checkpoint_files.inspect(directory).file_sizes


def _by_prefix(objects: dict[str, int]) -> dict[str, dict[str, int]]:
    grouped: dict[str, dict[str, int]] = {}
    for key, size in objects.items():
        uuid, _, relative = key.partition("/")
        grouped.setdefault(uuid, {})[relative] = size
    return grouped


def _s3_objects(client: Any, bucket: str) -> dict[str, int]:
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket)
    return {o["Key"].removeprefix(f"{S3_PREFIX}/"): o["Size"]
            for page in pages for o in page.get("Contents", [])}


def _s3_open_uploads(client: Any, bucket: str) -> list[str]:
    pages = client.get_paginator("list_multipart_uploads").paginate(Bucket=bucket)
    return [u["Key"] for page in pages for u in page.get("Uploads", [])]


def _fs_objects(root: Path) -> dict[str, int]:
    return {p.relative_to(root).as_posix(): p.stat().st_size for p in root.rglob("*")
            if p.is_file() and not p.name.startswith(TMP_PREFIX)}


def _fs_open_uploads(root: Path) -> list[str]:
    return [p.relative_to(root).as_posix() for p in root.rglob(f"{TMP_PREFIX}*")]


def _fs_prefixes(root: Path) -> set[str]:
    """Every name in `root`: a directory a kill left empty (made for a file never written)
    counts too, so the sweep must remove those (`SharedFs.tidy`)."""
    return set(os.listdir(root))


def _kill_seed() -> int:
    given = os.environ.get(SEED_VARIABLE)
    return int(given) if given else random.SystemRandom().randrange(1 << 32)
