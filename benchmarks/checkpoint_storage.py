"""(o) Checkpoint storage (issue 16): an upload to S3 against plain boto3, and GC of 10,000.

Upload: one checkpoint of 1 GiB in 4 files of random bytes (128 MiB with `--quick`; any size
with `--size` when run alone), uploaded to a moto S3 server on 127.0.0.1 by muster
(`upload_checkpoint` with the `S3` backend: each file's sha256 computed from the bytes as
they stream and compared with metadata.json, then metadata.json written create-once), and
by a plain boto3 `client.upload_file` of the same files, in the same order, with boto3's
default `TransferConfig` (the target's baseline) and with the `TransferConfig` muster uses
(its threshold, part size and concurrency from `S3`'s defaults). A fourth arm, for
diagnosis: boto3 `upload_fileobj` of each file through a forward-only reader that hashes
nothing, with muster's `TransferConfig`: the way muster hands its bytes to boto3, without
muster. The arms are interleaved (the order rotates each repetition); each run uses new
keys, and its objects are checked (keys and sizes) and deleted before the next run. moto
runs in its own process, as a real S3 runs elsewhere: in this one it would share the
uploader's interpreter lock, so that the uploader's hashing would slow the server.

GC: a real store (SQLite; PostgreSQL too when 127.0.0.1:5432 answers) holding one ended
experiment of 100 SUCCEEDED trials x 100 `stored` checkpoints on a shared_fs storage (a
directory here), each with its copy in the trial's run directory and a validation of the
searcher's metric at its step, rows inserted directly. Timed: `StorageWorker.plan_for`, then
`StorageWorker.collect` (plan, record, delete every checkpoint outside the policy from
storage and the run directory, an event each), then a second `collect` (nothing to do).
The floor beside it: `shutil.rmtree` of as many directories of the same two small files.
Everything lives in a temporary directory deleted at the end.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import inspect
import os
import random
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, BinaryIO

import boto3
import yaml
from boto3.s3.transfer import TransferConfig
from ingest import fresh_store, postgres_answers
from measure import expect, interleave, median
from report import Outcome, Table, Target
from sqlalchemy import event, func, insert, select
from sqlalchemy.engine import Engine

from muster import checkpoint_files
from muster.atomic import json_bytes
from muster.checkpoint_files import METADATA_FILE, NAME_PREFIX
from muster.checkpoint_storage.location import Location
from muster.checkpoint_storage.s3 import S3
from muster.checkpoint_storage.transfer import upload_checkpoint
from muster.checkpoint_storage.worker import PlannedCheckpoint, StorageWorker
from muster.config import load_config
from muster.config.units import parse_size
from muster.home import Home
from muster.states import CheckpointState, EventReason, ExperimentState, MetricKind, TrialState
from muster.store import Checkpoint, Event, Experiment, Metric, Store, Trial

NAME = "checkpoint_storage"
UPLOAD_TARGET = 0.90  # muster's throughput, as a share of boto3's upload_file
GC_TARGET_S = 60.0  # a collection of 10,000 checkpoints takes seconds, not minutes
FILES = 4
WRITE_CHUNK = 8 << 20
BUCKET = "muster-bench"
MUSTER_PREFIX = "muster"  # the S3 backend's prefix in the bucket
REGION = "us-east-1"
CREDENTIALS = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing",
               "region_name": REGION}
PLAN_REPETITIONS = 3  # plan_for changes nothing: timed a few times per store
PAYLOAD = b"weights\n" * 128  # each GC checkpoint's one file (1 KiB)
PAYLOAD_SHA256 = hashlib.sha256(PAYLOAD).hexdigest()
SEEDED_AT = 1.7e9

# moto's S3 in a process of its own; it prints its URL, and stops when stdin closes.
MOTO_SERVER = """
import logging, sys
from moto.server import ThreadedMotoServer
logging.getLogger("werkzeug").setLevel(logging.ERROR)
server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
server.start()
host, port = server.get_host_and_port()
print(f"http://{host}:{port}", flush=True)
sys.stdin.read()
server.stop()
"""

MUSTER = "muster `upload_checkpoint` (S3 backend)"
BOTO3_DEFAULT = "boto3 `upload_file`, default TransferConfig"
BOTO3_MUSTER_CONFIG = "boto3 `upload_file`, muster's TransferConfig"
FORWARD_ONLY = "boto3 `upload_fileobj`, forward-only reader, muster's TransferConfig"


@dataclass(frozen=True)
class Size:
    checkpoint_bytes: int  # uploaded, in FILES files
    upload_repetitions: int
    trials: int  # of the GC experiment
    per_trial: int  # checkpoints of each trial
    gc_repetitions: int


FULL = Size(checkpoint_bytes=1 << 30, upload_repetitions=5, trials=100, per_trial=100,
            gc_repetitions=3)
QUICK = Size(checkpoint_bytes=128 << 20, upload_repetitions=2, trials=20, per_trial=50,
             gc_repetitions=1)


# -- upload ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Upload:
    seconds: float
    cpu_seconds: float  # this process's CPU (every thread; moto runs in another process)
    server_cpu_seconds: float  # moto's


@contextmanager
def moto_server() -> Iterator[tuple[str, int]]:
    """A moto S3 server in its own process: its URL and pid."""
    process = subprocess.Popen([sys.executable, "-c", MOTO_SERVER], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True)
    assert process.stdin is not None and process.stdout is not None  # both are pipes
    try:
        url = process.stdout.readline().strip()
        expect(url.startswith("http://"), f"moto's server did not start (it printed {url!r})")
        yield url, process.pid
    finally:
        process.stdin.close()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def cpu_seconds(pid: int) -> float:
    """The CPU time (user + system) the process has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def peak_rss_mib(pid: int) -> float:
    """The process's peak resident memory (VmHWM), MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def make_checkpoint(parent: Path, total: int, files: int) -> Path:
    """A published checkpoint of `files` files of random bytes, `total` bytes in all, with
    its metadata.json (the fields the harness writes)."""
    path = parent / f"{NAME_PREFIX}{1:012d}-{secrets.token_hex(4)}"
    path.mkdir()
    digests = {}
    for n in range(files):
        share = total // files + (total % files if n == files - 1 else 0)
        digests[f"shard-{n}.bin"] = _write_random(path / f"shard-{n}.bin", share)
    document = {"step": 1, "time": time.time(), "trial_id": None, "attempt": 1, "rank": 0,
                "hparams": {}, "metadata": {}, "files": digests}
    (path / METADATA_FILE).write_bytes(json_bytes(document))
    expect(checkpoint_files.inspect(path).intact, f"the checkpoint made in {path} is not intact")
    return path


def _write_random(path: Path, size: int) -> str:
    digest = hashlib.sha256()
    with path.open("wb") as out:
        for start in range(0, size, WRITE_CHUNK):
            chunk = os.urandom(min(WRITE_CHUNK, size - start))
            digest.update(chunk)
            out.write(chunk)
    return digest.hexdigest()


def muster_transfer_config() -> TransferConfig:
    """The TransferConfig `S3._send` builds from its constructor's defaults."""
    defaults = {name: p.default for name, p in inspect.signature(S3).parameters.items()}
    return TransferConfig(multipart_threshold=defaults["multipart_threshold"],
                          multipart_chunksize=defaults["part_size"],
                          max_concurrency=defaults["max_concurrency"],
                          preferred_transfer_client="classic")


