"""The ranks of an attempt read as one log: whole lines, `[rank r] ` prefixes, time order.

Each rank's log and index are written here in the shim's format with chosen chunk times,
so the expected interleaving is known exactly. The service functions are called directly
on a store (both backends); the last tests go through a real server and the SDK.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from muster.client import Client
from muster.errors import InvalidRequest
from muster.launch.local import LocalLauncher
from muster.launch.log_lines import MAX_LINE_BYTES
from muster.launch.logs import FileLog, tail_offset
from muster.services.logs import LogSlice, MergedSlice, follow_log, read_log
from muster.services.merged_logs import LogCursor, merged_page, tail_cursor
from muster.store import Store, Trial
from tests.server.rank_logs import (
    Chunk,
    RankFiles,
    add_attempt_with_ranks,
    add_trial_with_ranks,
    settle,
)
from tests.servers import RunningServer, shared_server

pytestmark = pytest.mark.lifecycle  # starts real processes

T0 = 1_700_000_000.0
LAUNCHER = LocalLauncher()  # it only serves the logs here: nothing is launched


def merged(*lines: tuple[int, bytes]) -> bytes:
    """The merged view of these (rank, line) pairs, in this order."""
    return b"".join(b"[rank %d] %b" % (rank, line) for rank, line in lines)


def two_rank_trial(store: Store, run_dir: Path, **states: str) -> tuple[int, RankFiles, RankFiles]:
    trial_id = add_trial_with_ranks(store, [run_dir], 2, **states)
    return trial_id, RankFiles(run_dir, 0), RankFiles(run_dir, 1)


def read_merged(store: Store, trial_id: int, **kw: object) -> MergedSlice:
    piece = read_log(store, LAUNCHER, trial_id, **kw)
    assert isinstance(piece, MergedSlice), piece
    return piece


# Chunk times interleave the ranks; a line starting in one chunk and ending in the next takes
# the first chunk's time, and equal times go rank 0 first.
INTERLEAVED: dict[int, list[Chunk]] = {
    0: [(T0 + 10, b"a1\na2\n"), (T0 + 12, b"a3\n"), (T0 + 14, b"a4 fir"), (T0 + 20, b"st\n")],
    1: [(T0 + 11, b"b1\n"), (T0 + 12, b"b2\n"), (T0 + 15, b"b3\n")],
}
INTERLEAVED_LINES = [(0, b"a1\n"), (0, b"a2\n"), (1, b"b1\n"), (0, b"a3\n"), (1, b"b2\n"),
                     (0, b"a4 first\n"), (1, b"b3\n")]


def interleaved_trial(store: Store, run_dir: Path, **states: str) -> int:
    trial_id, *ranks = two_rank_trial(store, run_dir, **states)
    for files in ranks:
        files.append(*INTERLEAVED[files.rank])
    return trial_id


def test_ranks_are_merged_by_chunk_time_with_prefixes(store: Store, tmp_path: Path) -> None:
    trial_id = interleaved_trial(store, tmp_path / "attempt-1")
    piece = read_merged(store, trial_id)
    assert piece.data == merged(*INTERLEAVED_LINES)
    assert (piece.attempt, str(piece.next_cursor)) == (1, "0:18,1:9")


def test_a_line_not_yet_indexed_takes_its_ranks_last_chunk_time(
    store: Store, tmp_path: Path
) -> None:
    trial_id, zero, one = two_rank_trial(store, tmp_path / "attempt-1")
    zero.append((T0 + 10, b"a1\n"))
    with zero.log.open("ab") as log:  # the shim writes the log, then the index
        log.write(b"a2\n")
    one.append((T0 + 11, b"b1\n"))
    assert read_merged(store, trial_id).data == merged((0, b"a1\n"), (0, b"a2\n"), (1, b"b1\n"))


def test_a_rank_keeps_its_order_when_its_clock_steps_back(store: Store, tmp_path: Path) -> None:
    trial_id, zero, one = two_rank_trial(store, tmp_path / "attempt-1")
    zero.append((T0 + 10, b"a1\n"), (T0 + 5, b"a2\n"))
    one.append((T0 + 7, b"b1\n"))
    assert read_merged(store, trial_id).data == merged((1, b"b1\n"), (0, b"a1\n"), (0, b"a2\n"))


ODD = b"\xff\xfeodd \r\nbytes\n\nand no newline at the end"


@pytest.mark.parametrize("replica_rows", [1, 0], ids=["one-replica-row", "only-rank-0-log"])
def test_a_single_rank_reads_exactly_as_before(
    store: Store, tmp_path: Path, replica_rows: int
) -> None:
    run_dir = tmp_path / "attempt-1"
    trial_id = add_trial_with_ranks(store, [run_dir], replica_rows)
    RankFiles(run_dir, 0).append((T0, ODD[:9]), (T0 + 1, ODD[9:]))
    assert read_log(store, LAUNCHER, trial_id) == LogSlice(ODD, 1, 0, len(ODD), 0)
    assert read_log(store, LAUNCHER, trial_id, offset=4, limit=3) == LogSlice(ODD[4:7], 1, 4, 7, 0)
    tail = read_log(store, LAUNCHER, trial_id, tail=2)
    assert isinstance(tail, LogSlice)
    assert tail.data == ODD[tail_offset(FileLog(0, run_dir / "rank-0.log"), 2):]
    assert tail.data == b"\nand no newline at the end"
    assert str(read_log(store, LAUNCHER, trial_id, cursor="0:4", limit=3).next_cursor) == "0:7"


def test_ranks_found_on_disk_are_merged_without_replica_rows(
    store: Store, tmp_path: Path
) -> None:
    run_dir = tmp_path / "attempt-1"
    trial_id = add_trial_with_ranks(store, [run_dir], 0)
    for rank, chunks in INTERLEAVED.items():
        RankFiles(run_dir, rank).append(*chunks)
    assert read_merged(store, trial_id).data == merged(*INTERLEAVED_LINES)


def test_a_named_rank_is_its_raw_bytes(store: Store, tmp_path: Path) -> None:
    trial_id = interleaved_trial(store, tmp_path / "attempt-1")
    assert read_log(store, LAUNCHER, trial_id, rank=1) == LogSlice(b"b1\nb2\nb3\n", 1, 0, 9, 1)
    assert read_log(store, LAUNCHER, trial_id, rank=0, offset=9) == LogSlice(
        b"a4 first\n", 1, 9, 18, 0)
    assert read_log(store, LAUNCHER, trial_id, rank=0, tail=1).data == b"a4 first\n"


@pytest.mark.parametrize("count", [0, 1, 2, 3, 6, 7, 50])
def test_tail_is_the_last_merged_lines(store: Store, tmp_path: Path, count: int) -> None:
    trial_id = interleaved_trial(store, tmp_path / "attempt-1")
    piece = read_merged(store, trial_id, tail=count)
    assert piece.data == merged(*INTERLEAVED_LINES[len(INTERLEAVED_LINES) - count:])
    assert str(piece.next_cursor) == "0:18,1:9"  # where new lines will come


@pytest.mark.parametrize("limit", [1, 15, 40, 1024**2])
def test_paging_with_the_cursor_gives_every_line_once(
    store: Store, tmp_path: Path, limit: int
) -> None:
    trial_id = interleaved_trial(store, tmp_path / "attempt-1")
    pages, cursor = [], None
    while (piece := read_merged(store, trial_id, limit=limit, cursor=cursor)).data:
        pages.append(piece.data)
        cursor = str(piece.next_cursor)
    assert b"".join(pages) == merged(*INTERLEAVED_LINES)
    assert all(page.endswith(b"\n") for page in pages)
    # A page stays within the limit, or holds the one line that is longer.
    assert all(len(page) <= limit or page.count(b"\n") == 1 for page in pages)


def test_a_tail_longer_than_a_page_goes_on_with_the_cursor(
    store: Store, tmp_path: Path
) -> None:
    trial_id = interleaved_trial(store, tmp_path / "attempt-1")
    first = read_merged(store, trial_id, tail=4, limit=30)
    rest = read_merged(store, trial_id, cursor=str(first.next_cursor))
    assert first.data == merged(*INTERLEAVED_LINES[3:5])
    assert first.data + rest.data == merged(*INTERLEAVED_LINES[3:])


def test_a_partial_last_line_waits_until_it_is_complete(store: Store, tmp_path: Path) -> None:
    trial_id, zero, one = two_rank_trial(store, tmp_path / "attempt-1",
                                         trial_state="RUNNING", attempt_state="RUNNING")
    zero.append((T0 + 1, b"a1\n"))
    one.append((T0 + 2, b"b1\nb-part"))
    first = read_merged(store, trial_id)
    assert first.data == merged((0, b"a1\n"), (1, b"b1\n"))
    assert read_merged(store, trial_id, tail=5).data == first.data
    one.append((T0 + 3, b"ial\nlast words"))
    second = read_merged(store, trial_id, cursor=str(first.next_cursor))
    assert second.data == merged((1, b"b-partial\n"))
    # Once the trial has settled no byte will follow: the partial line ends the log.
    settle(store, trial_id)
    last = read_merged(store, trial_id, cursor=str(second.next_cursor))
    assert last.data == merged((1, b"last words\n"))
    assert read_merged(store, trial_id, tail=1).data == merged((1, b"last words\n"))


def test_a_line_longer_than_the_limit_is_cut_the_same_both_ways(
    store: Store, tmp_path: Path
) -> None:
    trial_id, zero, one = two_rank_trial(store, tmp_path / "attempt-1")
    zero.append((T0 + 1, b"x" * (2 * MAX_LINE_BYTES + 10) + b"\n"))
    one.append((T0 + 2, b"b1\n"))
    pieces = [(0, b"x" * MAX_LINE_BYTES + b"\n")] * 2 + [(0, b"x" * 10 + b"\n"), (1, b"b1\n")]
    assert read_merged(store, trial_id, limit=8 * MAX_LINE_BYTES).data == merged(*pieces)
    assert read_merged(store, trial_id, tail=3, limit=8 * MAX_LINE_BYTES).data == merged(
        *pieces[1:])


@pytest.mark.parametrize(("kw", "message"), [
    ({"cursor": "zero:1"}, "cursor must be rank:offset pairs like '0:1234,1:88'"),
    ({"cursor": "0:1,0:2"}, "each rank once"),
    ({"cursor": "5:0"}, "cursor names rank 5, but attempt 1 has ranks 0, 1"),
    ({"cursor": "0:1", "rank": 0}, "cursor is for reads without a rank"),
    ({"cursor": "0:1", "offset": 3}, "give offset or cursor, not both"),
    ({"offset": 3}, "offset is a position in one rank's log"),
])
def test_a_wrong_cursor_says_what_to_pass(
    store: Store, tmp_path: Path, kw: dict[str, object], message: str
) -> None:
    trial_id = interleaved_trial(store, tmp_path / "attempt-1")
    with pytest.raises(InvalidRequest, match=message):
        read_log(store, LAUNCHER, trial_id, **kw)


# -- follow --------------------------------------------------------------------------------


async def arrived(predicate: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    """`wait_until` for a test on the event loop: the timeout only bounds a broken test."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(0.01)


