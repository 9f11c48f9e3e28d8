"""Searching a rank's log (`muster.services.log_search`) on real files: every match once,
forward and backward, across the reads' chunk borders, page by page under tiny budgets,
around dropped ranges; the trial, attempt and rank chosen as the log routes choose them.

The expected matches come from Python's `re` run line by line over the same bytes: an
independent, obvious search to hold the chunked one to.
"""

from __future__ import annotations

import contextlib
import json
import re
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from muster.errors import InvalidPattern, InvalidRequest, NotFound, TooManyRequests
from muster.launch.local import LocalLauncher
from muster.launch.log_limit import LogDrops
from muster.launch.logs import FileLog, open_log
from muster.services.log_search import (
    CHUNK_BYTES,
    MAX_PATTERN_CHARS,
    MAX_SCANS,
    SCANS,
    SHOWN_BYTES,
    SearchPlan,
    compile_pattern,
    search_log,
    search_stream,
)
from muster.states import LogSearchDirection, LogSearchStop
from muster.store import Store
from tests.server.rank_logs import RankFiles, add_trial_with_ranks

FORWARD, BACKWARD = LogSearchDirection.FORWARD, LogSearchDirection.BACKWARD
LAUNCHER = LocalLauncher()  # it only serves the logs here: nothing is launched


def training_log(lines: int) -> bytes:
    """Lines like a training loop's, with `loss nan` in every 997th and an empty line in
    every 1000th."""
    out = []
    for i in range(lines):
        nan = " loss nan" if i % 997 == 3 else f" loss {1 / (i + 1):.6f}"
        out.append(b"" if i % 1000 == 999 else f"step {i}{nan} lr 0.001".encode())
    return b"\n".join(out) + b"\n"


def obvious(data: bytes, pattern: str, flags: int = 0) -> list[int]:
    """The offsets of the matches of `pattern` in each line of `data`, by Python's `re`."""
    compiled, found, at = re.compile(pattern.encode(), flags), [], 0
    lines = data.split(b"\n") if data else []
    for line in lines[:-1] if data.endswith(b"\n") else lines:  # no line after the last \n
        seen = set()
        for match in compiled.finditer(line):
            if match.start() not in seen:
                found.append(at + match.start())
            seen.add(match.start())
        at += len(line) + 1
    return found


def search(log: Path, pattern: str, *, regex: bool = False, ignore_case: bool = False,
           **plan: object) -> dict[str, object]:
    compiled = compile_pattern(pattern, regex=regex, ignore_case=ignore_case)
    made = SearchPlan(compiled, **plan)
    stream = open_log(FileLog(0, log))
    assert stream is not None
    with stream:
        return dict(search_stream(stream, made).result(made.direction, 1, 0, [0]))


def offsets(found: dict[str, object]) -> list[int]:
    matches = found["matches"]
    assert isinstance(matches, list)
    return [m["offset"] for m in matches]


def every_page(log: Path, pattern: str, direction: LogSearchDirection, **plan: object
               ) -> tuple[list[int], int]:
    """Every match of a search paged from `next_from` until complete, and the pages."""
    found: list[int] = []
    start, pages = None, 0
    while True:
        page = search(log, pattern, direction=direction, start=start, **plan)
        found += offsets(page)
        pages += 1
        if page["complete"]:
            assert page["stopped"] == LogSearchStop.END
            return found, pages
        assert page["stopped"] != LogSearchStop.END
        start = page["next_from"]