class ForwardOnly:
    """A file read once, in order, that cannot seek: what muster's `HashingReader` is to
    boto3, minus the hashing and the length check."""

    def __init__(self, raw: BinaryIO) -> None:
        self._raw = raw

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def read(self, size: int = -1) -> bytes:
        return self._raw.read(size)


class Uploads:
    """The upload arms, on one bucket: each call uploads one checkpoint once, checks the
    objects (keys and sizes) and deletes them, so that moto never holds more than one."""

    def __init__(self, url: str, server_pid: int) -> None:
        self.server_pid = server_pid
        self.client = boto3.session.Session(**CREDENTIALS).client("s3", endpoint_url=url)
        self.client.create_bucket(Bucket=BUCKET)
        self.backend = S3(BUCKET, prefix=MUSTER_PREFIX, endpoint_url=url, region=REGION,
                          access_key="testing", secret_key="testing")

    def close(self) -> None:
        self.backend.close()
        self.client.close()

    def arms(self, checkpoint: Path) -> dict[str, Callable[[], Upload]]:
        muster_config = muster_transfer_config()
        return {
            MUSTER: functools.partial(self.muster, checkpoint),
            BOTO3_DEFAULT: functools.partial(self.upload_file, checkpoint, TransferConfig()),
            BOTO3_MUSTER_CONFIG: functools.partial(self.upload_file, checkpoint, muster_config),
            FORWARD_ONLY: functools.partial(self.forward_only, checkpoint, muster_config),
        }

    def muster(self, checkpoint: Path) -> Upload:
        key = str(uuid.uuid4())
        stop = self._start()
        uploaded = upload_checkpoint(self.backend, checkpoint, key)
        sample = stop()
        expect(uploaded.files == len(_files(checkpoint)) - 1, f"muster uploaded {uploaded}")
        self._check_and_delete(checkpoint, f"{MUSTER_PREFIX}/{key}/")
        return sample

    def upload_file(self, checkpoint: Path, config: TransferConfig) -> Upload:
        prefix = f"boto3/{uuid.uuid4()}/"
        stop = self._start()
        for path in _files(checkpoint):
            self.client.upload_file(str(path), BUCKET, prefix + path.name, Config=config)
        sample = stop()
        self._check_and_delete(checkpoint, prefix)
        return sample

    def forward_only(self, checkpoint: Path, config: TransferConfig) -> Upload:
        prefix = f"forward-only/{uuid.uuid4()}/"
        stop = self._start()
        for path in _files(checkpoint):
            with path.open("rb") as source:
                self.client.upload_fileobj(ForwardOnly(source), BUCKET, prefix + path.name,
                                           Config=config)
        sample = stop()
        self._check_and_delete(checkpoint, prefix)
        return sample

    def _start(self) -> Callable[[], Upload]:
        """Start the clocks; the call returned stops them."""
        wall, mine = time.perf_counter(), time.process_time()
        server = cpu_seconds(self.server_pid)

        def stop() -> Upload:
            return Upload(time.perf_counter() - wall, time.process_time() - mine,
                          cpu_seconds(self.server_pid) - server)
        return stop

    def _check_and_delete(self, checkpoint: Path, prefix: str) -> None:
        pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET,
                                                                      Prefix=prefix)
        found = {item["Key"]: item["Size"] for page in pages for item in page.get("Contents", [])}
        wanted = {prefix + p.name: p.stat().st_size for p in _files(checkpoint)}
        expect(found == wanted, f"{prefix} holds {found}, not the checkpoint's {wanted}")
        self.client.delete_objects(Bucket=BUCKET, Delete={"Objects": [{"Key": k} for k in found]})
        expect(not self.client.list_multipart_uploads(Bucket=BUCKET).get("Uploads"),
               "a multipart upload was left open")


