"""A fork server for shims: one pre-imported process that forks a shim per replica.

Starting a shim as `python -m muster.launch.shim` costs an interpreter start and the
shim's imports (~60 ms of CPU, most of the time from STARTING to the training process's
start). The fork server pays that once: it imports `muster.launch.shim` and then, per
request, forks a child that becomes the shim (`setsid`, its attempt directory as cwd,
stdin and stdout on /dev/null, stderr on the shim log, SIGTERM and SIGINT blocked until its
handlers are installed, as the Popen path does) and runs `shim.main`. The child is the
same shim as one started by Popen: its own session, independent of the server; it only has
a different parent, the fork server, which reaps it.

Protocol (the fork server's stdin and stdout, one JSON object per line): a request
`{"spec": path, "cwd": dir, "log": path}`; the reply `{"pid": n, "start_ticks": t}`
(read by the fork server before the child can be reaped, so even a shim that ends at once
has an identity), or `{"error": "..."}`. EOF on stdin (its server exited or was killed)
ends the fork server; the shims it started live on.

`ForkServer` is the client side, one per server process (`shared()`), started on first
use and started again if it died. Where it cannot be started the launcher falls back to
Popen; `MUSTER_SHIM_FORKSERVER=0` turns it off.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import select
import signal
import subprocess
import sys
import threading
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import IO, TypedDict, cast

from muster.launch.base import ProcessIdentity

log = logging.getLogger(__name__)

ENV_SWITCH = "MUSTER_SHIM_FORKSERVER"
_STOP_SIGNALS = frozenset({signal.SIGTERM, signal.SIGINT})
_REPLY_TIMEOUT_S = 30.0


class ShimRequest(TypedDict):
    """A request on the fork server's stdin: fork a shim for this spec."""

    spec: str  # the replica's spec file
    cwd: str  # the shim's working directory (its attempt's)
    log: str  # the shim's own log, its stderr


class Forked(TypedDict):
    """The reply when the shim was forked: its identity."""

    pid: int
    start_ticks: int


class Refused(TypedDict):
    """The reply when no shim was forked, and why."""

    error: str


class ForkServerError(Exception):
    """The fork server could not start a shim (it is gone, or it said why).

    `asked` is True once the request was sent: a shim may then have been forked (the fork
    server died before it answered), so starting another one elsewhere could run the
    replica twice.
    """

    def __init__(self, message: str, asked: bool) -> None:
        super().__init__(message)
        self.asked = asked


