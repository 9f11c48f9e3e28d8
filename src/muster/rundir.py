"""The run directory: the one contract of every file muster, its shims and the harness share.

```
$MUSTER_HOME/runs/<trial-uuid>/                RunDir (MUSTER_RUN_DIR; ./muster-run off-platform)
  checkpoints/step-<step>-<hex>/               the trial's checkpoints (muster.checkpoint_files)
  source/<checkpoint name>/                    a warm start's checkpoint, copied in at a launch
                                               (MUSTER_SOURCE_CHECKPOINT) [server]
  workdir/                                     its own copy of the context: every attempt's cwd
  env/                                         its own environment layer: every attempt's python
  attempt-<n>.outside.json                     the attempt seen from outside, at its launch [server]
  attempt-<n>/                                 AttemptDir, one per launch of the replica set
    hparams.json                               the trial's hyperparameters (MUSTER_HPARAMS)
    restarts/<file>.<incarnation>              an ended incarnation's files (restart in place)
    rank-<r>.<suffix>                          RankFiles: one replica's files, by `RankFile`
    evidence/<bundle>/rank-<r>/                one rank's evidence bundle (launch.evidence)
```

Every reader and writer builds its paths here; no other module spells a file name of the
run directory. What each file holds, and who writes it, is docs/run-directory.md. Standard
library only: the harness imports this inside the user's training process.
"""

from __future__ import annotations

import functools
import os
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

__all__ = [
    "BUNDLE_ID", "CHECKPOINTS", "CONTROL_FILES", "EVIDENCE", "LOCAL_RUN_DIR", "AttemptDir",
    "Hparams", "RankFile", "RankFiles", "RunDir", "every_rank_file", "new_bundle_id",
]

# hparams.json: the trial's hyperparameters, free JSON (the names are the experiment's).
Hparams = dict[str, Any]

LOCAL_RUN_DIR = "muster-run"  # the run directory of a run off the platform, in its cwd
CHECKPOINTS = "checkpoints"
WORKDIR = "workdir"
ARTIFACTS = "artifacts"  # the server's copies of the final attempt's artifacts (muster.artifacts)
SOURCE = "source"  # a warm start's checkpoint (muster.checkpoint_storage.sources)
ENV = "env"
EVIDENCE = "evidence"
# An evidence bundle's id, `<UTC yyyymmddThhmmssZ>-<reason>`: a request file names it, so
# nothing but this shape ever becomes a directory name (no separators, no `..`).
BUNDLE_ID = re.compile(r"[0-9]{8}T[0-9]{6}Z-[a-z]{1,32}")


def new_bundle_id(reason: str, now: float | None = None) -> str:
    """A new bundle's id: `<UTC yyyymmddThhmmssZ>-<reason>`, which sorts by time and says why.

    Raises:
        ValueError: `reason` is not 1 to 32 lowercase letters.
    """
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(time.time() if now is None else now))
    bundle = f"{stamp}-{reason}"
    if not BUNDLE_ID.fullmatch(bundle):
        raise ValueError(f"an evidence bundle's reason is 1 to 32 lowercase letters, "
                         f"got {reason!r}")
    return bundle
_ATTEMPT = re.compile(r"attempt-([0-9]+)")
_RANK = re.compile(r"rank-([0-9]+)\.(.+)")


class RankFile(str, Enum):
    """The files of one replica, by the suffix after `rank-<r>.`; the writer in brackets."""

    LOG = "log"  # the training output, byte-exact [shim]
    INDEX = "index"  # "<log offset> <unix time>" per chunk copied [shim]
    DROPPED = "log.dropped"  # what resources.log_limit dropped from the log (log_limit) [shim]
    SPEC = "spec.json"  # the ReplicaSpec [launcher]
    LAUNCH = "launch.json"  # the shim's identity and launch time [launcher]
    STATUS = "shim.json"  # shim and child identities, process group, start time [shim]
    ALIVE = "alive"  # touched every second while the shim runs: its mtime, last seen alive [shim]
    ACTIVE = "active"  # "<last output> <last CPU use>": silence_timeout's evidence [shim]
    EXIT = "exit.json"  # the ExitRecord, after the log is synced [shim]
    STOP = "stop"  # a stop request, with its grace [launcher]
    SHIM_LOG = "shim.log"  # the shim's own diagnostics (its stderr) [shim]
    STALLED = "stalled.json"  # why muster stopped it for making no progress [supervisor]
    STANDBY_GO = "standby-go.json"  # a warm standby's promotion [supervisor]
    HEARTBEAT = "heartbeat.json"  # the time of the last progress: the check-in [harness]
    METRICS = "metrics.jsonl"  # one report per line (muster.metrics_lines) [harness]
    SYSTEM = "system.jsonl"  # resource samples, kind "system" (muster.system_metrics) [shim]
    SAMPLES = "samples.json"  # samples seen per epoch [harness]
    STOP_ACK = "stop-ack.json"  # when the loop first saw muster's SIGTERM [harness]
    SNAPSHOT = "snapshot.json"  # what the rank is made of, at init and at its end [harness]
    DIAGNOSTICS = "diagnostics.jsonl"  # its samplers, passes, gradient samples [harness]
    PLAN = "plan.json"  # how far the run is planned to go, ctx.plan() [harness]
    SAVE_FAILURES = "save-failures.json"  # checkpoint saves that failed [harness]
    DUMP = "dump.json"  # a request for an evidence bundle: {bundle, reason, requested_at} [server]
    STACK_SIGNAL = "stack-signal.json"  # the signal that makes the rank print its stacks [harness]
    FAULTHANDLER = "faulthandler.txt"  # what it printed on that signal (faulthandler) [harness]
    # Room the shim keeps for its exit record: on a full disk it is removed, and the
    # record written in its place [shim]
    EXIT_RESERVE = "exit.reserve"
    DRILL_NAN = "drill-nan"  # a drill's request: make the next reported loss NaN [server]
    DRILL_NAN_DONE = "drill-nan.done"  # the request, once applied: {step, metric, kind} [harness]


