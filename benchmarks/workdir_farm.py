"""A trial's working directory for a 9,000-file context: a copy per trial against the
hard-link farm made under `run_as` (`prepare_workdir(..., link_all=True)`).

For each arm, TRIALS working directories are made from one context snapshot of FILES small
files in DIRS directories (the audit's batch: 9,089 files per trial run directory), and
the benchmark reports the median seconds per trial and the inodes each trial's directory
adds: its directories, and every file that is not a link to the snapshot's (counted by
inode number, so other tenants of the disk do not disturb the count). The copy arm clones
where the file system can (a reflink still costs an inode per file) and copies where it
cannot. Everything is made under a temporary directory and deleted afterwards.

    .venv/bin/python benchmarks/workdir_farm.py [TRIALS]
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from measure import expect, interleave, median

from muster.supervise.workdir import prepare_workdir

FILES = 9_000
DIRS = 90
TRIALS = 10


def make_context(root: Path) -> None:
    """FILES files of 200 bytes in DIRS directories, as a source tree would hold them."""
    for d in range(DIRS):
        folder = root / f"pkg{d:03d}"
        folder.mkdir(parents=True)
        for n in range(FILES // DIRS):
            (folder / f"module{n:03d}.py").write_bytes(b"# %06d\n" % n + b"x" * 192)


def new_inodes(workdir: Path, snapshot: set[int]) -> int:
    """The inodes `workdir` adds: itself, its directories, and files not linked from
    `snapshot`."""
    count = 1
    for here, dirs, files in os.walk(workdir):
        count += len(dirs)
        count += sum(os.lstat(os.path.join(here, name)).st_ino not in snapshot
                     for name in files)
    return count


def arm(context: Path, runs: Path, link_all: bool, sizes: list[int]) -> Callable[[], float]:
    snapshot = {os.lstat(os.path.join(here, name)).st_ino
                for here, _, files in os.walk(context) for name in files}

    def one_trial() -> float:
        workdir = runs / f"{'farm' if link_all else 'copy'}-{len(sizes)}" / "workdir"
        start = time.perf_counter()
        expect(prepare_workdir(context, workdir, link_all=link_all), "no workdir was made")
        elapsed = time.perf_counter() - start
        sizes.append(new_inodes(workdir, snapshot))
        return elapsed
    return one_trial


def main(trials: int) -> None:
    top = Path(tempfile.mkdtemp(prefix="muster-workdir-farm-"))
    try:
        context = top / "context"
        print(f"  creating a context of {FILES:,} files in {DIRS} directories",
              file=sys.stderr, flush=True)
        make_context(context)
        inodes: dict[str, list[int]] = {"copy": [], "farm": []}
        seconds = interleave({"copy": arm(context, top / "runs", False, inodes["copy"]),
                              "farm": arm(context, top / "runs", True, inodes["farm"])},
                             trials)
        print(f"{trials} trials each, one {FILES:,}-file context, on {top}")
        print(f"{'arm':<6} {'s per trial':>12} {'inodes per trial':>17}")
        for name in ("copy", "farm"):
            print(f"{name:<6} {median(seconds[name]):>12.3f} {median(inodes[name]):>17,.0f}")
        print(f"farm / copy: time {median(seconds['farm']) / median(seconds['copy']):.2f}, "
              f"inodes {median(inodes['farm']) / median(inodes['copy']):.4f}")
    finally:
        shutil.rmtree(top)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else TRIALS)