class ForkServer:
    """The client of one fork server process; thread-safe."""

    def __init__(self, argv: list[str] | None = None) -> None:
        # The command that starts the fork server (tests put a broken one here).
        self._argv = argv or [sys.executable, "-P", "-m", "muster.launch.forkserver"]
        self._proc: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()

    def start_shim(self, spec: Path, cwd: Path, shim_log: Path) -> ProcessIdentity:
        """Fork a shim for `spec`; its identity.

        Raises:
            ForkServerError: the fork server could not be started or did not answer.
        """
        request = json.dumps(ShimRequest(spec=str(spec), cwd=str(cwd), log=str(shim_log)))
        with self._lock:
            proc = self._running()
            assert proc.stdin is not None and proc.stdout is not None
            try:
                proc.stdin.write(request.encode() + b"\n")
                proc.stdin.flush()
                reply = _read_reply(proc.stdout)
            except (OSError, ValueError) as exc:
                self._discard()
                raise ForkServerError(f"the shim fork server failed: {exc}", asked=True) from exc
        if "error" in reply:  # it could not fork: no shim exists
            raise ForkServerError(f"the shim fork server could not start the shim: "
                                  f"{cast(Refused, reply)['error']}", asked=False)
        return ProcessIdentity(int(reply["pid"]), int(reply["start_ticks"]))

    def start(self) -> None:
        """Start the fork server now rather than at the first launch.

        Raises:
            ForkServerError: it could not be started.
        """
        with self._lock:
            self._running()

    def close(self) -> None:
        """End the fork server (EOF on its stdin); shims it started live on."""
        with self._lock:
            self._discard()

    def _running(self) -> subprocess.Popen[bytes]:
        if self._proc is not None and self._proc.poll() is None:
            return self._proc
        self._discard()
        try:
            self._proc = subprocess.Popen(
                self._argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=None,
                start_new_session=True, close_fds=True)
        except OSError as exc:
            raise ForkServerError(f"could not start the shim fork server: {exc}",
                                  asked=False) from exc
        return self._proc

    def _discard(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        for pipe in (proc.stdin, proc.stdout):
            if pipe is not None:
                pipe.close()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _read_reply(stdout: IO[bytes]) -> Forked | Refused:
    ready, _, _ = select.select([stdout], [], [], _REPLY_TIMEOUT_S)
    if not ready:
        raise OSError(f"no answer within {_REPLY_TIMEOUT_S:.0f} s")
    line = stdout.readline()
    if not line:
        raise OSError("it exited")
    reply = json.loads(line)
    if not isinstance(reply, dict):
        raise ValueError(f"unexpected reply {line!r}")
    return cast(Forked | Refused, reply)  # its fields are converted where they are read


_SHARED: ForkServer | None = None
_SHARED_LOCK = threading.Lock()


def shared() -> ForkServer | None:
    """This process's fork server, or None when `MUSTER_SHIM_FORKSERVER=0` turns it off."""
    global _SHARED
    if os.environ.get(ENV_SWITCH, "1") == "0":
        return None
    with _SHARED_LOCK:
        if _SHARED is None:
            _SHARED = ForkServer()
            atexit.register(_SHARED.close)  # EOF ends it; its shims live on
        return _SHARED


# -- the fork server process ---------------------------------------------------------------


def serve() -> int:
    """Answer requests on stdin until EOF, reaping the shims as they end."""
    from muster.launch import shim  # what every shim needs, imported once, here
    from muster.launch.identity import read_identity

    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)  # wakes the select below
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C is for the server
    requests = sys.stdin.buffer
    replies = sys.stdout.buffer
    while True:
        ready, _, _ = select.select([requests, wake_r], [], [])
        _reap()
        if wake_r in ready:
            _drain(wake_r)
        if requests not in ready:
            continue
        line = requests.readline()
        if not line:
            return 0
        try:
            request = json.loads(line)
            pid = _fork_shim(shim.main, request)
            identity = read_identity(pid)
            reply: Forked | Refused = (
                Forked(pid=identity.pid, start_ticks=identity.start_ticks)
                if identity is not None else Refused(error=f"shim {pid} vanished at once"))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            reply = Refused(error=f"{type(exc).__name__}: {exc}")
        replies.write(json.dumps(reply).encode() + b"\n")
        replies.flush()


def _fork_shim(run: Callable[[list[str]], int], request: ShimRequest) -> int:
    spec, cwd, shim_log = str(request["spec"]), str(request["cwd"]), str(request["log"])
    sys.stdout.flush()
    sys.stderr.flush()
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
    try:
        pid = os.fork()
    except OSError:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
        raise
    if pid:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
        return pid
    # The child: it becomes the shim and never returns from here.
    code = 1
    try:
        signal.set_wakeup_fd(-1)
        for signum in (signal.SIGCHLD, signal.SIGINT):
            signal.signal(signum, signal.SIG_DFL)
        os.setsid()
        os.chdir(cwd)
        null = os.open(os.devnull, os.O_RDWR)
        err = os.open(shim_log, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        os.dup2(null, 0)
        os.dup2(null, 1)
        os.dup2(err, 2)
        _close_inherited()
        sys.argv = ["muster.launch.shim", spec]
        code = int(run([spec]))
    except SystemExit as exc:  # as the interpreter would report it
        if isinstance(exc.code, int):
            code = exc.code
        elif exc.code is not None:
            print(exc.code, file=sys.stderr)
    except BaseException:  # noqa: BLE001 - the child reports everything, then exits
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _close_inherited() -> None:
    """Close every descriptor above stderr: the request pipes, the wake-up pipe."""
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd > 2:
            try:
                os.close(fd)
            except OSError:
                continue  # the directory's own descriptor, closed by now


def _reap() -> None:
    """Collect every shim that has ended, so none stays a zombie."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _drain(fd: int) -> None:
    try:
        while os.read(fd, 4096):
            pass
    except BlockingIOError:
        return


if __name__ == "__main__":
    sys.exit(serve())
