"""A venv layered over lower ones: each trial's own, and a built venv's inherited packages.

A layer is a venv of the real base interpreter (`bin/python` links to it) whose
site-packages holds `_muster_layers.pth`: one `site.addsitedir` per lower site-packages
directory, so the layer imports its own packages first, then the lower ones' (whose own
`.pth` files, editable installs included, are read too). `pip install` in a layer installs
into that layer alone: the lower ones are never written (invariant 8). `python` and `pip`
in a layer's `bin/` are the layer's; the lower layers' Python scripts (`torchrun`, `pip`)
are copied into it with a relocatable first line (`RELOCATABLE_HEADER`: the `python` beside
the script's own resolved path, as uv writes for `--relocatable`), so they run in the layer
too, and a layer made under one name runs the same under another: the registry makes the
next trial's layer ahead of time and renames it into place.

uv does not read a venv's lower layers (it looks at the venv's own site-packages only:
astral-sh/uv#4466), so a built venv that inherits gets a *stub* for each inherited
distribution: its metadata and a RECORD naming only the stub. uv then counts them as
installed (torch is not downloaded again), and one that it replaces removes only its stub.
"""

from __future__ import annotations

import importlib.metadata as md
import logging
import os
import re
import shutil
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from stat import S_ISREG

from muster.environments.interpreters import Interpreter

__all__ = ["LAYERS_PTH", "RELOCATABLE_HEADER", "Script", "lower_scripts", "site_packages",
           "write_layer", "write_stubs"]

log = logging.getLogger(__name__)

LAYERS_PTH = "_muster_layers.pth"
HARNESS_PTH = "_muster_harness.pth"
STUB_INSTALLER = "muster-inherited"
_MAX_SCRIPT_BYTES = 256 << 10
_SHEBANG_LIMIT = 127  # what the kernel reads of a `#!` line (BINPRM_BUF_SIZE - 1)
_PYTHON_NAME = re.compile(r"python[0-9.]*")
# The header uv and pip write for a long interpreter path (a shell re-executes the script).
_SH_EXEC = re.compile(r"^'''exec' (['\"])(?P<python>[^'\"]+)\1 \"\$0\" \"\$@\"$")
_SKIPPED = re.compile(r"(python[0-9.]*|activate.*|deactivate.*|pydoc.*)")
# A layer's scripts: /bin/sh runs the `python` beside the script's resolved path (a link to
# the script from elsewhere still finds its layer); Python reads the first two lines as a
# string. The same form as uv's `--relocatable` venvs.
RELOCATABLE_HEADER = (
    b"#!/bin/sh\n"
    b"'''exec' \"$(dirname -- \"$(realpath -- \"$0\")\")/python\" \"$0\" \"$@\"\n"
    b"' '''\n")


@dataclass(frozen=True)
class Script:
    """A lower layer's Python script, less its interpreter line(s)."""

    name: str
    body: bytes
    mode: int


def site_packages(root: Path, base: Interpreter) -> Path:
    return root / "lib" / base.lib_dir / "site-packages"


def write_layer(root: Path, base: Interpreter, lower_sites: Sequence[str],
                scripts: Iterable[Script], harness: Path | None) -> None:
    """Make `root` a venv of `base`'s binary layered over `lower_sites` (in that order),
    with `scripts` rebased onto its `python` (relocatable: `root` may be renamed) and
    `harness` on its path."""
    bin_dir = root / "bin"
    site = site_packages(root, base)
    bin_dir.mkdir(parents=True)
    site.mkdir(parents=True)
    (root / "pyvenv.cfg").write_text(
        f"home = {os.path.dirname(base.executable)}\n"
        "include-system-site-packages = false\n"
        f"version = {base.version}\n"
        f"executable = {base.executable}\n"
        "muster-layer = true\n")
    python = bin_dir / "python"
    python.symlink_to(base.executable)
    for alias in ("python3", base.lib_dir):
        (bin_dir / alias).symlink_to("python")
    write_pth(site, lower_sites, harness)
    write_scripts(bin_dir, scripts, RELOCATABLE_HEADER)


def write_pth(site: Path, lower_sites: Sequence[str], harness: Path | None) -> None:
    """The `.pth` files that put the lower layers (and the harness, with `muster.startup`)
    on the layer's path."""
    if lower_sites:
        (site / LAYERS_PTH).write_text("".join(
            f"import site; site.addsitedir({path!r})\n" for path in lower_sites))
    if harness is not None:
        # The harness's directory on the path, then what every process of a trial runs
        # first (`muster.startup`: `compat` and `integrations`).
        (site / HARNESS_PTH).write_text(f"{harness}\nimport muster.startup\n")