def _files(checkpoint: Path) -> list[Path]:
    """The checkpoint's files in muster's upload order: the listed ones, metadata.json last."""
    listed = sorted(p for p in checkpoint.iterdir() if p.name != METADATA_FILE)
    return [*listed, checkpoint / METADATA_FILE]


def time_uploads(root: Path, size: Size) -> dict[str, Any]:
    """Every upload arm, interleaved, after one warm-up run of each on a small checkpoint."""
    print(f"  writing a {size.checkpoint_bytes / 2**20:,.0f} MiB checkpoint", file=sys.stderr,
          flush=True)
    (root / "small").mkdir()
    (root / "big").mkdir()
    small = make_checkpoint(root / "small", FILES << 20, FILES)
    big = make_checkpoint(root / "big", size.checkpoint_bytes, FILES)
    with moto_server() as (url, pid):
        uploads = Uploads(url, pid)
        try:
            for warm_up in uploads.arms(small).values():
                warm_up()
            samples = interleave(uploads.arms(big), size.upload_repetitions)
        finally:
            uploads.close()
        moto_peak = peak_rss_mib(pid)
    inspect_s = [_timed(lambda: checkpoint_files.inspect(big)) for _ in range(3)]
    return {"samples": samples, "bytes": sum(p.stat().st_size for p in _files(big)),
            "inspect_s": inspect_s, "moto_peak_rss_mib": moto_peak}


