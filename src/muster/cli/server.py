"""`muster up` and `muster down`: run the server in the foreground, detached, or stop it."""

from __future__ import annotations

import faulthandler
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Annotated

import typer

from muster.atomic import atomic_write_json, read_json
from muster.cli.options import HomeOption
from muster.cli.port_owner import refusal
from muster.client import Client
from muster.config import parse_size
from muster.errors import MusterError, ServerUnavailable
from muster.home import Home
from muster.launch.base import ProcessIdentity
from muster.launch.identity import is_alive, own_identity, read_identity

if TYPE_CHECKING:
    from muster.server.settings import ServerSettings

START_TIMEOUT = 60.0
STOP_TIMEOUT = 30.0


def up(
    home: HomeOption = None,
    host: Annotated[str, typer.Option(help="address to listen on")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="port to listen on")] = 8080,
    db: Annotated[str | None, typer.Option(
        "--db", envvar="MUSTER_DB", help="database URL (default: SQLite in the home)")] = None,
    slots: Annotated[int | None, typer.Option(
        help="replicas without GPUs that may run at once (default: the cluster config's "
             "`slots`, else the CPU count)")] = None,
    min_free_disk: Annotated[str | None, typer.Option(
        help="launch nothing new while the run directories' disk has less free (default: "
             "the cluster config's `min_free_disk`, else 5GiB)")] = None,
    cluster_config: Annotated[str | None, typer.Option(
        "--cluster-config", help="the cluster config: slots, GPUs, disk guard, preemption "
        "(default: $MUSTER_HOME/cluster.yaml when it exists)")] = None,
    detach: Annotated[bool, typer.Option(help="run in the background")] = False,
) -> None:
    """Start the muster server (and its supervisor) on this machine."""
    from muster.jobenv import JOB_UMASK
    from muster.server.settings import ServerSettings

    # The server's files (database, logs, run files) are its user's alone; jobs get the
    # user's own umask back (the shim restores it).
    user_umask = os.umask(0o077)
    os.environ.setdefault(JOB_UMASK, f"{user_umask:04o}")
    where = Home.resolve(home).ensure()
    settings = ServerSettings(db, slots, _size(min_free_disk) if min_free_disk else None,
                              str(Path(cluster_config).resolve()) if cluster_config else None)
    settings.run_as(settings.cluster(where))  # a bad cluster config stops here, with every
    # problem named (and a run_as this machine cannot honour)
    _refuse_second_server(where)
    _refuse_taken_port(host, port)
    if detach:
        _start_detached(where, host, port, settings)
        return
    _serve(where, host, port, settings)


def _size(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as exc:
        raise typer.BadParameter(f"--min-free-disk {exc}") from None


def down(home: HomeOption = None) -> None:
    """Stop the server of this home. Running trials keep running and are reattached by the
    next `muster up`."""
    where = Home.resolve(home)
    running = _running_server(where)
    if running is None:
        typer.echo(f"no muster server is running for {where.root}")
        return
    os.kill(running.pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT
    while is_alive(running) and time.monotonic() < deadline:
        time.sleep(0.1)
    if is_alive(running):
        raise MusterError(f"the server (pid {running.pid}) did not stop within "
                          f"{STOP_TIMEOUT:.0f}s; it is still running")
    typer.echo(f"muster server (pid {running.pid}) stopped")


def _serve(home: Home, host: str, port: int, settings: ServerSettings) -> None:
    import uvicorn

    from muster.server.app import create_app

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: "
                        "%(message)s")
    me = own_identity()
    atomic_write_json(home.server_file, {"pid": me.pid, "start_ticks": me.start_ticks,
                                         "url": _url(host, port)})
    # uvicorn re-raises the SIGTERM it caught once it has shut down; exit through Python
    # then, not the default action, so the `finally` below still removes server.json.
    signal.signal(signal.SIGTERM, _exit_on_signal)
    # A process inherits its starter's blocked signals (a supervisor's, a test runner's
    # thread that blocked them around a fork): unblocked here, before any thread is made,
    # or `muster down`, Ctrl-C and the stack dump below would wait on a mask forever.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM, signal.SIGINT, signal.SIGQUIT})
    # `kill -QUIT PID`: every thread's stack into the server log, and the server goes on
    # (where a server hangs, say in its shutdown, this says where).
    faulthandler.register(signal.SIGQUIT, all_threads=True, chain=False)
    try:
        # proxy_headers off: the app believes X-Forwarded-* from the cluster config's
        # `trusted_proxies` alone, never uvicorn's default (any loopback peer).
        config = uvicorn.Config(create_app(home, settings), host=host, port=port,
                                timeout_graceful_shutdown=5, log_level="info",
                                proxy_headers=False)
        uvicorn.Server(config).run()
    finally:
        if _running_server(home) == me:
            home.server_file.unlink(missing_ok=True)


def _exit_on_signal(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


def _start_detached(home: Home, host: str, port: int, settings: ServerSettings) -> None:
    argv = [sys.executable, "-m", "muster", "up", "--home", str(home.root), "--host", host,
            "--port", str(port)]
    argv += ["--db", settings.db_url] if settings.db_url else []
    argv += ["--slots", str(settings.slots)] if settings.slots else []
    argv += ([] if settings.min_free_disk is None
             else ["--min-free-disk", str(settings.min_free_disk)])
    argv += ["--cluster-config", settings.cluster_config] if settings.cluster_config else []
    log_path = home.root / "server.log"
    with open(log_path, "ab") as server_log:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=server_log,
                                stderr=subprocess.STDOUT, start_new_session=True)
    _wait_healthy(home, host, port, proc, log_path)
    typer.echo(f"muster server running at {_url(host, port)} (pid {proc.pid}); "
               f"log: {log_path}")


def _url(host: str, port: int) -> str:
    return f"http://{'127.0.0.1' if host in ('0.0.0.0', '::') else host}:{port}"


def _wait_healthy(
    home: Home, host: str, port: int, proc: subprocess.Popen[bytes], log_path: os.PathLike[str]
) -> None:
    url = _url(host, port)
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            why = refusal(host, port)  # taken since `up` looked
            raise MusterError(f"the server exited with status {proc.returncode} while "
                              f"starting{f' ({why})' if why else ''}; see {log_path}")
        try:
            with Client(url=url, home=home) as c:
                answered = c.health().get("pid")
            # Another server may already listen on the port (ours then fails to bind).
            if answered == proc.pid and _running_server(home) is not None:
                return
        except ServerUnavailable:
            pass  # not listening yet: keep waiting
        time.sleep(0.1)
    raise MusterError(f"the server did not answer within {START_TIMEOUT:.0f}s; see {log_path}")


def _refuse_taken_port(host: str, port: int) -> None:
    why = refusal(host, port)
    if why is not None:
        raise MusterError(why)


def _running_server(home: Home) -> ProcessIdentity | None:
    record = read_json(home.server_file)
    if not isinstance(record, dict):
        return None
    ident = ProcessIdentity(int(record["pid"]), int(record["start_ticks"]))
    return ident if is_alive(ident) else None


def _refuse_second_server(home: Home) -> None:
    running = _running_server(home)
    if running is not None and read_identity(running.pid) == running:
        raise MusterError(f"a muster server (pid {running.pid}) is already running for "
                          f"{home.root}; stop it with `muster down`")
