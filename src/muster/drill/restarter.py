"""A drill's "server-restart" fault: the muster server SIGKILLed and started again.

A server cannot start itself after its own SIGKILL, so `restart_server` (called inside it)
hands the work to a detached helper, `python -m muster.drill.restarter REQUEST`: the helper
SIGKILLs the server by identity, waits until it is gone, starts the same command again
(argv, working directory and environment) in a session of its own with its output appended
to the server's log, and exits. The request file holds the server's environment (secrets,
perhaps): 0600, beside the log in the server's home, and the helper deletes it once read.
Everything the helper does or fails at is one line in that log.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from muster.launch.base import ProcessIdentity
from muster.launch.identity import is_alive, own_identity, send_signal

__all__ = ["GONE_TIMEOUT_S", "main", "restart_request", "restart_server", "spawn_restarter"]

GONE_TIMEOUT_S = 30.0  # how long the helper waits for the killed server to be gone
POLL_S = 0.05


@dataclass(frozen=True)
class Request:
    """What the helper needs: which server to kill, and how to start it again."""

    server: ProcessIdentity
    argv: list[str]
    cwd: str
    env: dict[str, str]
    log: Path


def restart_server(log_path: Path) -> str:
    """SIGKILL this server and start it again, from a detached helper; returns what is done.

    The kill comes as soon as the helper runs (a fraction of a second): record what must
    survive it before calling this.
    """
    me = own_identity()
    request = restart_request(me, sys.orig_argv, os.getcwd(), os.environ, log_path)
    helper = spawn_restarter(request, log_path)
    return f"SIGKILL to the server (pid {me.pid}), started again by pid {helper}"


def restart_request(server: ProcessIdentity, argv: Sequence[str], cwd: str,
                    env: Mapping[str, str], log_path: Path) -> Path:
    """Write the helper's request (0600, beside the log); returns its path."""
    fd, name = tempfile.mkstemp(prefix=".muster-restart-", suffix=".json", dir=log_path.parent)
    with os.fdopen(fd, "w") as out:
        json.dump({"pid": server.pid, "start_ticks": server.start_ticks, "argv": list(argv),
                   "cwd": cwd, "env": dict(env), "log": str(log_path)}, out)
    return Path(name)


def spawn_restarter(request: Path, log_path: Path) -> int:
    """Start the detached helper on `request`, its output appended to the log; its pid."""
    with open(log_path, "ab") as log:
        helper = subprocess.Popen([sys.executable, "-m", "muster.drill.restarter", str(request)],
                                  stdin=subprocess.DEVNULL, stdout=log,
                                  stderr=subprocess.STDOUT, start_new_session=True)
    return helper.pid


def main(argv: Sequence[str] | None = None) -> int:
    """The helper: `python -m muster.drill.restarter REQUEST`."""
    args = sys.argv[1:] if argv is None else list(argv)
    try:
        request = _read_request(Path(args[0]))
        _say(_kill(request.server))
        _say(f"started the server again: pid {_start(request)}")
    except Exception as exc:  # noqa: BLE001 - the helper's one place to say why it failed
        _say(f"could not restart the server: {type(exc).__name__}: {exc}")
        return 1
    return 0


def _read_request(path: Path) -> Request:
    """The request at `path`, which is deleted (it holds the server's environment)."""
    try:
        data = json.loads(path.read_text())
    finally:
        path.unlink(missing_ok=True)
    return Request(ProcessIdentity(int(data["pid"]), int(data["start_ticks"])),
                   [str(part) for part in data["argv"]], str(data["cwd"]),
                   {str(k): str(v) for k, v in data["env"].items()}, Path(data["log"]))


def _kill(server: ProcessIdentity) -> str:
    """SIGKILL to the server, and wait until it is gone; says what happened."""
    if not send_signal(server, signal.SIGKILL):
        return f"the server (pid {server.pid}) had ended already"
    deadline = time.monotonic() + GONE_TIMEOUT_S
    while is_alive(server):
        if time.monotonic() > deadline:
            raise TimeoutError(f"the server (pid {server.pid}) still runs "
                               f"{GONE_TIMEOUT_S:g} s after its SIGKILL")
        time.sleep(POLL_S)
    return f"SIGKILL to the server (pid {server.pid}); it is gone"


def _start(request: Request) -> int:
    """Start the server's command again, detached, output appended to its log; its pid."""
    with open(request.log, "ab") as log:
        server = subprocess.Popen(request.argv, cwd=request.cwd, env=request.env,
                                  stdin=subprocess.DEVNULL, stdout=log,
                                  stderr=subprocess.STDOUT, start_new_session=True)
    return server.pid


def _say(line: str) -> None:
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    print(f"{stamp} muster drill restarter (pid {os.getpid()}): {line}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