def test_follow_streams_new_lines_across_attempts_until_the_trial_settles(
    store: Store, tmp_path: Path
) -> None:
    trial_id, zero, one = two_rank_trial(store, tmp_path / "attempt-1",
                                         trial_state="RUNNING", attempt_state="RUNNING")
    zero.append((T0 + 1, b"a1\n"))
    one.append((T0 + 2, b"b1\n"))
    received = bytearray()

    async def scenario() -> None:
        stream = await follow_log(store, LAUNCHER, trial_id, attempt=None, rank=None, offset=0,
                                  tail=None)

        async def consume() -> None:
            async for chunk in stream:
                received.extend(chunk)

        task = asyncio.create_task(consume())
        await arrived(lambda: received == merged((0, b"a1\n"), (1, b"b1\n")), "a1, b1")
        one.append((T0 + 3, b"b2 "))
        zero.append((T0 + 4, b"a2\n"))
        await arrived(lambda: received.endswith(b"[rank 0] a2\n"), "a2")
        assert b"b2" not in received  # not a whole line yet
        one.append((T0 + 5, b"whole\n"))
        await arrived(lambda: received.endswith(b"[rank 1] b2 whole\n"), "b2")
        # A restart: attempt 1 ends with a partial line, attempt 2 starts with two ranks.
        zero.append((T0 + 6, b"a-last"))
        second = tmp_path / "attempt-2"
        RankFiles(second, 0).append((T0 + 20, b"c1\n"))
        RankFiles(second, 1).append((T0 + 19, b"d1\n"))
        add_attempt_with_ranks(store, trial_id, second, 2)
        await arrived(lambda: received.endswith(b"[rank 0] c1\n"), "attempt 2's lines")
        assert not task.done()  # the trial still runs
        settle(store, trial_id)
        await asyncio.wait_for(task, timeout=30)

    asyncio.run(scenario())
    assert bytes(received) == merged(
        (0, b"a1\n"), (1, b"b1\n"), (0, b"a2\n"), (1, b"b2 whole\n"), (0, b"a-last\n"),
        (1, b"d1\n"), (0, b"c1\n"))


