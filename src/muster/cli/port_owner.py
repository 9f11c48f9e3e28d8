"""Whether `muster up` can listen on a port, and if not, who holds it (Linux's /proc).

Without this a taken port surfaced as uvicorn's exit status 3 in a log the user had to open.
"""

from __future__ import annotations

import errno
import os
import socket
from pathlib import Path

LISTEN = "0A"  # the TCP state /proc/net/tcp writes for a listening socket
PROC = Path("/proc")
COMMAND_WIDTH = 80


def refusal(host: str, port: int) -> str | None:
    """Why `host:port` cannot be listened on (its holder named where this user may see it),
    or None when it can. Binds as uvicorn does (SO_REUSEADDR), then lets go at once."""
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((host, port))
    except OSError as exc:
        if exc.errno != errno.EADDRINUSE:
            return f"cannot listen on {host}:{port}: {exc.strerror or exc}"
        return f"port {port} on {host} is taken {holder(port)}; stop it or choose " \
               "another port with --port"
    return None


def holder(port: int) -> str:
    """'(by pid N: COMMAND)' for the process listening on `port`, or why it is not named."""
    inodes = listening_inodes(port)
    for pid, inode in _socket_owners():
        if inode in inodes:
            return f"(by pid {pid}: {command_line(pid)})"
    return "(by a process this user cannot see)" if inodes else "(by a socket that does not listen)"


def listening_inodes(port: int) -> set[str]:
    """The socket inodes that listen on `port`, over IPv4 and IPv6."""
    found: set[str] = set()
    for table in ("tcp", "tcp6"):
        try:
            lines = (PROC / "net" / table).read_text().splitlines()[1:]
        except OSError:
            continue  # no IPv6 here
        for fields in (line.split() for line in lines):
            local, state, inode = fields[1], fields[3], fields[9]
            if state == LISTEN and int(local.rpartition(":")[2], 16) == port:
                found.add(inode)
    return found


def _socket_owners() -> list[tuple[int, str]]:
    """(pid, socket inode) for every socket this user may see a process hold."""
    owners: list[tuple[int, str]] = []
    for entry in PROC.iterdir():
        if entry.name.isdigit():
            owners += [(int(entry.name), target[8:-1]) for target in _fd_targets(entry)
                       if target.startswith("socket:[")]
    return owners


def _fd_targets(process: Path) -> list[str]:
    """What each open file of a process is, leaving out those that close as we look."""
    try:
        fds = list((process / "fd").iterdir())
    except OSError:
        return []  # another user's process, or one that just ended
    targets = []
    for fd in fds:
        try:
            targets.append(os.readlink(fd))
        except OSError:
            continue  # closed since the listing (the listing's own, for one)
    return targets


def command_line(pid: int) -> str:
    """The process's command line as one line (shortened), or '?' once it has gone."""
    try:
        words = (PROC / str(pid) / "cmdline").read_bytes().rstrip(b"\0").split(b"\0")
    except OSError:
        return "?"
    text = " ".join(word.decode(errors="replace") for word in words)
    return text if len(text) <= COMMAND_WIDTH else text[:COMMAND_WIDTH - 1] + "…"
