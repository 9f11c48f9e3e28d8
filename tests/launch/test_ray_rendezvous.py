"""`ray_replica.rendezvous`: how the actors of one placement group meet at rank 0's node
before their shims start, through the attempt's `master.json` on the shared storage (no Ray
needed: the function is what each actor runs in its `__init__`)."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest

from muster.atomic import atomic_write_bytes, json_bytes
from muster.launch.ray_replica import MASTER_FILE, rendezvous


def _spec(attempt: Path, rank: int) -> Path:
    path = attempt / f"rank-{rank}.spec.json"
    atomic_write_bytes(path, json_bytes({"rank": rank, "env": {"MASTER_ADDR": "127.0.0.1",
                                                               "MASTER_PORT": "1",
                                                               "SECRET": "s3cr3t"}}),
                       mode=0o600)
    return path


def test_rank_0_publishes_its_node_and_a_free_port_and_the_others_take_them(
    tmp_path: Path,
) -> None:
    specs = [_spec(tmp_path, rank) for rank in range(3)]
    # The other ranks' actors start first and wait for rank 0's.
    waiting = [threading.Thread(target=rendezvous, args=(specs[r], r, 30)) for r in (1, 2)]
    for thread in waiting:
        thread.start()
    rendezvous(specs[0], 0)
    for thread in waiting:
        thread.join(timeout=30)
    master = json.loads((tmp_path / MASTER_FILE).read_text())
    assert isinstance(master["port"], int) and 0 < master["port"] < 65536
    for spec in specs:
        env = json.loads(spec.read_text())["env"]
        assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == (master["addr"], str(master["port"]))
        assert env["SECRET"] == "s3cr3t"  # the rest of the spec is kept
        assert os.stat(spec).st_mode & 0o777 == 0o600  # it holds the job's secrets


def test_a_restart_in_place_of_rank_0_keeps_the_attempts_rendezvous(tmp_path: Path) -> None:
    (tmp_path / MASTER_FILE).write_text(json.dumps({"addr": "10.0.0.7", "port": 29511}))
    spec = _spec(tmp_path, 0)
    rendezvous(spec, 0)
    env = json.loads(spec.read_text())["env"]
    assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("10.0.0.7", "29511")


def test_a_rank_whose_rank_0_never_publishes_fails_its_start(tmp_path: Path) -> None:
    spec = _spec(tmp_path, 1)
    with pytest.raises(TimeoutError, match="rank 0 published no rendezvous"):
        rendezvous(spec, 1, timeout=0.2)
    assert json.loads(spec.read_text())["env"]["MASTER_PORT"] == "1"  # untouched