def test_follow_of_a_settled_trial_is_its_merged_log(store: Store, tmp_path: Path) -> None:
    trial_id = interleaved_trial(store, tmp_path / "attempt-1")

    async def collect(**kw: int | None) -> bytes:
        stream = await follow_log(store, LAUNCHER, trial_id, attempt=None, rank=None,
                                  offset=0, **kw)
        return b"".join([chunk async for chunk in stream])

    assert asyncio.run(collect(tail=None)) == merged(*INTERLEAVED_LINES)
    assert asyncio.run(collect(tail=2)) == merged(*INTERLEAVED_LINES[-2:])


# -- a large log ---------------------------------------------------------------------------


def bytes_read_by_this_process() -> int:
    """Bytes this process has read through read(2) and its kin, from any file (Linux)."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise AssertionError("/proc/self/io has no rchar line")


def write_flood(files: RankFiles, lines: int) -> list[bytes]:
    """`lines` lines of 50 bytes, one chunk (and index line) each, a millisecond apart, as a
    process printing line by line leaves them; returns the last three lines."""
    files.run_dir.mkdir(parents=True, exist_ok=True)
    text = [(b"line %09d " % i).ljust(49, b".") + b"\n" for i in range(lines)]
    files.log.write_bytes(b"".join(text))
    files.index.write_text("".join(f"{i * 50} {T0 + i / 1000:.6f}\n" for i in range(lines)))
    return text[-3:]


def test_a_tail_of_a_50_mb_rank_reads_only_near_the_end(store: Store, tmp_path: Path) -> None:
    trial_id, big, small = two_rank_trial(store, tmp_path / "attempt-1")
    lines = 1_000_000
    last = write_flood(big, lines)
    assert big.log.stat().st_size == 50_000_000
    end = T0 + (lines - 1) / 1000
    small.append((T0, b"early\n"), (end - 0.0015, b"late\n"))

    before = bytes_read_by_this_process()
    piece = read_merged(store, trial_id, tail=4)
    read = bytes_read_by_this_process() - before

    assert piece.data == merged((0, last[0]), (1, b"late\n"), (0, last[1]), (0, last[2]))
    # The log is 50 MB and its index over 20 MB; the tail needs a few blocks of each.
    assert read < 1024**2, f"read {read} bytes for a tail of 4 lines"


# -- the merge as a property ---------------------------------------------------------------


def reference_merge(logs: dict[int, list[Chunk]], final: bool) -> list[tuple[int, bytes]]:
    """The merged lines, computed the slow, obvious way (for times that never go back)."""
    keyed = []
    for rank, chunks in logs.items():
        data, starts = b"", []
        for stamp, chunk in chunks:
            starts.append((len(data), stamp))
            data += chunk
        lines = data.split(b"\n")
        offset = 0
        for i, line in enumerate(lines):
            whole = i < len(lines) - 1
            if whole or (line and final):
                stamp = max((s for o, s in starts if o <= offset), default=0.0)
                keyed.append(((stamp, rank, offset), line + b"\n"))
            offset += len(line) + 1
    return [(key[1], line) for key, line in sorted(keyed)]


chunk_lists = st.lists(
    st.tuples(st.integers(0, 2), st.binary(max_size=12).map(lambda b: b.replace(b"\0", b"\n"))),
    max_size=8,
)


@settings(max_examples=150, deadline=None)
@given(logs=st.lists(chunk_lists, min_size=2, max_size=3), limit=st.integers(1, 60),
       count=st.integers(0, 12), final=st.booleans())
def test_pages_and_tails_agree_with_the_obvious_merge(
    logs: list[list[tuple[int, bytes]]], limit: int, count: int, final: bool
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        chunks = {rank: _timed(steps) for rank, steps in enumerate(logs)}
        sources = _written(Path(tmp), chunks)
        expected = merged(*reference_merge(chunks, final))
        assert _all_pages(sources, LogCursor(), limit, final) == expected
        tail = merged(*reference_merge(chunks, final)[-count:]) if count else b""
        assert _all_pages(sources, tail_cursor(sources, count, final), limit, final) == tail


def _timed(steps: list[tuple[int, bytes]]) -> list[Chunk]:
    """Chunks whose times go up by the given steps (0: the same time as the last chunk)."""
    stamp, chunks = T0, []
    for step, data in steps:
        stamp += step
        if data:  # the shim never writes an empty chunk
            chunks.append((stamp, data))
    return chunks


def _written(folder: Path, chunks: dict[int, list[Chunk]]) -> list[FileLog]:
    for rank, rank_chunks in chunks.items():
        RankFiles(folder, rank).append(*rank_chunks)
    return [FileLog(rank, folder / f"rank-{rank}.log", folder / f"rank-{rank}.index")
            for rank in chunks]


def _all_pages(sources: list[FileLog], cursor: LogCursor, limit: int, final: bool) -> bytes:
    pages = []
    while True:
        page, cursor = merged_page(sources, cursor, limit, final)
        if not page:
            return b"".join(pages)
        pages.append(page)


# -- through the server --------------------------------------------------------------------


server = shared_server()


@pytest.fixture
def server_store(server: RunningServer) -> Iterator[Store]:
    with server.store() as store:
        yield store


@pytest.mark.timeout(60)
def test_the_api_merges_pages_and_serves_a_named_rank_raw(
    client: Client, server_store: Store, server: RunningServer, tmp_path: Path
) -> None:
    trial_id = interleaved_trial(server_store, tmp_path / "attempt-1")
    whole = client.read_logs(trial_id)
    assert (whole.data, whole.next_offset, whole.next_cursor) == (
        merged(*INTERLEAVED_LINES), None, "0:18,1:9")
    pages, cursor = [], None
    while (piece := client.read_logs(trial_id, limit=25, cursor=cursor)).data:
        pages.append(piece.data)
        cursor = piece.next_cursor
    assert b"".join(pages) == whole.data and len(pages) > 2

    raw = client.read_logs(trial_id, rank=1, offset=3)
    assert (raw.data, raw.next_offset, raw.next_cursor) == (b"b2\nb3\n", 9, None)
    assert client.read_logs(trial_id, tail=2).data == merged(*INTERLEAVED_LINES[-2:])
    assert b"".join(client.follow_logs(trial_id)) == whole.data
    assert b"".join(client.follow_logs(trial_id, rank=0)) == b"a1\na2\na3\na4 first\n"

    token = server.token
    response = httpx.get(f"{server.url}/api/v1/trials/{trial_id}/logs",
                         params={"cursor": "0:1;1:2"},
                         headers={"Authorization": f"Bearer {token}"})
    assert response.status_code == 400
    assert response.json()["error"] == "InvalidRequest"
    assert "X-Muster-Next-Cursor" in response.json()["message"]


def test_follow_steps_over_a_dropped_warm_standby(store: Store, tmp_path: Path) -> None:
    """Attempt 2 was a warm standby that was dropped (it never logs): a follower of attempt
    1 goes on to attempt 3, and with one_attempt stops at the end of attempt 1."""
    dirs = [tmp_path / f"attempt-{n}" for n in (1, 2, 3)]
    trial_id = add_trial_with_ranks(store, dirs, 1)
    with store.session_scope() as s:
        standby = s.get_one(Trial, trial_id).attempts[1]
        standby.standby, standby.state = True, "CANCELED"
    RankFiles(dirs[0], 0).append((T0, b"first\n"))
    RankFiles(dirs[2], 0).append((T0 + 5, b"third\n"))

    async def collect(**kw: Any) -> bytes:
        stream = await follow_log(store, LAUNCHER, trial_id, attempt=1, rank=None, offset=0,
                                  tail=None, **kw)
        return b"".join([chunk async for chunk in stream])

    assert asyncio.run(collect()) == b"first\nthird\n"
    assert asyncio.run(collect(one_attempt=True)) == b"first\n"
