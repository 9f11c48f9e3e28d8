"""Build one environment, in a child process: `python -m muster.environments.build HOME HASH`.

The server starts it (`registry`) and only looks at its files; the build holds the
environment's lock (flock) from start to end, so two servers, or a restarted one, never
build the same hash at once. Steps, each named in the `.stage` file and logged:

1. `uv venv` of the base interpreter's binary into `store/<hash>-<nonce>/` (a fresh name:
   nothing is ever built over, or in, a directory another build may have left);
2. with `inherit`, the lower layer: the base's site-packages on the venv's path, a stub per
   inherited distribution for uv, and the base's scripts rebased (`layers`);
3. `uv pip install` of the requirement lines (cwd: the submitted context);
4. the setup commands, argv lists without a shell, with the venv first on PATH;
5. `uv pip freeze` into `.muster/freeze.txt`, the record into `.muster/env.json`;
6. publishing: a link `envs/<hash>` -> the venv, made under a temporary name and renamed
   over (atomic). Until then nothing looks built; a build killed at any step leaves a
   store directory no link points to, which the next build or `prune` removes.

The result (`.result.json`) says ready, or failed with the reason the trials get:
PERMANENT_ERROR for what a retry would repeat (the resolver found no solution, a setup
command failed), INFRA for the package index not answering (the failure policy retries).
The build dies with the server: it stops its own children and leaves when its parent goes.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO

from muster.atomic import atomic_write_bytes, atomic_write_json, fsync_dir
from muster.environments.layers import (
    lower_scripts,
    site_packages,
    write_pth,
    write_scripts,
    write_stubs,
)
from muster.environments.layout import RECORD, EnvHome
from muster.environments.request import BuildRequest

__all__ = ["BUILD_TIMEOUT_S", "EXIT_BUSY", "classify_failure", "main", "uv_binary"]

BUILD_TIMEOUT_S = 3600.0
EXIT_BUSY = 75  # another process holds the lock: it is being built already
_NETWORK = re.compile(
    r"(Failed to fetch|Could not connect|error sending request|dns error|Connection refused|"
    r"connection reset|timed out|Request failed after|failed to lookup address|"
    r"Network is unreachable|operation timed out|tcp connect error)", re.IGNORECASE)
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_MESSAGE_CHARS = 2000


class BuildFailed(Exception):
    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason, self.message = reason, message


def uv_binary() -> str:
    """The uv that came with muster (the `uv` package), else one on PATH."""
    try:
        from uv import find_uv_bin
        found: str = find_uv_bin()
        return found
    except (ImportError, FileNotFoundError):
        on_path = shutil.which("uv")
        if on_path is None:
            raise BuildFailed("INTERNAL", "uv is not installed; muster needs it to build "
                                          "environments (pip install uv)") from None
        return on_path


def classify_failure(output: str) -> str:
    """INFRA when the output says the package index could not be reached, else
    PERMANENT_ERROR: a resolver's "no solution" or a failed build repeats on a retry."""
    return "INFRA" if _NETWORK.search(output) else "PERMANENT_ERROR"


def uv_message(output: str) -> str:
    """uv's own words: its error, from the first `error:` (or cross-marked) line on."""
    text = _ANSI.sub("", output).strip()
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines)
                  if line.lstrip().startswith(("error:", "\u00d7", "x "))), max(0, len(lines) - 12))
    message = "\n".join(line.rstrip() for line in lines[start:]).strip()
    return message[:_MESSAGE_CHARS] or "uv failed without saying why"