# An ended incarnation's control files, moved aside before a restart in place; its log and
# index stay where they are, and the next incarnation appends to them.
CONTROL_FILES = (RankFile.SPEC, RankFile.LAUNCH, RankFile.STATUS, RankFile.ALIVE,
                 RankFile.ACTIVE, RankFile.EXIT,
                 RankFile.STOP, RankFile.SHIM_LOG, RankFile.STALLED, RankFile.HEARTBEAT,
                 RankFile.SNAPSHOT, RankFile.DIAGNOSTICS, RankFile.DUMP, RankFile.STACK_SIGNAL,
                 RankFile.FAULTHANDLER)


@dataclass(frozen=True)
class RunDir:
    """A trial's run directory: its attempts and its checkpoints."""

    path: Path

    @property
    def checkpoints(self) -> Path:
        return self.path / CHECKPOINTS

    @property
    def workdir(self) -> Path:
        """The trial's own copy of its experiment's context: every attempt's cwd."""
        return self.path / WORKDIR

    @property
    def artifacts(self) -> Path:
        """The artifact sets the server copied out of the working directory, one per final
        attempt (`artifacts/attempt-<n>/`, `muster.artifacts`)."""
        return self.path / ARTIFACTS

    @property
    def source(self) -> Path:
        """Where the checkpoint a warm-started trial starts from is copied (`source/<its
        name>/`): not among the trial's own checkpoints, which it never counts as."""
        return self.path / SOURCE

    @property
    def env(self) -> Path:
        """The trial's own environment layer (`muster.environments`): every attempt's
        `python`; what a script installs goes there."""
        return self.path / ENV

    def attempt(self, number: int) -> AttemptDir:
        return AttemptDir(self.path / f"attempt-{number}")

    def outside_snapshot(self, number: int) -> Path:
        """What muster saw of attempt `number` from outside its process, at its launch
        (`muster.diagnostics`): the server's, beside the attempt's directory rather than in
        it, where a job under `run_as` may write."""
        return self.path / f"attempt-{number}.outside.json"

    def attempt_numbers(self) -> list[int]:
        """The attempts that have a directory here, in order."""
        try:
            names = os.listdir(self.path)
        except (FileNotFoundError, NotADirectoryError):
            return []
        return sorted(int(m[1]) for name in names if (m := _ATTEMPT.fullmatch(name)))


@dataclass(frozen=True)
class AttemptDir:
    """One attempt's directory: the hparams file and every replica's files."""

    path: Path

    @property
    def run(self) -> RunDir:
        return RunDir(self.path.parent)

    @property
    def hparams(self) -> Path:
        return self.path / "hparams.json"

    @property
    def restarts(self) -> Path:
        return self.path / "restarts"

    @property
    def evidence(self) -> Path:
        """Every evidence bundle of the attempt, one directory per bundle id."""
        return self.path / EVIDENCE

    def evidence_of(self, bundle: str, rank: int) -> Path:
        """Where rank `rank`'s part of bundle `bundle` is collected.

        Raises:
            ValueError: `bundle` is not a bundle id (`BUNDLE_ID`).
        """
        if not BUNDLE_ID.fullmatch(bundle):
            raise ValueError(f"an evidence bundle id looks like '20250101T120000Z-requested', "
                             f"got {bundle!r}")
        return self.evidence / bundle / f"rank-{rank}"

    def rank(self, rank: int) -> RankFiles:
        return RankFiles(self.path, rank)

    def ranks_with(self, kind: RankFile) -> list[tuple[int, Path]]:
        """(rank, path) of every `rank-<r>.<kind>` file in the attempt, by rank; none while
        the directory does not exist."""
        return [(rank, path) for _, rank, path in self.rank_files((kind,))]

    def rank_files(self, kinds: tuple[RankFile, ...]) -> list[tuple[RankFile, int, Path]]:
        """(kind, rank, path) of every rank's file of one of `kinds`, by kind (in the order
        of `kinds`) then rank, from one listing of the directory; none while it does not
        exist."""
        try:
            entries = list(os.scandir(self.path))
        except (FileNotFoundError, NotADirectoryError):
            return []
        order = {kind.value: (i, kind) for i, kind in enumerate(kinds)}
        found = [(order[m[2]], int(m[1]), Path(e.path)) for e in entries
                 if (m := _RANK.fullmatch(e.name)) and m[2] in order
                 and e.is_file(follow_symlinks=False)]
        return [(kind, rank, path) for (_, kind), rank, path in sorted(found)]


