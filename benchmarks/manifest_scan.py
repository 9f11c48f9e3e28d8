"""(d) The data manifest of 100,000 small files, against `find` and `du` on the same tree.

`scan_manifest(dir, [".png"], "from_dirs")` counts the files, their bytes, their classes
and fingerprints (relative path, size, mtime_ns) of every file. Its side-by-side baselines:
`find DIR -type f | wc -l` (a walk that reads only the directory listings, no stat: a lower
bound), `du -sb DIR` (a walk that stats every file, as the scan does), and
`find -printf '%s %T@ %P' | sort | sha256sum` (the shell's version of the whole manifest:
stat, sort, hash). The first scan after creating the files is reported apart: the files'
inodes are still cached from their creation, so it is cold-ish, not cold (dropping the
kernel's caches would disturb the machine's other tenants). The tree is deleted afterwards.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from measure import expect, interleave, median
from report import Outcome, Table, Target

from muster.supervise.manifest import Manifest, scan_manifest

CLASSES = 10
FILE_BYTES = 100
TARGET_S = 5.0


def make_tree(root: Path, files: int) -> None:
    """`files` files of FILE_BYTES bytes, spread over CLASSES class folders."""
    per_class = files // CLASSES
    for label in range(CLASSES):
        folder = root / f"class-{label}"
        folder.mkdir()
        for n in range(per_class):
            (folder / f"{n:06d}.png").write_bytes(b"%06d" % n + b"x" * (FILE_BYTES - 6))


def scan_arm(root: Path, files: int) -> Callable[[], float]:
    def arm() -> float:
        start = time.perf_counter()
        manifest = scan_manifest(root, [".png"], "from_dirs")
        elapsed = time.perf_counter() - start
        check_manifest(manifest, files)
        return elapsed
    return arm


def check_manifest(manifest: Manifest, files: int) -> None:
    expect(manifest.file_count == files, f"the scan counted {manifest.file_count} of {files}")
    expect(manifest.total_bytes == files * FILE_BYTES, "the scan summed the wrong bytes")
    per_class = {f"class-{n}": files // CLASSES for n in range(CLASSES)}
    expect(manifest.classes == per_class, f"the scan's classes are wrong: {manifest.classes}")


def shell_arm(script: str, root: Path, check: Callable[[str], bool]) -> Callable[[], float]:
    """Time `bash -c script` with DIR set to `root`; its stdout must pass `check`."""
    def arm() -> float:
        start = time.perf_counter()
        done = subprocess.run(["bash", "-c", script, "bench", str(root)], capture_output=True,
                              text=True, check=True, env={"LC_ALL": "C", "PATH": "/usr/bin:/bin"})
        elapsed = time.perf_counter() - start
        expect(check(done.stdout), f"`{script}` printed {done.stdout.strip()!r}")
        return elapsed
    return arm


def run(quick: bool) -> Outcome:
    files = 10_000 if quick else 100_000
    repetitions = 3 if quick else 5
    with tempfile.TemporaryDirectory(prefix="muster-bench-manifest-") as tmp:
        root = Path(tmp) / "data"
        root.mkdir()
        print(f"  creating {files:,} files", file=sys.stderr, flush=True)
        started = time.perf_counter()
        make_tree(root, files)
        created_s = time.perf_counter() - started
        first_s = scan_arm(root, files)()
        arms = {
            "scan_manifest": scan_arm(root, files),
            "find | wc -l": shell_arm('find "$1" -type f | wc -l', root,
                                      lambda out: int(out) == files),
            "du -sb": shell_arm('du -sb "$1"', root,
                                lambda out: int(out.split()[0]) >= files * FILE_BYTES),
            "find -printf | sort | sha256sum": shell_arm(
                "find \"$1\" -type f -printf '%s %T@ %P\\n' | sort | sha256sum", root,
                lambda out: len(out.split()[0]) == 64),
        }
        samples = interleave(arms, repetitions)
        shutil.rmtree(root)
    return _outcome(files, created_s, first_s, samples)


def _outcome(
    files: int, created_s: float, first_s: float, samples: dict[str, list[float]]
) -> Outcome:
    scan_s = median(samples["scan_manifest"])
    # a pipe inside a Markdown table cell must be escaped, also inside backticks
    rows = [[f"`{name}`".replace("|", "\\|") if name != "scan_manifest"
             else "muster `scan_manifest`",
             str(len(runs)), f"{median(runs):.3f}", f"{min(runs):.3f}", f"{max(runs):.3f}",
             f"{median(runs) / scan_s:.2f}"]
            for name, runs in samples.items()]
    rows.insert(0, ["muster `scan_manifest`, first scan after creating the files", "1",
                    f"{first_s:.3f}", "", "", f"{first_s / scan_s:.2f}"])
    table = Table(f"(d) data manifest of {files:,} files in {CLASSES} class folders (seconds)",
                  ["method", "runs", "median s", "min s", "max s", "/ scan_manifest"], rows)
    targets = [Target(f"(d) manifest of {files:,} files ≤ {TARGET_S:.0f} s (median)",
                      f"{scan_s:.2f} s", scan_s <= TARGET_S)]
    notes = [f"Creating the {files:,} files of {FILE_BYTES} bytes took {created_s:.1f} s; "
             f"scan_manifest's rate: {files / scan_s:,.0f} files/s.",
             "Every scan counted every file, byte and class; every `find | wc -l` printed "
             f"{files:,}."]
    data = {"samples_s": samples, "first_scan_s": first_s, "files": files,
            "create_s": created_s}
    return Outcome("manifest_scan", [table], targets, notes, data)