def _timed(call: Callable[[], object]) -> float:
    started = time.perf_counter()
    call()
    return time.perf_counter() - started


# -- GC ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Collection:
    checkpoints: int
    deleted: int
    seed_s: float
    plan_s: list[float]
    collect_s: float
    again_s: float  # the second collect, which finds nothing to do
    floor_s: float  # shutil.rmtree of as many directories as the collection removed
    statements: int  # SQL statements the (first) collection sent
    commits: int  # and its transactions


class SqlCounter:
    """Counts the statements and commits on an engine: exact, however noisy the machine."""

    def __init__(self, engine: Engine) -> None:
        self.statements = self.commits = 0
        event.listen(engine, "before_cursor_execute", self._statement)
        event.listen(engine, "commit", self._commit)

    def _statement(self, *_: object) -> None:
        self.statements += 1

    def _commit(self, *_: object) -> None:
        self.commits += 1


def gc_config(storage: Path, trials: int) -> str:
    return yaml.safe_dump({
        "name": "checkpoint-gc", "description": "generated rows (benchmarks/checkpoint_storage.py)",
        "entrypoint": "python train.py",
        "hyperparameters": {"lr": {"type": "log", "minval": -4, "maxval": -1}},
        "searcher": {"name": "random", "metric": "val_loss", "smaller_is_better": True,
                     "max_trials": trials},
        "checkpoint_storage": {"type": "shared_fs", "path": str(storage)},
    }, sort_keys=False)


def seed_gc(store: Store, home: Home, storage: Path, size: Size) -> int:
    """One COMPLETED experiment of `size.trials` SUCCEEDED trials, each with `size.per_trial`
    stored checkpoints (in storage and in its run directory) and a validation of val_loss
    at each one's step. Returns the experiment's id."""
    text = gc_config(storage, size.trials)
    location = Location(type="shared_fs", path=str(storage)).to_json()
    rng = random.Random(16)
    with store.session_scope() as s:
        experiment = Experiment(name="checkpoint-gc", config=load_config(text).to_json_dict(),
                                config_yaml=text, context_dir="/nonexistent",
                                state=ExperimentState.COMPLETED, max_trials=size.trials,
                                ended_at=SEEDED_AT + 10_000)
        s.add(experiment)
        s.flush()
        trials = [Trial(experiment_id=experiment.id, number=n, state=TrialState.SUCCEEDED,
                        started_at=SEEDED_AT, ended_at=SEEDED_AT + 10_000)
                  for n in range(size.trials)]
        s.add_all(trials)
        s.flush()
        for trial in trials:
            steps = range(1, size.per_trial + 1)
            s.execute(insert(Checkpoint), [
                _stored_checkpoint(home, storage, location, trial, step) for step in steps])
            s.execute(insert(Metric), _validations(trial.id, steps, rng))
        return int(experiment.id)


def _stored_checkpoint(home: Home, storage: Path, location: dict[str, Any], trial: Trial,
                       step: int) -> dict[str, Any]:
    """Write one checkpoint (its file and metadata.json) into storage and into the trial's
    run directory; its row."""
    name, key = f"{NAME_PREFIX}{step:012d}-{secrets.token_hex(4)}", str(uuid.uuid4())
    document = json_bytes({"step": step, "time": SEEDED_AT + step, "trial_id": trial.id,
                           "attempt": 1, "rank": 0, "hparams": {}, "metadata": {},
                           "files": {"model.bin": PAYLOAD_SHA256}})
    local = home.run_dir(trial.uuid).checkpoints / name
    for folder in (local, storage / key):
        folder.mkdir(parents=True)
        (folder / "model.bin").write_bytes(PAYLOAD)
        (folder / METADATA_FILE).write_bytes(document)
    return {"trial_id": trial.id, "uuid": key, "name": name, "path": str(local), "step": step,
            "attempt": 1, "rank": 0, "created_at": SEEDED_AT + step, "size_bytes": len(PAYLOAD),
            "file_count": 1, "intact": True, "state": CheckpointState.STORED,
            "storage": location, "stored_at": SEEDED_AT + step + 1}