def write_scripts(bin_dir: Path, scripts: Iterable[Script], header: bytes | None = None) -> None:
    """Each script into `bin_dir` under `header` (by default a `#!` line naming the
    directory's own `python`); a name it has already is kept."""
    if header is None:
        header = interpreter_header(str(bin_dir / "python"))
    for script in scripts:
        target = bin_dir / script.name
        if target.exists() or target.is_symlink():
            continue
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, script.mode & 0o7777)
        with os.fdopen(fd, "wb") as out:
            out.write(header + script.body)


def interpreter_header(python: str) -> bytes:
    """A script's first line(s) that run it with `python`: a `#!` line, or for a path
    longer than the kernel reads, the `/bin/sh` form pip and uv write."""
    if len(python) + 2 <= _SHEBANG_LIMIT and " " not in python:
        return f"#!{python}\n".encode()
    return f"#!/bin/sh\n'''exec' \"{python}\" \"$0\" \"$@\"\n' '''\n".encode()


_scripts_cache: dict[str, tuple[int, list[Script]]] = {}
_scripts_lock = threading.Lock()


def lower_scripts(bin_dir: str) -> list[Script]:
    """The Python scripts of `bin_dir` run by an interpreter in it (remembered until the
    directory changes)."""
    try:
        stamp = os.stat(bin_dir).st_mtime_ns
    except OSError:
        return []
    with _scripts_lock:
        cached = _scripts_cache.get(bin_dir)
    if cached is not None and cached[0] == stamp:
        return cached[1]
    found = list(_read_scripts(Path(bin_dir)))
    with _scripts_lock:
        _scripts_cache[bin_dir] = (stamp, found)
    return found


def _read_scripts(bin_dir: Path) -> Iterable[Script]:
    try:
        entries = sorted(os.scandir(bin_dir), key=lambda e: e.name)
    except OSError as exc:
        log.warning("the scripts of %s are not rebased into new layers: %s", bin_dir, exc)
        return
    own = {str(bin_dir), os.path.realpath(bin_dir)}
    for entry in entries:
        if _SKIPPED.fullmatch(entry.name) or not entry.is_file(follow_symlinks=False):
            continue
        try:
            # Not through a link, nor a FIFO: under `run_as` a built venv's `bin/` is its
            # account's, which may swap a script for either after the listing.
            fd = os.open(entry.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            with os.fdopen(fd, "rb") as f:
                stat = os.fstat(fd)
                if (not S_ISREG(stat.st_mode) or stat.st_size > _MAX_SCRIPT_BYTES
                        or not stat.st_mode & 0o111):
                    continue
                data = f.read(_MAX_SCRIPT_BYTES)
        except OSError as exc:
            # It stays on PATH below the layer, run by its own (lower) interpreter.
            log.warning("%s is not rebased into new layers: %s", entry.path, exc)
            continue
        body = _body(data, own)
        if body is not None:
            yield Script(entry.name, body, stat.st_mode)


def _body(data: bytes, bin_dirs: set[str]) -> bytes | None:
    """The script after its interpreter line(s), when that interpreter is in `bin_dirs`."""
    if not data.startswith(b"#!"):
        return None
    lines = data.split(b"\n", 3)
    first = lines[0][2:].decode(errors="replace").strip()
    if first == "/bin/sh" and len(lines) >= 3:
        match = _SH_EXEC.match(lines[1].decode(errors="replace"))
        if match is None or lines[2].strip() != b"' '''":
            return None
        python, rest = match.group("python"), lines[3] if len(lines) > 3 else b""
    else:
        python, rest = first.split(" ", 1)[0], data.split(b"\n", 1)[1] if b"\n" in data else b""
    if os.path.dirname(python) not in bin_dirs or not _PYTHON_NAME.fullmatch(
            os.path.basename(python)):
        return None
    return rest


def write_stubs(site: Path, sites: Sequence[str]) -> int:
    """A stub in `site` for each distribution the `sites` hold (the first of each name, as
    imports find it) that `site` has none of; returns how many were written."""
    present = {_normalize(d.metadata["Name"] or "") for d in md.distributions(path=[str(site)])}
    written = 0
    for dist in md.distributions(path=list(sites)):
        name = dist.metadata["Name"] or ""
        key = _normalize(name)
        if not key or key in present:
            continue
        present.add(key)
        metadata = dist.read_text("METADATA") or dist.read_text("PKG-INFO")
        if metadata is None:
            continue
        stub = site / f"{re.sub(r'[^A-Za-z0-9.]+', '_', name)}-{dist.version}.dist-info"
        if stub.exists():
            shutil.rmtree(stub)
        stub.mkdir()
        (stub / "METADATA").write_text(metadata)
        (stub / "INSTALLER").write_text(f"{STUB_INSTALLER}\n")
        record = [f"{stub.name}/{file},," for file in ("METADATA", "INSTALLER", "RECORD")]
        (stub / "RECORD").write_text("\n".join(record) + "\n")
        written += 1
    return written


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()
