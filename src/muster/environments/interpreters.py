"""The facts of a base interpreter: what a built venv or a trial's layer is made from.

Asked of the interpreter itself (`python -I -c …`, a few tens of milliseconds) and kept in
memory until its site-packages change; the interpreter muster runs on answers in-process.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

__all__ = ["MIN_VERSION", "Interpreter", "InterpreterError", "inspect", "own"]

MIN_VERSION = (3, 10)  # what muster.harness runs on
QUERY_TIMEOUT_S = 20.0

# Run inside the interpreter (standard library only, any CPython 3): prints its facts.
_QUERY = r"""
import json, os, platform, re, site, sys
import importlib.metadata as md

def facts():
    sites = [p for p in site.getsitepackages() if os.path.isdir(p)]
    seen = {}
    for dist in md.distributions(path=sites):
        name = dist.metadata["Name"] or ""
        key = re.sub(r"[-_.]+", "-", name).lower()
        if key and key not in seen:
            seen[key] = dist.version
    try:
        import ensurepip, glob
        bundled = sorted(glob.glob(os.path.join(os.path.dirname(ensurepip.__file__),
                                                "_bundled", "pip-*.whl")))
    except ImportError:
        bundled = []
    base = getattr(sys, "_base_executable", None) or sys.executable
    return {
        "implementation": sys.implementation.name,
        "version": platform.python_version(),
        "version_info": list(sys.version_info[:2]),
        "executable": os.path.realpath(base),
        "prefix": sys.prefix,
        "sites": sites,
        "packages": sorted(seen.items()),
        "bundled_pip": bundled[-1] if bundled else None,
    }
"""
_PRINT = "\nprint(json.dumps(facts()))\n"


class InterpreterError(Exception):
    """The path is not a Python interpreter muster can use; the message says why."""


@dataclass(frozen=True)
class Interpreter:
    """A Python interpreter, as it answered about itself."""

    path: str  # as named (a venv's bin/python keeps its venv)
    executable: str  # the real binary, links resolved: a new venv's `home`
    version: str  # "3.11.7"
    version_info: tuple[int, int]
    prefix: str  # sys.prefix: a venv's directory, or the installation's
    sites: tuple[str, ...]  # its site-packages, in import order
    packages: tuple[tuple[str, str], ...]  # (normalized name, version) it imports, sorted
    bundled_pip: str | None  # ensurepip's pip wheel: pip for a venv without the network

    @property
    def bin_dir(self) -> str:
        """Where its scripts are (`torchrun`, `pip`): beside the path it was named by."""
        return os.path.dirname(self.path)

    @property
    def lib_dir(self) -> str:
        """`pythonX.Y`, the directory under a venv's `lib/` that holds its site-packages."""
        return "python{}.{}".format(*self.version_info)

    def packages_digest(self) -> str:
        """A digest of what it imports: a built venv that inherits them is built again when
        they change."""
        text = "\n".join(f"{name}=={version}" for name, version in self.packages)
        return hashlib.sha256(text.encode()).hexdigest()

    def to_json(self) -> dict[str, object]:
        return {"path": self.path, "executable": self.executable, "version": self.version,
                "version_info": list(self.version_info), "prefix": self.prefix,
                "sites": list(self.sites), "packages": [list(p) for p in self.packages],
                "bundled_pip": self.bundled_pip}

    @classmethod
    def from_json(cls, data: dict[str, object], path: str) -> Interpreter:
        info = data["version_info"]
        assert isinstance(info, list)
        return cls(path=path, executable=str(data["executable"]), version=str(data["version"]),
                   version_info=(int(info[0]), int(info[1])), prefix=str(data["prefix"]),
                   sites=tuple(str(s) for s in data["sites"]),  # type: ignore[attr-defined]
                   packages=tuple((str(n), str(v)) for n, v in data["packages"]),  # type: ignore[attr-defined]
                   bundled_pip=None if data.get("bundled_pip") is None
                   else str(data["bundled_pip"]))


_cache: dict[str, tuple[tuple[int, ...], Interpreter]] = {}
_lock = threading.Lock()


def own() -> Interpreter:
    """The interpreter muster runs on (asked in-process)."""
    return inspect(sys.executable)


def inspect(path: str) -> Interpreter:
    """The facts of the interpreter at `path` (absolute), asked of it or remembered.

    Raises:
        InterpreterError: it is missing, not executable, not CPython 3.10 or newer, or did
            not answer.
    """
    path = os.path.expanduser(path)
    with _lock:
        cached = _cache.get(path)
    stamp = _stamp(path, cached[1].sites if cached else ())
    if cached is not None and cached[0] == stamp:
        return cached[1]
    found = _ask(path)
    with _lock:
        _cache[path] = (_stamp(path, found.sites), found)
    return found


def _stamp(path: str, sites: tuple[str, ...]) -> tuple[int, ...]:
    """What changes when the interpreter or its packages do: modification times."""
    stamps = []
    for item in (path, *sites):
        try:
            stamps.append(os.stat(item).st_mtime_ns)
        except OSError:
            stamps.append(-1)
    return tuple(stamps)


def _ask(path: str) -> Interpreter:
    data = _in_process() if path == sys.executable else _subprocess(path)
    if data.get("implementation") != "cpython":
        raise InterpreterError(f"{path} is {data.get('implementation')}, not CPython; muster "
                               "builds venvs for CPython only")
    found = Interpreter.from_json(data, path)
    if found.version_info < MIN_VERSION:
        raise InterpreterError(f"{path} is Python {found.version}; muster.harness needs "
                               "{}.{} or newer".format(*MIN_VERSION))
    return found


def _in_process() -> dict[str, object]:
    namespace: dict[str, object] = {}
    exec(compile(_QUERY, "<muster interpreter query>", "exec"), namespace)
    facts = namespace["facts"]
    assert callable(facts)
    answer: dict[str, object] = facts()
    return answer


def _subprocess(path: str) -> dict[str, object]:
    target = Path(path)
    if not target.exists():
        raise InterpreterError(f"{path} does not exist on the server")
    if target.is_dir() or not os.access(target, os.X_OK):
        raise InterpreterError(f"{path} is not an executable file")
    try:
        done = subprocess.run([path, "-I", "-c", _QUERY + _PRINT], capture_output=True,
                              timeout=QUERY_TIMEOUT_S, stdin=subprocess.DEVNULL, check=False)
    except subprocess.TimeoutExpired as exc:
        raise InterpreterError(f"{path} did not answer within {QUERY_TIMEOUT_S:g} s") from exc
    except OSError as exc:
        raise InterpreterError(f"{path} cannot be run: {exc.strerror or exc}") from exc
    if done.returncode != 0:
        last = done.stderr.decode(errors="replace").strip().splitlines()[-1:] or [""]
        said = f": {last[0][:300]}" if "Error" in last[0] else ""
        raise InterpreterError(f"{path} is not a Python interpreter muster can use (asked "
                               f"to run Python code, it exited {done.returncode}{said})")
    try:
        answer: dict[str, object] = json.loads(done.stdout)
    except ValueError as exc:
        raise InterpreterError(f"{path} did not answer as a Python interpreter does") from exc
    return answer