def _validations(trial_id: int, steps: range, rng: random.Random) -> list[dict[str, Any]]:
    """Rank 0's val_loss at each step: a falling curve with noise, so that the best one is
    often not the latest."""
    floor, pace = rng.uniform(0.1, 0.5), rng.uniform(5, 50)
    return [{"trial_id": trial_id, "attempt": 1, "rank": 0, "kind": MetricKind.VALIDATION,
             "step": step, "time": SEEDED_AT + step,
             "values": {"val_loss": floor + 2.0 ** (-step / pace) + rng.gauss(0.0, 0.02)}}
            for step in steps]


def collect_once(backend: str, root: Path, size: Size) -> Collection:
    """Seed a fresh store and storage, then time planning, collection and a second one."""
    where = root / f"gc-{secrets.token_hex(4)}"
    where.mkdir()
    try:
        with fresh_store(backend, where) as store:
            home, storage = Home(where / "home").ensure(), where / "storage"
            started = time.perf_counter()
            experiment_id = seed_gc(store, home, storage, size)
            seed_s = time.perf_counter() - started
            worker = StorageWorker(store, home)
            plan_s = [_timed(lambda: worker.plan_for(experiment_id))
                      for _ in range(PLAN_REPETITIONS)]
            counter = SqlCounter(store.engine)
            started = time.perf_counter()
            planned = worker.collect(experiment_id)
            collect_s = time.perf_counter() - started
            statements, commits = counter.statements, counter.commits
            started = time.perf_counter()
            again = worker.collect(experiment_id)
            again_s = time.perf_counter() - started
            deleted = check_collected(store, home, storage, experiment_id, planned, again)
        floor_s = rmtree_floor(where / "floor", 2 * deleted)  # storage's copy and the run dir's
    finally:
        shutil.rmtree(where, ignore_errors=True)
    return Collection(len(planned), deleted, seed_s, plan_s, collect_s, again_s, floor_s,
                      statements, commits)


def check_collected(store: Store, home: Home, storage: Path, experiment_id: int,
                    planned: list[PlannedCheckpoint], again: list[PlannedCheckpoint]) -> int:
    """Stop unless exactly the planned deletions happened, in the store, in storage and in
    the run directories, with an event each, and the second collect kept the rest; the
    number deleted."""
    kept = [p for p in planned if p.keep]
    deleted = len(planned) - len(kept)
    expect(deleted > 0 and bool(kept), f"the plan deletes {deleted} of {len(planned)}")
    with store.session_scope() as s:
        states = Counter(s.scalars(select(Checkpoint.state)))
        events = s.scalar(select(func.count()).select_from(Event).where(
            Event.experiment_id == experiment_id,
            Event.reason == EventReason.CHECKPOINT_DELETED))
        left = set(s.scalars(select(Checkpoint.uuid).where(
            Checkpoint.state != CheckpointState.DELETED)))
    expect(states == {CheckpointState.DELETED: deleted,
                      CheckpointState.STORED: len(kept)}, f"rows end as {dict(states)}")
    expect(events == deleted, f"{events} deletion events for {deleted} deletions")
    expect({p.name for p in storage.iterdir()} == left, "storage holds other checkpoints")
    local = sum(len(checkpoint_files.published(home.run_dir(d.name).checkpoints))
                for d in home.runs_dir.iterdir())
    expect(local == len(kept), f"the run directories hold {local} checkpoints, not {len(kept)}")
    expect(sorted(p.id for p in again if p.keep) == sorted(p.id for p in kept)
           and len(again) == len(kept), "the second collect changed the plan")
    return deleted


def rmtree_floor(folder: Path, directories: int) -> float:
    """Seconds to remove `directories` directories of a checkpoint's two small files, one
    `shutil.rmtree` each: the file-system work of a collection, alone."""
    document = json_bytes({"files": {"model.bin": PAYLOAD_SHA256}})
    paths = [folder / f"{n:06d}" for n in range(directories)]
    for path in paths:
        path.mkdir(parents=True)
        (path / "model.bin").write_bytes(PAYLOAD)
        (path / METADATA_FILE).write_bytes(document)
    started = time.perf_counter()
    for path in paths:
        shutil.rmtree(path)
    return time.perf_counter() - started


