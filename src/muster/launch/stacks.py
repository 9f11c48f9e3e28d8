"""Stacks of a stuck replica, read from py-spy or faulthandler, and the one line that says where
it waits ("waits in all_reduce at train.py:88").

Pure functions over text, table-tested on real outputs (tests/launch/data/stacks/); the
collector (`muster.launch.evidence`) runs the tools. Frames are innermost first, as both
tools print them.

The line names the frame a person would look at first: the innermost frame of the user's
own code (not the standard library, not an installed package, not muster), and what it
called there: the outermost library function below it, passing over decorators' wrappers
(`all_reduce`, not torch's `_exception_logger.<locals>.wrapper`); where the user's frame
called straight into C, the C function when it is a well-known one (`Lock.acquire`), else
the user's own function ("in <module> at train.py:12").
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import muster

__all__ = ["Frame", "ThreadStack", "main_thread", "parse_faulthandler", "parse_py_spy",
           "render", "where"]

NAME_CHARS = 200  # a C++ frame's name can run to kilobytes of template arguments
_MUSTER = str(Path(muster.__file__).resolve().parent) + "/"
# Installed code: the standard library and every site's packages, of any interpreter.
_LIBRARY = re.compile(r"/lib(?:64)?/python3\.[0-9]+/|/site-packages/|/dist-packages/")
# muster's harness as a trial imports it: from muster's package, or a copy of it in a layer.
_HARNESS = re.compile(r"/muster/harness/")
# Frames that only pass a call on: closures that decorators return, and torch's Module call.
_WRAPPERS = frozenset({"wrapper", "wrapped", "inner", "_fn", "decorate_context",
                       "_call_impl", "_wrapped_call_impl"})
# C functions of CPython that a plain script blocks in, by the name Python code calls them.
KNOWN_NATIVE = {
    "lock_PyThread_acquire_lock": "Lock.acquire",
    "rlock_acquire": "RLock.acquire",
    "time_sleep": "time.sleep",
    "select_select_impl": "select.select",
    "select_poll_poll_impl": "poll.poll",
    "select_epoll_poll_impl": "epoll.poll",
    "sock_recv": "socket.recv",
    "sock_recv_into": "socket.recv_into",
    "sock_accept": "socket.accept",
    "os_read_impl": "os.read",
    "os_waitpid_impl": "os.waitpid",
    "os_wait_impl": "os.wait",
    "signal_pause_impl": "signal.pause",
    "_queue_SimpleQueue_get_impl": "SimpleQueue.get",
}


@dataclass(frozen=True)
class Frame:
    """One frame: a Python function at `file`:`line`, or a native one (line 0)."""

    function: str
    file: str  # the full path as the process knows it
    short: str  # as people read it: the path below its package root, else the file name
    line: int
    native: bool = False

    @property
    def is_user(self) -> bool:
        """The user's own code: Python, and neither installed (stdlib, a package) nor muster."""
        if self.native or self.file.startswith("<"):
            return False
        return not (_LIBRARY.search(self.file) or _HARNESS.search(self.file)
                    or self.file.startswith(_MUSTER))

    @property
    def is_wrapper(self) -> bool:
        return "<locals>" in self.function or self.function.rpartition(".")[2] in _WRAPPERS

    def text(self) -> str:
        return f"{self.function} ({self.short})" if self.native else (
            f"{self.function} ({self.short}:{self.line})")


@dataclass(frozen=True)
class ThreadStack:
    """One thread of one process; `idle` is py-spy's judgement (None: not known)."""

    pid: int
    thread: int  # the OS thread id (py-spy) or the pthread id (faulthandler)
    name: str
    idle: bool | None
    frames: tuple[Frame, ...]
    main: bool


def parse_py_spy(text: str | bytes, pid: int) -> list[ThreadStack]:
    """The threads in `py-spy dump --json` output (with `--native` or without).

    Raises:
        ValueError: it is not py-spy's JSON.
    """
    data = json.loads(text)
    if not isinstance(data, list):
        raise ValueError("py-spy's JSON is not a list of threads")
    return [_py_spy_thread(item, pid) for item in data]


