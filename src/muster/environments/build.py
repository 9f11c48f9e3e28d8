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

Every command runs with a minimal environment (`isolation`: nothing of the server's but
the uv settings it names) and, under `run_as`, as the account the request names
(`request.BuildRequest.account`), never as root; the venv changes hands around the build's
own writes (`ownership`), and the account's uv reads a copy of the context, the account's,
in `store/<hash>-<nonce>.context`, since the submitted contexts are root's alone. The log
is the server's (0600): the API serves it to the environment's owners and admins.

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
from collections import deque
from collections.abc import Sequence
from pathlib import Path
from typing import IO

from muster.atomic import atomic_write_bytes, atomic_write_json, fsync_dir
from muster.environments.isolation import as_account, build_environ, uv_cache
from muster.environments.layers import (
    lower_scripts,
    site_packages,
    write_pth,
    write_scripts,
    write_stubs,
)
from muster.environments.layout import RECORD, EnvHome
from muster.environments.ownership import (
    OwnershipError,
    give,
    require_directories,
    seal,
    take,
)
from muster.environments.request import BuildRequest
from muster.launch.accounts import Account
from muster.states import Reason

__all__ = ["BUILD_TIMEOUT_S", "EXIT_BUSY", "LOG_BYTES", "classify_failure", "main",
           "uv_binary"]

BUILD_TIMEOUT_S = 3600.0
EXIT_BUSY = 75  # another process holds the lock: it is being built already
_NETWORK = re.compile(
    r"(Failed to fetch|Could not connect|error sending request|dns error|Connection refused|"
    r"connection reset|timed out|Request failed after|failed to lookup address|"
    r"Network is unreachable|operation timed out|tcp connect error)", re.IGNORECASE)
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_MESSAGE_CHARS = 2000
# What a build keeps of what its commands print (the root process's memory and disk, whatever
# a setup command prints for an hour): a line is read in pieces of at most _LINE_BYTES, a
# command's last _KEPT_BYTES are kept (its message, the freeze), the log stops at _LOG_BYTES.
_LINE_BYTES = 64 << 10
_KEPT_BYTES = 8 << 20
LOG_BYTES = 64 << 20


class BuildFailed(Exception):
    def __init__(self, reason: Reason, message: str) -> None:
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
            raise BuildFailed(Reason.INTERNAL, "uv is not installed; muster needs it to build "
                                          "environments (pip install uv)") from None
        return on_path