def time_collections(root: Path, size: Size) -> dict[str, list[Collection]]:
    backends = ["sqlite", *(["postgresql"] if postgres_answers() else [])]
    count = size.trials * size.per_trial
    print(f"  GC of {count:,} checkpoints on {', '.join(backends)}", file=sys.stderr, flush=True)
    arms: dict[str, Callable[[], Any]] = {
        b: functools.partial(collect_once, b, root, size) for b in backends}
    return interleave(arms, size.gc_repetitions)



# -- report ------------------------------------------------------------------------------------

def run(quick: bool, size: int | None = None) -> Outcome:
    chosen = QUICK if quick else FULL
    if size is not None:
        chosen = Size(size, chosen.upload_repetitions, chosen.trials, chosen.per_trial,
                      chosen.gc_repetitions)
    with tempfile.TemporaryDirectory(prefix="muster-bench-checkpoints-") as tmp:
        uploads = time_uploads(Path(tmp), chosen)
        collections = time_collections(Path(tmp), chosen)
    upload_tables, upload_targets, upload_notes = _upload_outcome(uploads, chosen)
    gc_table, gc_targets, gc_notes = _gc_outcome(collections, chosen)
    data = {"upload": {"bytes": uploads["bytes"], "inspect_s": uploads["inspect_s"],
                       "moto_peak_rss_mib": uploads["moto_peak_rss_mib"],
                       "samples": {k: [asdict(u) for u in v]
                                   for k, v in uploads["samples"].items()}},
            "gc": {k: [asdict(c) for c in v] for k, v in collections.items()}}
    return Outcome(NAME, [*upload_tables, gc_table], [*upload_targets, *gc_targets],
                   [*upload_notes, *gc_notes], data)


def _ratios(samples: dict[str, list[Upload]], arm: str) -> list[float]:
    """muster's throughput over `arm`'s, per repetition (the runs of one repetition ran
    back to back)."""
    return [other.seconds / mine.seconds for mine, other in zip(samples[MUSTER], samples[arm],
                                                                 strict=True)]


def _upload_outcome(uploads: dict[str, Any], size: Size
                    ) -> tuple[list[Table], list[Target], list[str]]:
    samples: dict[str, list[Upload]] = uploads["samples"]
    megabytes = uploads["bytes"] / 1e6
    rows = []
    for arm, runs in samples.items():
        seconds = median([u.seconds for u in runs])
        versus = "" if arm == MUSTER else f"{median(_ratios(samples, arm)):.0%}"
        rows.append([arm, str(len(runs)), f"{seconds:.2f}", f"{megabytes / seconds:.0f}",
                     f"{median([u.cpu_seconds for u in runs]):.2f}",
                     f"{median([u.server_cpu_seconds for u in runs]):.2f}", versus])
    mib = size.checkpoint_bytes / 2**20
    table = Table(f"(o) uploading a {mib:,.0f} MiB checkpoint ({FILES} files + metadata.json) "
                  "to S3 (moto, 127.0.0.1): medians",
                  ["how", "runs", "s", "MB/s", "client CPU s", "moto CPU s", "**muster / this**"],
                  rows)
    ratio = median(_ratios(samples, BOTO3_DEFAULT))
    targets = [Target(f"(o) upload: muster ≥ {UPLOAD_TARGET:.0%} of boto3 `upload_file`'s "
                      "throughput (default TransferConfig)", f"{ratio:.0%}",
                      ratio >= UPLOAD_TARGET)]
    return [table], targets, _upload_notes(uploads, size)


