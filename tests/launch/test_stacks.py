"""The one line that says where a stuck replica waits, table-tested on real tool outputs.

The files in data/stacks/ are what py-spy 0.4.3 (`dump --json`, with and without
`--native`) and faulthandler printed for tests/fixtures/stuck.py on CPython 3.11 and torch
2.13 (CPU): each mode stuck, then dumped.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from muster.launch.stacks import (
    Frame,
    ThreadStack,
    main_thread,
    parse_faulthandler,
    parse_py_spy,
    render,
    where,
)

DATA = Path(__file__).resolve().parent / "data" / "stacks"


def _main(name: str) -> ThreadStack:
    threads = parse_py_spy((DATA / name).read_text(), pid=0)
    return next(t for t in threads if t.name == "MainThread")


@pytest.mark.parametrize(("name", "line"), [
    # A plain lock: without native frames the user's own function is all there is to name.
    ("lock.json", "waits in wait_on_lock at stuck.py:30"),
    ("lock-native.json", "waits in Lock.acquire at stuck.py:30"),
    # torch's decorator wrapper is passed over: the function the script called is named.
    ("all-reduce-rank1.json", "waits in all_reduce at stuck.py:44"),
    ("all-reduce-rank1-native.json", "waits in all_reduce at stuck.py:44"),
    ("all-reduce-rank0-native.json", "waits in time.sleep at stuck.py:46"),
    ("loader.json", "waits in _BaseDataLoaderIter.__next__ at stuck.py:63"),
])
def test_the_line_names_what_the_users_innermost_frame_called(name: str, line: str) -> None:
    assert where(_main(name)).text == line


def test_faulthandlers_output_names_the_main_threads_user_frame() -> None:
    threads = parse_faulthandler((DATA / "harness-lock.faulthandler.txt").read_text(), pid=7)
    assert len(threads) == 3 and [t.main for t in threads] == [False, False, True]
    spot = where(threads[-1])
    assert spot.text == "in wait_on_lock at stuck.py:30"
    assert spot.frame is not None and spot.frame.function == "wait_on_lock"
    # The harness's own thread (muster's code) is never taken for the user's.
    background = threads[1]
    assert not any(frame.is_user for frame in background.frames)


def _thread(*frames: Frame, main: bool = True, idle: bool | None = True) -> ThreadStack:
    return ThreadStack(pid=1, thread=1, name="MainThread", idle=idle, frames=frames, main=main)


USER = Frame("train", "/work/train.py", "train.py", 88)
TORCH = "/venv/lib/python3.11/site-packages/torch/nn/modules/module.py"


@pytest.mark.parametrize(("frames", "idle", "line"), [
    # A running thread is "in", not "waits in".
    ((Frame("matmul", "/usr/lib/python3.12/x.py", "x.py", 3), USER), False,
     "in matmul at train.py:88"),
    # The Module call machinery passes the call on: the layer's forward is named.
    ((Frame("Linear.forward", TORCH, "torch/nn/modules/linear.py", 5),
      Frame("Module._call_impl", TORCH, "torch/nn/modules/module.py", 1),
      Frame("Module._wrapped_call_impl", TORCH, "torch/nn/modules/module.py", 2), USER), True,
     "waits in Linear.forward at train.py:88"),
    # An unknown C function: the user's own function.
    ((Frame("mystery_c", "/lib/libx.so", "libx.so", 0, native=True), USER), True,
     "waits in train at train.py:88"),
    # No user frame at all (python -m some.tool): the innermost Python frame.
    ((Frame("poll", "/usr/lib/python3.11/selectors.py", "selectors.py", 9),), True,
     "waits in poll at selectors.py:9"),
    ((Frame("clock_nanosleep", "/lib/libc.so.6", "libc.so.6", 0, native=True),), True,
     "has no Python frame"),
    # muster's harness (from a trial's layer) is not the user's code.
    ((Frame("Checkpoints.save", "/home/m/envs/harness/muster/harness/checkpoints.py",
            "muster/harness/checkpoints.py", 40), USER), None,
     "in Checkpoints.save at train.py:88"),
])
def test_where_on_frames_of_every_kind(frames: tuple[Frame, ...], idle: bool | None,
                                       line: str) -> None:
    assert where(_thread(*frames, idle=idle)).text == line


def test_the_main_thread_in_user_code_wins_over_the_leaders() -> None:
    launcher = _thread(Frame("poll", "/usr/lib/python3.11/selectors.py", "selectors.py", 9))
    worker = _thread(USER)
    assert main_thread([[launcher], [worker]]) is worker
    assert main_thread([[launcher], []]) is launcher
    assert main_thread([[_thread(USER, main=False)]]) is None


def test_render_puts_the_main_thread_first_and_cuts_long_names() -> None:
    threads = parse_py_spy((DATA / "all-reduce-rank1-native.json").read_text(), pid=5)
    text = render(5, "python stuck.py all-reduce", threads)
    assert text.startswith("Process 5: python stuck.py all-reduce\nThread ")
    assert "    all_reduce (torch/distributed/distributed_c10d.py:" in text
    assert max(len(line) for line in text.splitlines()) < 260  # pybind11's names, cut


@pytest.mark.parametrize("text", ["{}", "[1]", '[{"frames": 3}]', "not json"])
def test_what_is_not_py_spys_json_is_refused(text: str) -> None:
    with pytest.raises(ValueError):
        parse_py_spy(text, pid=1)