def _py_spy_thread(item: object, pid: int) -> ThreadStack:
    if not isinstance(item, dict) or not isinstance(item.get("frames"), list):
        raise ValueError("a thread in py-spy's JSON has no frames")
    thread = item.get("os_thread_id") or item.get("thread_id") or 0
    name = str(item.get("thread_name") or "")
    frames = tuple(_py_spy_frame(frame) for frame in item["frames"] if isinstance(frame, dict))
    return ThreadStack(pid=pid, thread=int(thread), name=name, idle=not item.get("active"),
                       frames=frames, main=thread == pid or name == "MainThread")


def _py_spy_frame(frame: dict[str, object]) -> Frame:
    """A py-spy frame: a native one names its library as `module` and has no line."""
    line = frame.get("line")
    native = frame.get("module") is not None and not line
    return Frame(function=str(frame.get("name") or "?")[:NAME_CHARS],
                 file=str(frame.get("filename") or ""),
                 short=str(frame.get("short_filename") or frame.get("filename") or ""),
                 line=line if isinstance(line, int) else 0, native=native)


_FH_THREAD = re.compile(r"^(Current thread|Thread) (0x[0-9a-f]+) \(most recent call first\):$")
_FH_FRAME = re.compile(r'^  File "(.*)", line ([0-9]+) in (.*)$')


def parse_faulthandler(text: str, pid: int) -> list[ThreadStack]:
    """The threads in what `faulthandler.dump_traceback(all_threads=True)` printed.

    It lists the newest thread first, so the main thread (the first one started) is last.
    """
    blocks: list[tuple[int, list[Frame]]] = []
    for line in text.splitlines():
        if header := _FH_THREAD.match(line):
            blocks.append((int(header[2], 16), []))
        elif (frame := _FH_FRAME.match(line)) and blocks:
            file = frame[1]
            blocks[-1][1].append(Frame(function=frame[3][:NAME_CHARS], file=file,
                                       short=Path(file).name, line=int(frame[2])))
    return [ThreadStack(pid=pid, thread=thread, name="", idle=None, frames=tuple(frames),
                        main=index == len(blocks) - 1)
            for index, (thread, frames) in enumerate(blocks)]


def render(pid: int, command: str, threads: Sequence[ThreadStack]) -> str:
    """The threads as people read them, in py-spy's own text layout, the main one first."""
    lines = [f"Process {pid}: {command}"]
    for thread in sorted(threads, key=lambda t: not t.main):
        state = "" if thread.idle is None else (" (idle)" if thread.idle else " (active)")
        lines.append(f'Thread {thread.thread}{state}: "{thread.name}"')
        lines.extend(f"    {frame.text()}" for frame in thread.frames)
    return "\n".join(lines) + "\n"


def main_thread(processes: Sequence[Sequence[ThreadStack]]) -> ThreadStack | None:
    """The main thread that says most: of the first process (the group's leader first) whose
    main thread is in the user's code, else of the first process with a main thread."""
    mains = [thread for threads in processes for thread in threads if thread.main]
    return next((t for t in mains if any(f.is_user for f in t.frames)),
                mains[0] if mains else None)


@dataclass(frozen=True)
class Where:
    """Where a thread is, as one line, and the frame it names."""

    text: str
    frame: Frame | None


def where(thread: ThreadStack) -> Where:
    """"waits in all_reduce at train.py:88": what the user's innermost frame called, and
    where; "in" instead of "waits in" when the thread runs, or nobody knows."""
    verb = "waits in" if thread.idle else "in"
    frames = thread.frames
    user = next((i for i, frame in enumerate(frames) if frame.is_user), None)
    if user is None:
        python = next((frame for frame in frames if not frame.native), None)
        if python is None:
            return Where("has no Python frame", None)
        return Where(f"{verb} {python.function} at {python.short}:{python.line}", python)
    at = frames[user]
    return Where(f"{verb} {_callee(frames[:user]) or at.function} at {at.short}:{at.line}", at)


def _callee(inner: Sequence[Frame]) -> str | None:
    """What the user's frame called: the outermost library function of `inner` that is not
    a wrapper, else the C function it called straight into, when it is a known one."""
    library = [frame for frame in inner if not frame.native]
    for frame in reversed(library):
        if not frame.is_wrapper:
            return frame.function
    if library:
        return library[-1].function
    return KNOWN_NATIVE.get(inner[-1].function) if inner else None
