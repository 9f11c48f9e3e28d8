"""The chaos soak's hands: the server it runs (and kills, and starts again), and each fault.

Every fault is aimed by identity, never by a bare pid (invariant 5): a replica's processes
come from its `rank-<r>.shim.json` and are signalled only while they are still the process
that file names (`muster.launch.identity.send_signal`). A fault that finds nothing to aim at
(no replica running at that moment) is counted as missed, not fired.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import selectors
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from soak_checks import Fault, FaultKind

from muster.atomic import read_json
from muster.client import API, Client, pack_context
from muster.errors import ServerUnavailable
from muster.home import Home
from muster.http_transport import encode_body
from muster.launch.base import ProcessIdentity
from muster.launch.identity import is_alive, read_stat, send_signal
from muster.rundir import RankFile, RankFiles, every_rank_file

START_TIMEOUT_S = 90.0  # a restart reconciles every unfinished attempt first
STOP_TIMEOUT_S = 60.0
BALLAST = ".soak-ballast"  # in the runs directory: what fills the disk
_CHUNK = b"\0" * (1 << 16)
_RANK_STATUS = re.compile(r"rank-([0-9]+)\.shim\.json")


@dataclass(frozen=True)
class Incarnation:
    """One start of the server."""

    number: int
    pid: int
    start_ticks: int
    started_at: float  # when it first answered /health


class Server:
    """`python -m muster up` on the soak's home, in a session of its own; started again with
    the same argv after every kill, and after an exit nobody asked for (counted)."""

    def __init__(self, home: Path, db: str, slots: int, min_free_disk: str) -> None:
        self.home = home
        self.port = _free_port()
        self.db = db
        self.argv = [sys.executable, "-m", "muster", "up", "--home", str(home),
                     "--port", str(self.port), "--db", db, "--slots", str(slots),
                     "--min-free-disk", min_free_disk]
        self.incarnations: list[Incarnation] = []
        self.unexpected_exits: list[str] = []  # the end of its log, each time
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log(self) -> Path:
        return self.home.parent / "server.log"

    def client(self, token: str | None = None) -> Client:
        return Client(url=self.url, home=Home(self.home), token=token)

    def start(self) -> None:
        with self.log.open("ab") as log:
            self._proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT,
                                          start_new_session=True)
        stat = read_stat(self._proc.pid)
        deadline = time.monotonic() + START_TIMEOUT_S
        with self.client() as client:
            while True:
                if self._proc.poll() is not None:
                    raise RuntimeError(f"the muster server exited at start:\n{self._tail()}")
                with contextlib.suppress(ServerUnavailable):
                    client.health()
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the server did not answer within {START_TIMEOUT_S:.0f}"
                                       f" s:\n{self._tail()}")
                time.sleep(0.1)
        self.incarnations.append(Incarnation(len(self.incarnations), self._proc.pid,
                                             stat.start_ticks if stat else 0, time.time()))

    def kill(self) -> bool:
        """SIGKILL the server (its trials live on in their own sessions); True if it was up."""
        if self._proc is None or self._proc.poll() is not None:
            return False
        self._proc.kill()
        self._proc.wait(timeout=STOP_TIMEOUT_S)
        return True

    def watch(self) -> bool:
        """Start the server again if it exited on its own; True if it had."""
        if self._proc is None or self._proc.poll() is None:
            return False
        self.unexpected_exits.append(f"exit status {self._proc.returncode}:\n{self._tail()}")
        self.start()
        return True

    def sample(self) -> tuple[int, int, int] | None:
        """(VmRSS bytes, open descriptors, those of them the database's connections hold)
        of the server process now; None if it is down."""
        if self._proc is None or self._proc.poll() is not None:
            return None
        proc = Path(f"/proc/{self._proc.pid}")
        try:
            status = (proc / "status").read_text()
            targets = [_readlink(proc / "fd" / fd) for fd in os.listdir(proc / "fd")]
            sockets = _database_sockets(proc, self.db)
        except (FileNotFoundError, ProcessLookupError):
            return None
        rss = next(int(line.split()[1]) * 1024 for line in status.splitlines()
                   if line.startswith("VmRSS:"))
        database = sum(1 for t in targets if t in sockets
                       or (self.db.startswith("sqlite:///") and t.startswith(self.db[10:])))
        return rss, len(targets), database

    def down(self) -> str:
        """`muster down` for the home; what it printed. The process is waited for."""
        done = subprocess.run([sys.executable, "-m", "muster", "down", "--home", str(self.home)],
                              capture_output=True, text=True, timeout=STOP_TIMEOUT_S + 30,
                              check=False)
        if self._proc is not None:
            try:
                self._proc.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        return (done.stdout + done.stderr).strip()

    def _tail(self) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-40:])


def _readlink(path: Path) -> str:
    try:
        return os.readlink(path)
    except OSError:  # closed since the listing
        return ""


def _database_sockets(proc: Path, db: str) -> set[str]:
    """`socket:[inode]` of the process's TCP connections to the database's port (none for
    SQLite, whose connections are its files)."""
    port = re.search(r"@[^/:]+:([0-9]+)/", db)
    if port is None:
        return set()
    found = set()
    for table in ("tcp", "tcp6"):
        with contextlib.suppress(FileNotFoundError):
            for line in (proc / "net" / table).read_text().splitlines()[1:]:
                fields = line.split()
                if int(fields[2].rpartition(":")[2], 16) == int(port[1]):
                    found.add(f"socket:[{fields[9]}]")
    return found


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass(frozen=True)
class Replica:
    """A replica whose training process runs now, as its shim's status file names it."""

    trial: str
    attempt: int
    rank: int
    shim: ProcessIdentity
    child: ProcessIdentity

    @property
    def token(self) -> str:
        return f"{self.child.pid}.{self.child.start_ticks}"


def running_replicas(runs: Path) -> list[Replica]:
    """Every replica with a live training process and no exit record yet, in a stable order."""
    found = []
    for status in every_rank_file(runs, RankFile.STATUS):
        rank = int(_RANK_STATUS.fullmatch(status.name)[1])  # type: ignore[index]
        if RankFiles(status.parent, rank).exit.exists():
            continue
        with contextlib.suppress(OSError, ValueError):
            data = read_json(status)
            child = ProcessIdentity(data["child_pid"], data["child_start_ticks"])
            shim = ProcessIdentity(data["shim_pid"], data["shim_start_ticks"])
            if is_alive(child):
                found.append(Replica(status.parent.parent.name,
                                     int(status.parent.name.partition("-")[2]), rank, shim,
                                     child))
    return found


class Ballast:
    """Fills the runs' file system to the last byte, and frees it again."""

    def __init__(self, runs: Path) -> None:
        self.path = runs / BALLAST
        self.filled_at: float | None = None

    def fill(self) -> int:
        """Bytes written: a file as large as the free space, topped up until ENOSPC."""
        free = os.statvfs(self.path.parent)
        room = free.f_bavail * free.f_frsize
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            with contextlib.suppress(OSError):
                os.posix_fallocate(fd, 0, room)
            os.lseek(fd, 0, os.SEEK_END)
            with contextlib.suppress(OSError):
                while True:
                    os.write(fd, _CHUNK)
            with contextlib.suppress(OSError):
                while True:
                    os.write(fd, b"\0")
        finally:
            os.close(fd)
        self.filled_at = time.time()
        return self.path.stat().st_size

    def free(self) -> None:
        self.path.unlink(missing_ok=True)
        self.filled_at = None


@dataclass
class Follower:
    sock: socket.socket
    status: int | None = None
    received: int = 0
    head: bytes = b""


@dataclass
class Burst:
    """Concurrent log follows of running trials, held open for a while, then cut."""

    followers: list[Follower] = field(default_factory=list)
    selector: selectors.DefaultSelector = field(default_factory=selectors.DefaultSelector)
    until: float = 0.0

    def open(self, port: int, targets: list[tuple[int, str, bool]], hold_s: float) -> None:
        """One follow per (trial id, token, whole attempt or rank 0)."""
        for trial_id, token, merged in targets:
            query = "follow=true" + ("" if merged else "&rank=0")
            request = (f"GET {API}/trials/{trial_id}/logs?{query} HTTP/1.1\r\n"
                       f"Host: 127.0.0.1:{port}\r\nAuthorization: Bearer {token}\r\n"
                       "Connection: close\r\n\r\n").encode()
            try:
                sock = socket.create_connection(("127.0.0.1", port), timeout=5)
                sock.sendall(request)
            except OSError:
                continue
            sock.setblocking(False)
            follower = Follower(sock)
            self.followers.append(follower)
            self.selector.register(sock, selectors.EVENT_READ, follower)
        self.until = time.monotonic() + hold_s

    def pump(self, timeout: float) -> None:
        for key, _ in self.selector.select(timeout):
            follower: Follower = key.data
            try:
                data = follower.sock.recv(1 << 16)
            except (BlockingIOError, InterruptedError):
                continue
            except OSError:
                data = b""
            if not data:
                self.selector.unregister(follower.sock)
                continue
            follower.received += len(data)
            if follower.status is None:
                follower.head += data
                match = re.match(rb"HTTP/1\.[01] ([0-9]{3})", follower.head)
                if match:
                    follower.status = int(match[1])

    def close(self) -> Counter[str]:
        """Cut every follow; how they had answered."""
        answered: Counter[str] = Counter()
        for follower in self.followers:
            with contextlib.suppress(KeyError, ValueError):
                self.selector.unregister(follower.sock)
            follower.sock.close()
            answered[str(follower.status or "no answer")] += 1
            answered["bytes"] += follower.received
        self.selector.close()
        return answered


def cut_upload(port: int, token: str, context: Path, name: str, rng: random.Random) -> int:
    """Send an experiment's create request with its whole Content-Length, but only part of
    its body, then close: the bytes sent."""
    config = f"name: {name}\nentrypoint: python soak_job.py\n"
    body = encode_body(data={"config": config},
                       files={"context": ("context.tar.gz", pack_context(context),
                                          "application/gzip")})
    raw = b"".join(bytes(piece) for piece in body.pieces)
    cut = rng.randint(1, len(raw) - 1)
    headers = "".join(f"{key}: {value}\r\n" for key, value in body.headers.items())
    head = (f"POST {API}/experiments HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
            f"Authorization: Bearer {token}\r\nContent-Length: {len(raw)}\r\n{headers}"
            f"Idempotency-Key: {os.urandom(16).hex()}\r\n\r\n").encode()
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(head + raw[:cut])
        time.sleep(0.2)
    return cut


def signal_replica(kind: FaultKind, replica: Replica) -> bool:
    """SIGKILL the replica's training process or its shim, or SIGSTOP the training process:
    True if that very process got it."""
    if kind is FaultKind.KILL_SHIM:
        return send_signal(replica.shim, signal.SIGKILL)
    return send_signal(replica.child,
                       signal.SIGSTOP if kind is FaultKind.STOP_RANK else signal.SIGKILL)


def is_stopped(identity: ProcessIdentity) -> bool:
    stat = read_stat(identity.pid)
    return stat is not None and stat.start_ticks == identity.start_ticks and stat.state == "T"


def restart_postgres(cluster: str) -> tuple[bool, str]:
    """`pg_ctlcluster VERSION NAME restart`; (whether it did, what it said)."""
    version, _, name = cluster.partition("/")
    done = subprocess.run(["pg_ctlcluster", "--skip-systemctl-redirect", version, name,
                           "restart"], capture_output=True, text=True, timeout=120,
                          check=False)
    return done.returncode == 0, (done.stdout + done.stderr).strip()


def process_fault(kind: FaultKind, runs: Path, rng: random.Random) -> Fault | None:
    """Signal one running replica, chosen by `rng`; None when none runs (or, for a stop,
    none that is not stopped already)."""
    candidates = running_replicas(runs)
    if kind is FaultKind.STOP_RANK:
        candidates = [r for r in candidates if not is_stopped(r.child)]
    if not candidates:
        return None
    replica = rng.choice(candidates)
    at = time.time()
    landed = signal_replica(kind, replica)
    return Fault(kind, at, trial=replica.trial, attempt=replica.attempt, rank=replica.rank,
                 target=replica.token, landed=landed,
                 detail=f"shim {replica.shim.pid}" if kind is FaultKind.KILL_SHIM else "")
