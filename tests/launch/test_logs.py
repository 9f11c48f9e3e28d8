"""Log reading helpers: byte ranges and tails that cost what they return."""

from __future__ import annotations

from pathlib import Path

import pytest

from muster.launch.logs import BLOCK_BYTES, FileLog, log_size, read_range, tail_offset, tail_text

CONTENT = b"0123456789"


@pytest.mark.parametrize(
    ("offset", "limit", "expected"),
    [
        (0, 4, (b"0123", 4)),
        (0, 10, (CONTENT, 10)),
        (4, 100, (b"456789", 10)),
        (9, 1, (b"9", 10)),
        (3, 0, (b"", 3)),
        (10, 5, (b"", 10)),
        (25, 5, (b"", 25)),
    ],
)
def test_read_range(tmp_path: Path, offset: int, limit: int, expected: tuple[bytes, int]) -> None:
    path = tmp_path / "rank-0.log"
    path.write_bytes(CONTENT)
    assert read_range(FileLog(0, path), offset, limit) == expected


@pytest.mark.parametrize(("offset", "limit"), [(0, 10), (7, 3)])
def test_read_range_of_a_missing_log_is_empty(tmp_path: Path, offset: int, limit: int) -> None:
    assert read_range(FileLog(0, tmp_path / "missing.log"), offset, limit) == (b"", offset)


@pytest.mark.parametrize(("offset", "limit"), [(-1, 10), (0, -1)])
def test_read_range_rejects_negative_numbers(tmp_path: Path, offset: int, limit: int) -> None:
    with pytest.raises(ValueError, match="must be >= 0"):
        read_range(FileLog(0, tmp_path / "x.log"), offset, limit)


@pytest.mark.parametrize(
    ("content", "lines", "expected"),
    [
        (b"", 3, 0),
        (b"a\nb\nc\n", 0, 6),
        (b"a\nb\nc\n", 1, 4),
        (b"a\nb\nc\n", 2, 2),
        (b"a\nb\nc\n", 3, 0),
        (b"a\nb\nc\n", 9, 0),
        (b"a\nb\nc", 1, 4),
        (b"a\nb\nc", 2, 2),
        (b"a\nb\nc", 3, 0),
        (b"only line", 1, 0),
        (b"only line\n", 1, 0),
        (b"\n\n\n", 1, 2),
        (b"\n\n\n", 3, 0),
        (b"a\r\nb\r\n", 1, 3),
        (b"\xff\xfe\n\x00\n", 1, 3),
    ],
)
def test_tail_offset(tmp_path: Path, content: bytes, lines: int, expected: int) -> None:
    path = tmp_path / "rank-0.log"
    path.write_bytes(content)
    assert tail_offset(FileLog(0, path), lines) == expected


@pytest.mark.parametrize("trailing_newline", [True, False])
def test_tail_offset_with_lines_longer_than_a_block(tmp_path: Path, trailing_newline: bool) -> None:
    long_a, long_b = b"a" * (3 * BLOCK_BYTES + 5), b"b" * (BLOCK_BYTES + 1)
    content = long_a + b"\n" + long_b + b"\n" + b"short" + (b"\n" if trailing_newline else b"")
    path = tmp_path / "rank-0.log"
    path.write_bytes(content)
    assert tail_offset(FileLog(0, path), 1) == len(long_a) + len(long_b) + 2
    assert tail_offset(FileLog(0, path), 2) == len(long_a) + 1
    assert tail_offset(FileLog(0, path), 3) == 0


def test_tail_offset_across_many_blocks_matches_a_naive_split(tmp_path: Path) -> None:
    lines = [b"line %d %s" % (i, b"x" * (i % 97)) for i in range(20_000)]
    content = b"\n".join(lines) + b"\n"
    path = tmp_path / "rank-0.log"
    path.write_bytes(content)
    for n in (1, 7, 500, 1234, 19_999, 20_000):
        tail = b"".join(x + b"\n" for x in lines[-n:])
        assert tail_offset(FileLog(0, path), n) == len(content) - len(tail)


def test_tail_offset_of_a_missing_log_is_0(tmp_path: Path) -> None:
    assert tail_offset(FileLog(0, tmp_path / "missing.log"), 5) == 0


def test_tail_offset_rejects_negative_lines(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="lines must be >= 0"):
        tail_offset(FileLog(0, tmp_path / "x.log"), -1)


def test_tail_text_decodes_for_display(tmp_path: Path) -> None:
    path = tmp_path / "rank-0.log"
    path.write_bytes(b"first\nbad \xff byte\nlast")
    assert tail_text(FileLog(0, path), 2) == "bad \ufffd byte\nlast"
    assert tail_text(FileLog(0, tmp_path / "missing.log"), 2) == ""


def test_log_size(tmp_path: Path) -> None:
    path = tmp_path / "rank-0.log"
    assert log_size(FileLog(0, path)) == 0
    path.write_bytes(CONTENT)
    assert log_size(FileLog(0, path)) == len(CONTENT)