def _upload_notes(uploads: dict[str, Any], size: Size) -> list[str]:
    samples: dict[str, list[Upload]] = uploads["samples"]
    muster_s = median([u.seconds for u in samples[MUSTER]])
    inspect_s = median(uploads["inspect_s"])
    per_run = ", ".join(f"{r:.0%}" for r in _ratios(samples, BOTO3_DEFAULT))
    config = muster_transfer_config()
    file_bytes = size.checkpoint_bytes // FILES
    single = "" if file_bytes >= config.multipart_threshold else (
        f" Each file ({file_bytes >> 20} MiB) is below muster's multipart threshold, so "
        "muster's TransferConfig sends it in one PUT.")
    return [
        "muster / this: this arm's seconds over muster's in the same repetition, median over "
        f"the repetitions (against the default TransferConfig, run by run: {per_run}). "
        "client CPU: this process's CPU seconds in all its threads; moto CPU: the server "
        "process's (from /proc), on the same CPUs.",
        f"muster's TransferConfig: {_describe(config)}; boto3's default: "
        f"{_describe(TransferConfig())}. muster sends each file through a forward-only "
        "`HashingReader` (the SHA-256 of the bytes sent, compared with metadata.json) with "
        f"boto3's default per-request checksum (CRC32), as the other arms.{single} Over HTTP "
        "(moto here) botocore also hashes every request body with SHA-256 to sign it, in "
        "every arm; over HTTPS to AWS it sends the body unsigned.",
        f"`checkpoint_files.inspect` of the checkpoint alone: {inspect_s:.2f} s, "
        f"{inspect_s / muster_s:.0%} of muster's median upload (what a check of every file "
        "before the upload would add; `upload_checkpoint` no longer does one: each file is "
        "checked as it is sent).",
        f"Every run's objects had the checkpoint's keys and sizes and were deleted after it; "
        f"moto's peak memory: {uploads['moto_peak_rss_mib']:,.0f} MiB.",
    ]


def _describe(config: TransferConfig) -> str:
    return (f"threshold {config.multipart_threshold >> 20} MiB, parts of "
            f"{config.multipart_chunksize >> 20} MiB, {config.max_concurrency} threads")


def _gc_outcome(collections: dict[str, list[Collection]], size: Size
                ) -> tuple[Table, list[Target], list[str]]:
    rows, targets = [], []
    for backend, runs in collections.items():
        collect_s = median([c.collect_s for c in runs])
        deleted = median([c.deleted for c in runs])
        rows.append([backend, str(len(runs)), f"{runs[0].checkpoints:,}", f"{deleted:,.0f}",
                     f"{median([median(c.plan_s) for c in runs]):.2f}", f"{collect_s:.1f}",
                     f"{1000 * collect_s / deleted:.2f}",
                     f"{median([c.again_s for c in runs]):.2f}",
                     f"{median([c.floor_s for c in runs]):.2f}",
                     f"{runs[0].statements / runs[0].deleted:.1f}",
                     f"{runs[0].commits / runs[0].deleted:.1f}"])
        targets.append(Target(f"(o) GC of {runs[0].checkpoints:,} checkpoints on {backend}: "
                              f"`collect` ≤ {GC_TARGET_S:.0f} s", f"{collect_s:.1f} s",
                              collect_s <= GC_TARGET_S))
    count = size.trials * size.per_trial
    table = Table(f"(o) GC of {count:,} stored checkpoints ({size.trials} ended trials x "
                  f"{size.per_trial}, shared_fs): median seconds",
                  ["store", "runs", "checkpoints", "deleted", "plan_for", "collect",
                   "ms per deletion", "second collect", "floor: rmtree of as many dirs",
                   "SQL statements per deletion", "commits per deletion"], rows)
    seeds = ", ".join(f"{b} {median([c.seed_s for c in runs]):.1f} s"
                      for b, runs in collections.items())
    notes = ["GC policy: the default (each trial's latest 1 and best 1 by val_loss). collect = "
             "plan, record (`deleting`), then per checkpoint: delete it from storage "
             "(metadata.json first, then a listing to confirm), remove its run-directory copy, "
             "record `deleted` with an event. floor: `shutil.rmtree` of twice as many "
             "directories as deleted (storage's copy and the run directory's), nothing else.",
             f"Every collection deleted exactly what its plan said, in the store, in storage and "
             f"in the run directories, with an event each. Seeding took {seeds}."]
    return table, targets, notes


def main() -> int:
    """Run alone (`.venv/bin/python benchmarks/checkpoint_storage.py [--quick] [--size 4GiB]`),
    reported and saved as `run.py --only checkpoint_storage` does."""
    import run as benchmarks

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--size", type=parse_size,
                        help="the uploaded checkpoint's size, e.g. 4GiB (default: 1GiB, "
                             "128MiB with --quick)")
    args, rest = parser.parse_known_args()
    benchmarks.BENCHMARKS[NAME] = functools.partial(run, size=args.size)
    return benchmarks.main(["--only", NAME, *rest])


if __name__ == "__main__":
    sys.exit(main())