@pytest.fixture(scope="module")
def big_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A log over two chunks long, with a matching line across the first chunk border."""
    head = training_log(180_000)
    head = head[:CHUNK_BYTES - 10]
    head = head[:head.rfind(b"\n") + 1]
    border = b"x" * (CHUNK_BYTES - 5 - len(head)) + b" loss nan across the border\n"
    log = tmp_path_factory.mktemp("big") / "rank-0.log"
    log.write_bytes(head + border + training_log(200_000))
    assert log.stat().st_size > 2 * CHUNK_BYTES
    return log


def test_a_whole_scan_finds_every_match_across_chunk_borders(big_log: Path) -> None:
    data = big_log.read_bytes()
    expected = obvious(data, "loss nan")
    border = data.index(b" loss nan across") + 1
    assert border < CHUNK_BYTES < border + len("loss nan")  # the match spans the border
    forward = search(big_log, "loss nan", limit=1000)
    assert forward["complete"] and forward["stopped"] == LogSearchStop.END
    assert offsets(forward) == expected and border in expected
    assert (forward["scanned_from"], forward["scanned_to"]) == (0, len(data))
    backward = search(big_log, "loss nan", limit=1000, direction=BACKWARD)
    assert offsets(backward) == expected[::-1] and backward["complete"]


def test_a_match_names_its_line_and_where_it_is(big_log: Path) -> None:
    data = big_log.read_bytes()
    (first,) = search(big_log, "LOSS NAN", ignore_case=True, limit=1)["matches"]
    line_start = data.rindex(b"\n", 0, first["offset"]) + 1
    assert data[first["offset"]:first["end"]] == b"loss nan"
    assert first["line_offset"] == line_start
    assert (first["before"], first["text"], first["after"]) == ("step 3 ", "loss nan",
                                                                 " lr 0.001")
    assert first["cut"] is False


@pytest.mark.parametrize("pattern", [r"^step 99\d ", r"nan lr", r"^$", r"\d+$", r"(?i)STEP 1\b"])
def test_regex_matches_line_by_line_as_re_does(big_log: Path, pattern: str) -> None:
    data = big_log.read_bytes()
    expected = obvious(data, pattern, re.MULTILINE)
    found, _ = every_page(big_log, pattern, FORWARD, regex=True, limit=1000)
    assert found == expected and expected
    back, _ = every_page(big_log, pattern, BACKWARD, regex=True, limit=1000)
    assert back == expected[::-1]


@pytest.mark.parametrize("direction", [FORWARD, BACKWARD])
def test_pages_under_tiny_budgets_give_what_one_scan_gives(
    big_log: Path, direction: LogSearchDirection
) -> None:
    whole = offsets(search(big_log, "loss nan", limit=1000, direction=direction))
    by_bytes, pages = every_page(big_log, "loss nan", direction, max_bytes=700_000, limit=1000)
    assert by_bytes == whole and pages > 10
    by_count, pages = every_page(big_log, "loss nan", direction, limit=3)
    assert by_count == whole and pages > 100


def test_a_budget_that_runs_out_says_so_and_where_to_go_on(big_log: Path) -> None:
    first = search(big_log, "loss nan", max_bytes=1000)
    assert first["stopped"] == LogSearchStop.BYTES and not first["complete"]
    assert first["next_from"] == first["scanned_to"]
    # One window, then the clock says stop.
    timed = search(big_log, "loss nan", seconds=0.0, limit=1000)
    assert timed["stopped"] == LogSearchStop.TIME and not timed["complete"]
    assert 0 < timed["scanned_to"] <= CHUNK_BYTES
    rest = search(big_log, "loss nan", start=timed["next_from"], limit=1000)
    assert offsets(timed) + offsets(rest) == obvious(big_log.read_bytes(), "loss nan")


def test_next_and_previous_step_through_matches(big_log: Path) -> None:
    data = big_log.read_bytes()
    expected = obvious(data, "loss nan")
    middle = expected[5]
    (after,) = search(big_log, "loss nan", start=middle + 1, limit=1)["matches"]
    (before,) = search(big_log, "loss nan", start=middle, limit=1,
                       direction=BACKWARD)["matches"]
    assert (before["offset"], after["offset"]) == (expected[4], expected[6])
    # From the middle of a line: the rest of that line counts forward, its start backward.
    assert offsets(search(big_log, "lr", start=middle, limit=1)) == [middle + 9]
    assert offsets(search(big_log, "step", start=middle, limit=1,
                          direction=BACKWARD)) == [data.rindex(b"\n", 0, middle) + 1]


def test_a_long_line_is_shown_cut_around_the_match(tmp_path: Path) -> None:
    log = tmp_path / "rank-0.log"
    log.write_bytes(b"a" * 100_000 + b"NEEDLE" + b"b" * 100_000 + b"\nshort NEEDLE\n")
    long, short = search(log, "NEEDLE")["matches"]
    assert (long["offset"], long["line_offset"], long["cut"]) == (100_000, 0, True)
    assert long["text"] == "NEEDLE"
    assert len(long["before"]) + len(long["after"]) + 6 <= SHOWN_BYTES
    assert long["before"].endswith("a") and long["after"].startswith("b")
    assert (short["before"], short["after"], short["cut"]) == ("short ", "", False)


def test_invalid_bytes_are_shown_replaced_and_still_found(tmp_path: Path) -> None:
    log = tmp_path / "rank-0.log"
    log.write_bytes(b"\xff\xfe loss nan \xc3\n")
    (match,) = search(log, "loss nan")["matches"]
    assert (match["offset"], match["before"], match["after"]) == (3, "\ufffd\ufffd ", " \ufffd")


def test_a_dropped_range_is_never_searched(tmp_path: Path) -> None:
    """A range the shim recorded as dropped is skipped (not yet punched: its bytes are
    still there), and the bytes after it start a line."""
    log = tmp_path / "rank-0.log"
    head, dropped, tail = b"head loss nan\n", b"gone loss nan\nmore", b"loss nan tail\n"
    log.write_bytes(head + dropped + tail)
    start = len(head)
    record = LogDrops(limit=1 << 20, ranges=((start, start + len(dropped)),),
                      dropped=len(dropped), marker=None, hole_start=start)
    (tmp_path / "rank-0.log.dropped").write_text(json.dumps(record.to_json()))
    tail_at = start + len(dropped)
    for direction, expected in ((FORWARD, [5, tail_at]), (BACKWARD, [tail_at, 5])):
        assert offsets(search(log, "loss nan", direction=direction)) == expected
        assert offsets(search(log, "^loss", regex=True, direction=direction)) == [tail_at]


def test_a_bad_pattern_is_refused_naming_where() -> None:
    with pytest.raises(InvalidPattern, match=r"missing \) at position 0 .*--fixed"):
        compile_pattern("(loss", regex=True, ignore_case=False)
    with pytest.raises(InvalidPattern, match=r"position 1 \('\(\?='\)"):
        compile_pattern("a(?=b)", regex=True, ignore_case=False)
    compile_pattern("(loss", regex=False, ignore_case=False)  # as text it is fine
    with pytest.raises(InvalidPattern, match="missing \\)"):  # deeper than `re` parses
        compile_pattern("(" * 499 + ")" * 498, regex=True, ignore_case=False)
    with pytest.raises(InvalidRequest, match=r"character 3 .* lone surrogate"):
        compile_pattern("abc\udc80", regex=False, ignore_case=False)
    with pytest.raises(InvalidRequest, match="1 to 1000 characters"):
        compile_pattern("x" * (MAX_PATTERN_CHARS + 1), regex=False, ignore_case=False)
    with pytest.raises(InvalidRequest, match="limit must be between 1 and 1000"):
        SearchPlan(compile_pattern("x", regex=False, ignore_case=False), limit=1001)


def test_the_service_picks_attempt_and_rank_as_the_log_routes_do(
    store: Store, tmp_path: Path
) -> None:
    trial_id = add_trial_with_ranks(store, [tmp_path / "a1", tmp_path / "a2"], 2)
    RankFiles(tmp_path / "a1", 0).append((1.0, b"first attempt nan\n"))
    RankFiles(tmp_path / "a2", 0).append((2.0, b"rank zero\n"))
    RankFiles(tmp_path / "a2", 1).append((2.0, b"rank one nan\n"))
    plan = SearchPlan(compile_pattern("nan", regex=False, ignore_case=False))
    latest = search_log(store, LAUNCHER, trial_id, plan)
    assert (latest["attempt"], latest["rank"], latest["ranks"]) == (2, 0, [0, 1])
    assert latest["matches"] == [] and latest["complete"]
    (one,) = search_log(store, LAUNCHER, trial_id, plan, rank=1)["matches"]
    assert one["offset"] == 9
    (early,) = search_log(store, LAUNCHER, trial_id, plan, attempt=1)["matches"]
    assert early["before"] == "first attempt "
    with pytest.raises(NotFound, match="no rank 5; pass rank= one of its ranks: 0, 1"):
        search_log(store, LAUNCHER, trial_id, plan, rank=5)
    with pytest.raises(NotFound, match="no attempt 3"):
        search_log(store, LAUNCHER, trial_id, plan, attempt=3)
    with pytest.raises(NotFound):
        search_log(store, LAUNCHER, trial_id + 1000, plan)


def test_a_line_longer_than_a_chunk_is_searched_in_pieces(tmp_path: Path) -> None:
    """A 5 MiB line (a progress bar redrawn with \\r for hours) costs what its pieces do:
    each needle in it is found both ways, as are the lines around it."""
    mib = 1024**2
    line = bytearray(b"\r" * (5 * mib))
    needles = [mib // 2, 5 * mib // 2, 9 * mib // 2]
    for at in needles:
        line[at:at + 6] = b"NEEDLE"
    log = tmp_path / "rank-0.log"
    log.write_bytes(b"NEEDLE before\n" + bytes(line) + b"\nNEEDLE after\n")
    expected = [0, *(14 + at for at in needles), 14 + 5 * mib + 1]
    assert offsets(search(log, "NEEDLE")) == expected
    assert offsets(search(log, "NEEDLE", direction=BACKWARD)) == expected[::-1]
    paged, pages = every_page(log, "NEEDLE", FORWARD, max_bytes=1)
    assert paged == expected and pages >= 5


LINES = st.lists(st.sampled_from([b"step 1 loss nan", b"", b"nan nan", b"step 22 ok",
                                  b"\xffnan\xfe", b"x" * 300 + b" loss nan"]), max_size=40)


@settings(max_examples=60, deadline=None)
@given(lines=LINES, pattern=st.sampled_from([("nan", False), ("^step", True),
                                             ("nan$", True), ("^$", True)]),
       limit=st.integers(1, 5), max_bytes=st.integers(1, 400), cut=st.integers(0, 2000))
def test_any_paging_from_anywhere_gives_the_obvious_matches(
    lines: list[bytes], pattern: tuple[str, bool], limit: int, max_bytes: int, cut: int
) -> None:
    data = b"\n".join(lines) + (b"\n" if lines else b"")
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "rank-0.log"
        log.write_bytes(data)
        text, regex = pattern
        expected = obvious(data, text, re.MULTILINE)
        start = min(cut, len(data))
        for direction, wanted in ((FORWARD, [m for m in expected if m >= start]),
                                  (BACKWARD, [m for m in expected[::-1] if m < start])):
            found, at = [], start
            for _ in range(len(data) + 2):
                page = search(log, text, regex=regex, direction=direction, start=at,
                              limit=limit, max_bytes=max_bytes)
                found += offsets(page)
                if page["complete"]:
                    break
                at = page["next_from"]
            assert page["complete"] and found == wanted, (direction, start)


def test_searches_past_the_most_at_once_are_refused_until_one_ends(
    store: Store, tmp_path: Path
) -> None:
    trial_id = add_trial_with_ranks(store, [tmp_path / "a1"], 1)
    RankFiles(tmp_path / "a1", 0).append((1.0, b"loss nan\n"))
    plan = SearchPlan(compile_pattern("nan", regex=False, ignore_case=False))
    with contextlib.ExitStack() as scanning:
        for _ in range(MAX_SCANS):
            scanning.enter_context(SCANS.held())
        with pytest.raises(TooManyRequests, match="4 log searches are already scanning"
                           ) as refused:
            search_log(store, LAUNCHER, trial_id, plan)
        assert refused.value.retry_after == 1
    assert len(search_log(store, LAUNCHER, trial_id, plan)["matches"]) == 1
    with pytest.raises(NotFound):  # a refused search gave its slot back
        search_log(store, LAUNCHER, trial_id, plan, rank=7)
    for _ in range(MAX_SCANS):
        assert search_log(store, LAUNCHER, trial_id, plan)["complete"]
