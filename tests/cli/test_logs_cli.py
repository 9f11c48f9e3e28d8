"""`muster trial logs` of a trial with two ranks, run as a real subprocess against a real
server: merged in time order without --rank, one rank's log as written with it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from muster.store import Store
from tests.cli.test_cli import on
from tests.server.rank_logs import RankFiles, add_trial_with_ranks
from tests.servers import RunningServer

pytestmark = pytest.mark.lifecycle  # starts real processes

T0 = 1_700_000_000.0


@pytest.fixture
def server_store(server: RunningServer) -> Iterator[Store]:
    with server.store() as store:
        yield store


def two_rank_trial(store: Store, run_dir: Path, chunks: dict[int, list[tuple[float, bytes]]]
                   ) -> str:
    trial_id = add_trial_with_ranks(store, [run_dir], 2)
    for rank, rank_chunks in chunks.items():
        RankFiles(run_dir, rank).append(*rank_chunks)
    return str(trial_id)


@pytest.mark.timeout(60)
def test_trial_logs_merges_ranks_unless_one_is_named(
    server: RunningServer, server_store: Store, tmp_path: Path
) -> None:
    trial_id = two_rank_trial(server_store, tmp_path / "attempt-1", {
        0: [(T0 + 1, b"zero starts\n"), (T0 + 3, b"zero ends\n")],
        1: [(T0 + 2, b"one is \xe2\x9c\x93\n"), (T0 + 4, b"one ends")],
    })
    merged = ("[rank 0] zero starts\n[rank 1] one is \u2713\n[rank 0] zero ends\n"
              "[rank 1] one ends\n")
    for args in [(), ("--follow",)]:
        done = on(server, "trial", "logs", trial_id, *args)
        assert (done.returncode, done.stdout, done.stderr) == (0, merged, "")
    done = on(server, "trial", "logs", trial_id, "--tail", "2")
    assert (done.returncode, done.stdout) == (0, "[rank 0] zero ends\n[rank 1] one ends\n")
    done = on(server, "trial", "logs", trial_id, "--rank", "1")
    assert (done.returncode, done.stdout) == (0, "one is \u2713\none ends")


@pytest.mark.timeout(60)
def test_a_merged_log_longer_than_one_read_is_whole(
    server: RunningServer, server_store: Store, tmp_path: Path
) -> None:
    # Three lines of 700 kB: more than one API read (1 MiB) holds, so the CLI pages.
    trial_id = two_rank_trial(server_store, tmp_path / "attempt-1", {
        0: [(T0 + 1, b"a" * 700_000 + b"\n"), (T0 + 3, b"c" * 700_000 + b"\n")],
        1: [(T0 + 2, b"b" * 700_000 + b"\n")],
    })
    done = on(server, "trial", "logs", trial_id)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "".join(f"[rank {rank}] {c * 700_000}\n"
                                  for rank, c in [(0, "a"), (1, "b"), (0, "c")])
    done = on(server, "trial", "logs", trial_id, "--tail", "2")
    assert done.stdout == f"[rank 1] {'b' * 700_000}\n[rank 0] {'c' * 700_000}\n"


@pytest.mark.timeout(60)
def test_trial_logs_help_says_what_no_rank_means(server: RunningServer) -> None:
    done = on(server, "trial", "logs", "--help")
    assert done.returncode == 0, done.stderr
    text = " ".join(done.stdout.split())
    assert "merged in time order" in text and "[rank r]" in text