class _Builder:
    def __init__(self, home: EnvHome, request: BuildRequest, log: IO[str]) -> None:
        self.home, self.request, self.log = home, request, log
        self.key = request.key
        self.deadline = time.monotonic() + BUILD_TIMEOUT_S
        self.uv = uv_binary()

    def stage(self, text: str) -> None:
        atomic_write_bytes(self.home.stage(self.key), text.encode(), 0o600)
        self.say(f"== {text}")

    def say(self, text: str) -> None:
        self.log.write(f"{time.strftime('%H:%M:%S')} {text}\n")
        self.log.flush()

    def run(self, argv: Sequence[str], *, cwd: Path | None = None,
            env: dict[str, str] | None = None, what: str) -> str:
        """Run one command, its output into the log; its output back, or BuildFailed."""
        self.say("$ " + " ".join(argv))
        remaining = self.deadline - time.monotonic()
        if remaining <= 0:
            raise BuildFailed("INFRA", f"the build took longer than {BUILD_TIMEOUT_S:g} s")
        try:
            child = subprocess.Popen(list(argv), cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        except OSError as exc:
            raise BuildFailed("PERMANENT_ERROR", f"{what}: {argv[0]!r} cannot be run: "
                                                 f"{exc.strerror or exc}") from exc
        assert child.stdout is not None
        chunks: list[str] = []
        timer = threading.Timer(remaining, child.kill)
        timer.start()
        try:
            for raw in child.stdout:
                line = raw.decode("utf-8", errors="replace")
                chunks.append(line)
                self.log.write(line)
            self.log.flush()
            code = child.wait()
        finally:
            timer.cancel()
        output = "".join(chunks)
        if code != 0:
            if time.monotonic() >= self.deadline:
                raise BuildFailed("INFRA", f"{what} took longer than the build's "
                                           f"{BUILD_TIMEOUT_S:g} s")
            raise BuildFailed(classify_failure(output), f"{what} failed (exit {code}):\n"
                                                         f"{uv_message(output)}")
        return output

    def uv_env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items()
               if k not in ("VIRTUAL_ENV", "PYTHONHOME", "PYTHONPATH", "CONDA_PREFIX")}
        env.update({"NO_COLOR": "1", "UV_NO_PROGRESS": "1", "UV_PYTHON_DOWNLOADS": "never"})
        return env

    def build(self) -> Path:
        request, base = self.request, self.request.base
        venv = self.home.store / f"{self.key}-{secrets.token_hex(4)}"
        started = time.monotonic()
        self.stage("creating the venv")
        self.run([self.uv, "venv", "--python", base.executable, "--no-config", str(venv)],
                 env=self.uv_env(), what="creating the venv")
        site = site_packages(venv, base)
        write_pth(site, base.sites if request.inherit else (), self.home.harness)
        if request.inherit:
            stubs = write_stubs(site, base.sites)
            write_scripts(venv / "bin", lower_scripts(base.bin_dir))
            self.say(f"inherits {stubs} distributions from {base.path}")
        requirements, constraints = request.split()
        pip_visible = request.inherit and any(n == "pip" for n, _ in base.packages)
        if not pip_visible:
            requirements = [*requirements, base.bundled_pip or "pip"]
        record = venv / RECORD
        record.mkdir()
        if requirements:
            packages = request.packages()
            self.stage(f"installing {_count(len(packages), 'package')}")
            lines = record / "requirements.txt"
            lines.write_text("".join(f"{x}\n" for x in requirements))
            argv = [self.uv, "pip", "install", "--python", str(venv / "bin" / "python"),
                    "-r", str(lines)]
            if constraints:
                (record / "constraints.txt").write_text("".join(f"{x}\n" for x in constraints))
                argv += ["-c", str(record / "constraints.txt")]
            cwd = Path(request.context) if request.context and os.path.isdir(
                request.context) else venv
            self.run(argv, cwd=cwd, env=self.uv_env(), what="installing the requirements")
        for number, command in enumerate(request.setup, 1):
            self.stage(f"running setup command {number} of {len(request.setup)}")
            env = self.uv_env()
            env["VIRTUAL_ENV"] = str(venv)
            env["PATH"] = os.pathsep.join([str(venv / "bin"), env.get("PATH", "")])
            program = shutil.which(command[0], path=env["PATH"]) or command[0]
            self.run([program, *command[1:]], cwd=venv, env=env,
                     what=f"environment.setup[{number - 1}] ({' '.join(command)[:200]})")
        self.stage("recording what it holds")
        freeze = self.run([self.uv, "pip", "freeze", "--python", str(venv / "bin" / "python")],
                          env=self.uv_env(), what="listing the venv's packages")
        (record / "freeze.txt").write_text(freeze)
        atomic_write_json(record / "env.json", {
            "hash": self.key, "python": base.path, "executable": base.executable,
            "version": base.version, "inherit": request.inherit,
            "packages": request.packages(), "setup": [list(a) for a in request.setup],
            "built_at": time.time(), "build_seconds": round(time.monotonic() - started, 3),
            "size_bytes": tree_size(venv),
        })
        (record / "last_used").touch()
        return venv

    def publish(self, venv: Path) -> None:
        link = self.home.published(self.key)
        tmp = self.home.root / f".{self.key}.link-{os.getpid()}"
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(Path("store") / venv.name)
        os.replace(tmp, link)
        fsync_dir(self.home.root)


def tree_size(root: Path) -> int:
    """Bytes of the files under `root` (each inode once: hard links from uv's cache)."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for folder, _dirs, files in os.walk(root):
        for name in files:
            try:
                st = os.lstat(os.path.join(folder, name))
            except FileNotFoundError:
                continue  # removed while walked (a prune, uv): it takes no space
            if (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                total += st.st_size
    return total


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _leave_with_parent(parent: int) -> None:
    """Stop this build (and what it runs: its process group) once the server is gone."""
    def watch() -> None:
        while True:
            time.sleep(0.5)
            if os.getppid() != parent:
                os.killpg(os.getpgrp(), signal.SIGKILL)
    threading.Thread(target=watch, daemon=True, name="parent-watch").start()


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    home, key = EnvHome(Path(args[0])), args[1]
    parent = int(args[2]) if len(args) > 2 else os.getppid()
    _leave_with_parent(parent)
    home.ensure()
    lock = os.open(home.lock(key), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return EXIT_BUSY
    with open(home.log(key), "w", encoding="utf-8") as log:
        result: dict[str, object]
        try:
            if home.built(key) is not None:
                return 0
            data = json.loads(home.request(key).read_bytes())
            request = BuildRequest.from_json(data)
            _remove_unfinished(home, key)
            builder = _Builder(home, request, log)
            venv = builder.build()
            builder.publish(venv)
            builder.say(f"built {key} in {venv}")
            result = {"state": "ready", "at": time.time()}
        except BuildFailed as exc:
            log.write(f"\nFAILED ({exc.reason}): {exc.message}\n")
            result = {"state": "failed", "reason": exc.reason, "message": exc.message,
                      "at": time.time()}
        except (OSError, ValueError, KeyError) as exc:
            log.write(f"\nFAILED (INTERNAL): {type(exc).__name__}: {exc}\n")
            result = {"state": "failed", "reason": "INTERNAL",
                      "message": f"the build failed unexpectedly: {type(exc).__name__}: {exc}",
                      "at": time.time()}
        atomic_write_json(home.result(key), result, 0o600)
        home.stage(key).unlink(missing_ok=True)
    return 0 if result["state"] == "ready" else 1


def _remove_unfinished(home: EnvHome, key: str) -> None:
    """Store directories of `key` no link points to: builds that were killed (the lock is
    ours, so none is running)."""
    built = home.built(key)
    for path in home.store.glob(f"{key}-*"):
        if built is None or path.resolve() != built:
            shutil.rmtree(path, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