@functools.lru_cache(maxsize=4096)  # a pass's live ranks' files, many times over
def _rank_path(attempt_dir: Path, rank: int, kind: RankFile) -> Path:
    """A rank's file, made once: a pass asks for each live replica's files every time, and
    joining a path costs more than finding it again (pathlib parses every join)."""
    return attempt_dir / f"rank-{rank}.{kind.value}"


@dataclass(frozen=True)
class RankFiles:
    """The files of one replica (rank) of one attempt."""

    attempt_dir: Path
    rank: int

    def path(self, kind: RankFile) -> Path:
        return _rank_path(self.attempt_dir, self.rank, kind)

    def archived(self, kind: RankFile, incarnation: int) -> Path:
        """Where `kind` of incarnation `incarnation` is kept once it has ended."""
        return self.attempt_dir / "restarts" / f"{self.path(kind).name}.{incarnation}"

    @property
    def log(self) -> Path:
        return self.path(RankFile.LOG)

    @property
    def index(self) -> Path:
        return self.path(RankFile.INDEX)

    @property
    def dropped(self) -> Path:
        return self.path(RankFile.DROPPED)

    @property
    def spec(self) -> Path:
        return self.path(RankFile.SPEC)

    @property
    def launch(self) -> Path:
        return self.path(RankFile.LAUNCH)

    @property
    def status(self) -> Path:
        return self.path(RankFile.STATUS)

    @property
    def alive(self) -> Path:
        return self.path(RankFile.ALIVE)

    @property
    def active(self) -> Path:
        return self.path(RankFile.ACTIVE)

    @property
    def exit(self) -> Path:
        return self.path(RankFile.EXIT)

    @property
    def exit_reserve(self) -> Path:
        return self.path(RankFile.EXIT_RESERVE)

    @property
    def stop(self) -> Path:
        return self.path(RankFile.STOP)

    @property
    def shim_log(self) -> Path:
        return self.path(RankFile.SHIM_LOG)

    @property
    def flight_recorder(self) -> Path:
        """The prefix of the dumps torch's flight recorder writes for this rank (a dump is
        `<prefix><rank>`); the evidence bundle collects them."""
        return self.attempt_dir / f"rank-{self.rank}.flight-"

    @property
    def stalled(self) -> Path:
        return self.path(RankFile.STALLED)

    @property
    def standby_go(self) -> Path:
        return self.path(RankFile.STANDBY_GO)

    @property
    def heartbeat(self) -> Path:
        return self.path(RankFile.HEARTBEAT)

    @property
    def metrics(self) -> Path:
        return self.path(RankFile.METRICS)

    @property
    def system(self) -> Path:
        return self.path(RankFile.SYSTEM)

    @property
    def samples(self) -> Path:
        return self.path(RankFile.SAMPLES)

    @property
    def stop_ack(self) -> Path:
        return self.path(RankFile.STOP_ACK)

    @property
    def snapshot(self) -> Path:
        return self.path(RankFile.SNAPSHOT)

    @property
    def diagnostics(self) -> Path:
        return self.path(RankFile.DIAGNOSTICS)

    @property
    def plan(self) -> Path:
        return self.path(RankFile.PLAN)

    @property
    def save_failures(self) -> Path:
        return self.path(RankFile.SAVE_FAILURES)

    @property
    def dump(self) -> Path:
        return self.path(RankFile.DUMP)

    @property
    def stack_signal(self) -> Path:
        return self.path(RankFile.STACK_SIGNAL)

    @property
    def faulthandler(self) -> Path:
        return self.path(RankFile.FAULTHANDLER)

    @property
    def drill_nan(self) -> Path:
        return self.path(RankFile.DRILL_NAN)

    @property
    def drill_nan_done(self) -> Path:
        return self.path(RankFile.DRILL_NAN_DONE)


def every_rank_file(runs_dir: Path, kind: RankFile) -> Iterator[Path]:
    """Each replica's `kind` file under a home's runs directory: every trial, attempt, rank
    (what tools that clean up after a home, such as the tests, walk)."""
    try:
        trials = sorted(os.scandir(runs_dir), key=lambda e: e.name)
    except (FileNotFoundError, NotADirectoryError):
        return
    for trial in trials:
        run = RunDir(Path(trial.path))
        for number in run.attempt_numbers():
            for _, path in run.attempt(number).ranks_with(kind):
                yield path
