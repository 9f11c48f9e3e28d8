"""What a log says against an exit 0: the findings table, and the scan of a real log's tail
(in the server when it is small, else in a child) that dates each finding by its index."""

from __future__ import annotations

from pathlib import Path

import pytest

from muster.launch.logs import FileLog
from muster.supervise import log_errors
from muster.supervise.log_errors import Finding, findings_in, numbered_lines, scan_log


def lines(text: bytes) -> list[tuple[int, bytes]]:
    out, offset = [], 0
    for line in text.splitlines(keepends=True):
        out.append((offset, line))
        offset += len(line)
    return out


TRACEBACK = (b"step 149 loss 0.1\n"
             b"Traceback (most recent call last):\n"
             b'  File "train.py", line 10, in <module>\n'
             b"    main()\n"
             b"ValueError: bad batch at 150\n"
             b"training failed, exiting cleanly\n")


@pytest.mark.parametrize(("text", "found"), [
    (b"epoch 1 loss 0.5\nall done\n", []),
    (TRACEBACK, [("traceback", 18, "ValueError: bad batch at 150")]),
    # A chained exception: each one, its heading skipped.
    (b"Traceback (most recent call last):\n  File \"a.py\", line 1\nKeyError: 'x'\n\n"
     b"During handling of the above exception, another exception occurred:\n\n"
     b"Traceback (most recent call last):\n  File \"a.py\", line 3\nRuntimeError: wrapped\n",
     [("traceback", 0, "KeyError: 'x'"), ("traceback", 141, "RuntimeError: wrapped")]),
    # Ctrl-C with and without its traceback.
    (b"Traceback (most recent call last):\n  File \"t.py\", line 2\nKeyboardInterrupt\n",
     [("keyboard_interrupt", 0, "KeyboardInterrupt")]),
    (b"KeyboardInterrupt\n", [("keyboard_interrupt", 0, "KeyboardInterrupt")]),
    (b"RuntimeError: CUDA error: an illegal memory access was encountered\n",
     [("device_error", 0, "RuntimeError: CUDA error: an illegal memory access was encountered")]),
    (b"[rank1]: NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled system error\n",
     [("device_error", 0, "[rank1]: NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled "
                          "system error")]),
    (b"Traceback (most recent call last):\n  x\ntorch.OutOfMemoryError: CUDA out of memory.\n",
     [("device_error", 0, "torch.OutOfMemoryError: CUDA out of memory.")]),
])
def test_findings(text: bytes, found: list[tuple[str, int, str]]) -> None:
    findings, total = findings_in(lines(text))
    assert [(f.kind, f.offset, f.text) for f in findings] == found
    assert total == len(found)


def test_many_findings_keep_the_first_and_the_last() -> None:
    text = b"".join(b"KeyboardInterrupt %d\n" % i for i in range(100))
    findings, total = findings_in(lines(text))
    assert total == 100
    kept = [f.text for f in findings]
    assert kept[:3] == ["KeyboardInterrupt 0", "KeyboardInterrupt 1", "KeyboardInterrupt 2"]
    assert kept[3:] == [f"KeyboardInterrupt {i}" for i in range(80, 100)]


def test_a_scan_from_inside_the_log_skips_the_partial_first_line() -> None:
    import io
    stream = io.BytesIO(b"ceback (most recent call last):\nKeyboardInterrupt\n")
    assert list(numbered_lines(stream, 1000)) == [(1032, b"KeyboardInterrupt\n")]


@pytest.mark.parametrize("in_child", [False, True])
def test_a_real_log_is_scanned_and_dated_by_its_index(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, in_child: bool
) -> None:
    # A small log is read in the server; a bigger one (here: any) in a child process.
    if in_child:
        monkeypatch.setattr(log_errors, "IN_PROCESS_BYTES", 0)
    log = tmp_path / "rank-0.log"
    log.write_bytes(TRACEBACK)
    (tmp_path / "rank-0.index").write_text("0 100.5\n18 107.25\n")
    scan = scan_log(FileLog(0, log))
    assert scan.problem is None and scan.total == 1
    assert scan.findings == (Finding("traceback", 18, "ValueError: bad batch at 150", 107.25),)


def test_only_the_tail_of_a_long_log_is_read(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    tail = len(TRACEBACK) + 5  # from inside the last KeyboardInterrupt line
    monkeypatch.setattr(log_errors, "MAX_SCAN_BYTES", tail)
    monkeypatch.setattr(log_errors, "IN_PROCESS_BYTES", 0)
    log = tmp_path / "rank-0.log"
    log.write_bytes(b"KeyboardInterrupt\n" * 10 + TRACEBACK)
    scan = scan_log(FileLog(0, log))
    size = log.stat().st_size
    assert scan.scanned_from == size - tail
    assert [f.text for f in scan.findings] == ["ValueError: bad batch at 150"]


def test_no_log_is_no_finding(tmp_path: Path) -> None:
    assert scan_log(FileLog(2, tmp_path / "rank-2.log")).findings == ()