def classify_failure(output: str) -> Reason:
    """INFRA when the output says the package index could not be reached, else
    PERMANENT_ERROR: a resolver's "no solution" or a failed build repeats on a retry."""
    return Reason.INFRA if _NETWORK.search(output) else Reason.PERMANENT_ERROR


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
        self.logged = 0  # bytes written to the log
        self.account = request.account
        self.deadline = time.monotonic() + BUILD_TIMEOUT_S
        self.uv = uv_binary()
        self.cache = uv_cache(home.root, self.account, os.environ)

    def stage(self, text: str) -> None:
        atomic_write_bytes(self.home.stage(self.key), text.encode(), 0o600)
        self.say(f"== {text}")

    def say(self, text: str) -> None:
        self.write(f"{time.strftime('%H:%M:%S')} {text}\n")
        self.log.flush()

    def write(self, text: str) -> None:
        """Into the log, until it holds LOG_BYTES (then one line says so)."""
        if self.logged >= LOG_BYTES:
            return
        self.logged += len(text.encode())
        if self.logged >= LOG_BYTES:
            text = f"\n(the log stops here: it holds {LOG_BYTES >> 20} MiB; the build goes on)\n"
        self.log.write(text)

    def run(self, argv: Sequence[str], *, cwd: Path | None = None,
            env: dict[str, str] | None = None, what: str, quoted: bool = True) -> str:
        """Run one command, its output into the log; its output back, or BuildFailed (whose
        message, which every reader of the trial sees, quotes the end of the output only
        when `quoted`: uv's own words, not what a setup command printed)."""
        self.say("$ " + " ".join(argv))
        remaining = self.deadline - time.monotonic()
        if remaining <= 0:
            raise BuildFailed(Reason.INFRA, f"the build took longer than {BUILD_TIMEOUT_S:g} s")
        try:
            child = subprocess.Popen(list(argv), cwd=cwd, env=env or self.uv_env(),
                                     stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, **as_account(self.account))
        except OSError as exc:
            raise BuildFailed(Reason.PERMANENT_ERROR, f"{what}: {argv[0]!r} cannot be run: "
                                                 f"{exc.strerror or exc}") from exc
        stdout = child.stdout
        assert stdout is not None
        chunks: deque[str] = deque()
        kept = 0
        timer = threading.Timer(remaining, child.kill)
        timer.start()
        try:
            for raw in iter(lambda: stdout.readline(_LINE_BYTES), b""):
                line = raw.decode("utf-8", errors="replace")
                chunks.append(line)
                kept += len(line)
                while kept > _KEPT_BYTES:
                    kept -= len(chunks.popleft())
                self.write(line)
            self.log.flush()
            code = child.wait()
        finally:
            timer.cancel()
        output = "".join(chunks)
        if code != 0:
            if time.monotonic() >= self.deadline:
                raise BuildFailed(Reason.INFRA, f"{what} took longer than the build's "
                                           f"{BUILD_TIMEOUT_S:g} s")
            said = (f":\n{uv_message(output)}" if quoted
                    else "; what it printed is in the build log")
            raise BuildFailed(classify_failure(output), f"{what} failed (exit {code}){said}")
        return output

    def uv_env(self, venv: Path | None = None) -> dict[str, str]:
        """A command's whole environment (`isolation`); with `venv`, that venv active."""
        return build_environ(self.account, os.environ, self.cache, venv)

    def build(self) -> Path:
        request, base = self.request, self.request.base
        venv = self.home.store / f"{self.key}-{secrets.token_hex(4)}"
        started = time.monotonic()
        self.stage("creating the venv")
        if self.account is not None:  # uv, run as the account, makes it inside
            venv.mkdir(mode=0o755)
            os.chown(venv, self.account.uid, self.account.gid)
        self.run([self.uv, "venv", "--python", base.executable, "--no-config", str(venv)],
                 cwd=venv.parent, what="creating the venv")
        requirements, constraints = self.with_pip(request.split())
        record = venv / RECORD
        self.write_lower(venv, record, requirements, constraints)
        if requirements:
            self.install(venv, record, bool(constraints))
        for number, command in enumerate(request.setup, 1):
            self.stage(f"running setup command {number} of {len(request.setup)}")
            env = self.uv_env(venv)
            program = shutil.which(command[0], path=env["PATH"]) or command[0]
            self.run([program, *command[1:]], cwd=venv, env=env,
                     what=f"environment.setup[{number - 1}] ({' '.join(command)[:200]})",
                     quoted=False)
        self.stage("recording what it holds")
        freeze = self.run([self.uv, "pip", "freeze", "--no-config", "--python",
                           str(venv / "bin" / "python")],
                          cwd=venv, what="listing the venv's packages")
        if self.account is not None:
            seal(venv, record)
            _write_inputs(record, requirements, constraints)
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

    def with_pip(self, lines: tuple[list[str], list[str]]) -> tuple[list[str], list[str]]:
        """(requirements, constraints), pip added unless the venv imports it already."""
        request, base = self.request, self.request.base
        requirements, constraints = lines
        pip_visible = request.inherit and any(n == "pip" for n, _ in base.packages)
        if not pip_visible:
            requirements = [*requirements, base.bundled_pip or "pip"]
        return requirements, constraints

    def write_lower(self, venv: Path, record: Path, requirements: list[str],
                    constraints: list[str]) -> None:
        """The build's own files in the new venv: the lower layers, the harness, the
        requirement files; written while the venv is root's (`ownership`)."""
        request, base = self.request, self.request.base
        site = site_packages(venv, base)
        if self.account is not None:
            take(venv)
            require_directories(venv, ("bin", str(site.relative_to(venv))))
        write_pth(site, base.sites if request.inherit else (), self.home.harness)
        if request.inherit:
            stubs = write_stubs(site, base.sites)
            write_scripts(venv / "bin", lower_scripts(base.bin_dir))
            self.say(f"inherits {stubs} distributions from {base.path}")
        record.mkdir()
        _write_inputs(record, requirements, constraints)
        if self.account is not None:
            give(venv, self.account)

    def install(self, venv: Path, record: Path, constrained: bool) -> None:
        """`uv pip install` of the requirement files, in (a copy of) the context."""
        self.stage(f"installing {_count(len(self.request.packages()), 'package')}")
        # No uv.toml: the context's would choose the index past `sources`' check.
        argv = [self.uv, "pip", "install", "--no-config", "--python",
                str(venv / "bin" / "python"), "-r", str(record / "requirements.txt")]
        if constrained:
            argv += ["-c", str(record / "constraints.txt")]
        context = self.request.context
        if not context or not os.path.isdir(context):
            self.run(argv, cwd=venv, what="installing the requirements")
            return
        if self.account is None:
            self.run(argv, cwd=Path(context), what="installing the requirements")
            return
        copy = venv.with_name(venv.name + ".context")
        try:
            _copy_context(Path(context), copy, self.account)
            self.run(argv, cwd=copy, what="installing the requirements")
        finally:
            shutil.rmtree(copy, ignore_errors=True)

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


def _write_inputs(record: Path, requirements: list[str], constraints: list[str]) -> None:
    (record / "requirements.txt").write_text("".join(f"{x}\n" for x in requirements))
    if constraints:
        (record / "constraints.txt").write_text("".join(f"{x}\n" for x in constraints))


def _copy_context(context: Path, copy: Path, account: Account) -> None:
    """A copy of the context that the account's uv reads, and writes in (a local project's
    build writes beside its sources): the context is root's alone, and a hard link would
    share its files' owner and mode."""
    shutil.copytree(context, copy, symlinks=True)
    give(copy, account)


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
    with _open_log(home.log(key)) as log:
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
        except OwnershipError as exc:
            log.write(f"\nFAILED (PERMANENT_ERROR): {exc}\n")
            result = {"state": "failed", "reason": Reason.PERMANENT_ERROR, "message": str(exc),
                      "at": time.time()}
        except (OSError, ValueError, KeyError) as exc:
            log.write(f"\nFAILED (INTERNAL): {type(exc).__name__}: {exc}\n")
            result = {"state": "failed", "reason": Reason.INTERNAL,
                      "message": f"the build failed unexpectedly: {type(exc).__name__}: {exc}",
                      "at": time.time()}
        atomic_write_json(home.result(key), result, 0o600)
        home.stage(key).unlink(missing_ok=True)
    return 0 if result["state"] == "ready" else 1


def _open_log(path: Path) -> IO[str]:
    """The build's log, new and the server's alone (0600): it holds what the commands
    printed, which the API shows only to those who may read it."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    os.fchmod(fd, 0o600)
    return open(fd, "w", encoding="utf-8")


def _remove_unfinished(home: EnvHome, key: str) -> None:
    """Store directories of `key` no link points to: builds that were killed (the lock is
    ours, so none is running)."""
    built = home.built(key)
    for path in home.store.glob(f"{key}-*"):
        if built is None or path.resolve() != built:
            shutil.rmtree(path, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
