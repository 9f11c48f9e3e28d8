"""A drill's "network" fault: one Ray node's link cut, and restored `down_for` seconds later.

muster cannot cut a link by itself on every cluster: how a node is reached (a veth in a
network namespace, an interface over ssh, a switch port) is the admin's to say. The cluster
config names the two commands (`ray.drill_network`, `NetworkDrillConfig`), with `{node_ip}`,
`{node_id}` and `{hostname}` filled in from the rank's launch record (`rank-<r>.launch.json`,
written by the Ray launcher).

`cut_link` runs the cut at once (its failure is the injection's: nothing was cut) and hands
the restore to a detached helper, `python -m muster.drill.link --after S -- ARGV...`, in a
session of its own: the link comes back on time even when the server is SIGKILLed or the
drill is canceled meanwhile. The helper tries the restore until it succeeds (at most
`RESTORE_TRIES` times) and says what it did, one line each, in the server's log.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from muster.atomic import read_json
from muster.config.cluster import NetworkDrillConfig
from muster.errors import InjectionError
from muster.launch.base import ProcessIdentity
from muster.launch.identity import read_identity
from muster.rundir import RankFiles

__all__ = ["COMMAND_TIMEOUT_S", "RESTORE_TRIES", "Cut", "cut_link", "main", "node_of", "with_node"]

COMMAND_TIMEOUT_S = 30.0  # a cut or a restore that takes longer has failed
RESTORE_TRIES = 5
RETRY_PAUSE_S = 5.0
_PLACEHOLDERS = ("node_ip", "node_id", "hostname")


def node_of(attempt_dir: Path, rank: int) -> dict[str, str]:
    """The node rank `rank` of the attempt runs on, from its launch record.

    Raises:
        InjectionError: no launch record names a Ray node (not launched on Ray).
    """
    files = RankFiles(attempt_dir, rank)
    try:
        record = read_json(files.launch)
    except (OSError, ValueError) as exc:
        raise InjectionError(f"rank {rank} has no launch record to say its node: {exc}") \
            from exc
    if record is None:
        raise InjectionError(f"rank {rank} has no launch record to say its node")
    if not isinstance(record, dict) or not record.get("node_ip"):
        raise InjectionError(f"rank {rank}'s launch record names no Ray node: the network "
                             "fault needs a replica launched on Ray")
    return {name: str(record.get(name) or "") for name in _PLACEHOLDERS}


def rank_to_cut(attempt_dir: Path, ranks: int) -> int:
    """The last rank whose node is not the server's own: cutting the link of the node the
    server (the Ray driver) runs on would cut it from every node, not a node from the run.

    Raises:
        InjectionError: a rank has no launch record, or every rank runs on the server's node.
    """
    server = _server_node_id()
    for rank in reversed(range(ranks)):
        if node_of(attempt_dir, rank)["node_id"] != server:
            return rank
    raise InjectionError("every rank runs on the server's own Ray node: cutting its link "
                         "would cut the server from the cluster, not a node from the run")


def _server_node_id() -> str | None:
    """The Ray node this process (the server, Ray's driver) runs on; None outside Ray."""
    try:
        import ray  # the network fault is offered on Ray only (`drill.faults`)
    except ImportError:
        return None
    if not ray.is_initialized():
        return None
    return str(ray.get_runtime_context().get_node_id())


def with_node(argv: Sequence[str], node: Mapping[str, str]) -> list[str]:
    """`argv` with `{node_ip}`, `{node_id}` and `{hostname}` filled in; other braces stay."""
    filled = []
    for part in argv:
        for name in _PLACEHOLDERS:
            part = part.replace(f"{{{name}}}", node.get(name, ""))
        filled.append(part)
    return filled


@dataclass(frozen=True)
class Cut:
    said: str  # what was done
    helper: ProcessIdentity  # the detached helper that restores the link
    back_by: float  # time.time() by which the helper has restored the link or given up


def cut_link(attempt_dir: Path, rank: int, config: NetworkDrillConfig, log_path: Path) -> Cut:
    """Cut the link of the node rank `rank` runs on, and have it restored after
    `config.down_for` seconds by a detached helper.

    Raises:
        InjectionError: the node is unknown, or the cut command failed (nothing was cut).
    """
    node = node_of(attempt_dir, rank)
    cut, restore = with_node(config.cut, node), with_node(config.restore, node)
    failure = _run(cut)
    if failure is not None:
        raise InjectionError(f"the cut command failed: {failure}")
    with open(log_path, "ab") as log:
        helper = subprocess.Popen(
            [sys.executable, "-m", "muster.drill.link", "--after", f"{config.down_for:g}",
             "--", *restore], stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True)
    identity = read_identity(helper.pid) or ProcessIdentity(helper.pid, 0)
    said = (f"the link of node {node['node_ip']} (rank {rank}) cut for "
            f"{config.down_for:g} s; pid {helper.pid} restores it")
    give_up = RESTORE_TRIES * (COMMAND_TIMEOUT_S + RETRY_PAUSE_S)
    return Cut(said, identity, time.time() + config.down_for + give_up)


def _run(argv: Sequence[str]) -> str | None:
    """Run an admin command; None when it succeeded, else why not."""
    try:
        done = subprocess.run(list(argv), stdin=subprocess.DEVNULL, capture_output=True,
                              timeout=COMMAND_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{argv[0]}: {exc}"
    if done.returncode != 0:
        said = (done.stderr or done.stdout).decode(errors="replace").strip()[-500:]
        return f"{' '.join(argv)} exited {done.returncode}: {said or 'it said nothing'}"
    return None


def main(argv: Sequence[str] | None = None) -> int:
    """The helper: `python -m muster.drill.link --after SECONDS -- RESTORE ARGV...`."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 4 or args[0] != "--after" or args[2] != "--":
        _say("usage: python -m muster.drill.link --after SECONDS -- RESTORE...")
        return 2
    time.sleep(max(0.0, float(args[1])))
    restore = args[3:]
    for attempt in range(1, RESTORE_TRIES + 1):
        failure = _run(restore)
        if failure is None:
            _say(f"link restored: {' '.join(restore)}")
            return 0
        _say(f"could not restore the link (try {attempt} of {RESTORE_TRIES}): {failure}")
        time.sleep(RETRY_PAUSE_S)
    return 1


def _say(line: str) -> None:
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    print(f"{stamp} muster drill link (pid {os.getpid()}): {line}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
