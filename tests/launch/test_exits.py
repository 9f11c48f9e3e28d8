"""classify_exit: ARCHITECTURE.md's exit classification table, rule by rule and in order."""

from __future__ import annotations

import errno
import signal
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from muster.launch.base import ExitRecord, OomKill
from muster.launch.exits import Classification, ExitObservation, classify_exit, termination_reason
from muster.states import OomSource, Reason

VALUE_ERROR_TAIL = """\
epoch 1 loss 0.53
Traceback (most recent call last):
  File "/work/train.py", line 12, in <module>
    main()
  File "/work/train.py", line 9, in main
    raise ValueError("bad shape")
ValueError: bad shape
"""

CHAINED_TAIL = """\
Traceback (most recent call last):
  File "/work/train.py", line 3, in <module>
    import torch
ImportError: no torch
During handling of the above exception, another exception occurred:

Traceback (most recent call last):
  File "/work/train.py", line 5, in <module>
    fallback()
KeyError: 'cpu'
"""

MAIN_SCRIPT_SYNTAX_ERROR = """\
  File "/work/train.py", line 1
    def f(
         ^
SyntaxError: '(' was never closed
"""

MEMORY_ERROR_TAIL = """\
Traceback (most recent call last):
  File "/work/train.py", line 4, in <module>
    data = bytearray(1 << 40)
MemoryError
"""

CUDA_OOM_TAIL = """\
[rank1]: Traceback (most recent call last):
[rank1]:   File "/work/train.py", line 9, in <module>
[rank1]:     loss.backward()
[rank1]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a \
total capacity of 79.10 GiB of which 1.02 GiB is free.
"""

TORCH_CPU_OOM_TAIL = """\
Traceback (most recent call last):
  File "/work/train.py", line 2, in <module>
    torch.empty(1 << 62, dtype=torch.uint8)
RuntimeError: [enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't \
allocate memory: you tried to allocate 4611686018427387904 bytes. Error code 12 (Cannot \
allocate memory)
"""

GiB = 1 << 30
OVER_LIMIT = {"oom": OomKill(OomSource.CGROUP, 4 * GiB, 24 * GiB),
              "memory_limit_bytes": 4 * GiB, "peak_memory_bytes": 4509715660,
              "peak_rss_bytes": 4509715660}
# The kernel's OOM killer, without a memory_limit: seen by the replica's cgroup, or read in
# the kernel log (no cgroup).
KERNEL_OOM = {"oom": OomKill(OomSource.CGROUP, None, 24 * GiB),
              "peak_rss_bytes": int(21.3 * GiB)}
KMSG_OOM = {"oom": OomKill(OomSource.KMSG, None, 24 * GiB), "peak_rss_bytes": int(21.3 * GiB)}

# The last 20 lines of a chained urllib traceback: the "Traceback" header is above them.
URL_ERROR_TAIL = """\
  File "/usr/lib/python3.11/urllib/request.py", line 519, in open
    response = self._open(req, data)
  File "/usr/lib/python3.11/urllib/request.py", line 536, in _open
    result = self._call_chain(self.handle_open, protocol, protocol +
  File "/usr/lib/python3.11/urllib/request.py", line 496, in _call_chain
    result = func(*args)
  File "/usr/lib/python3.11/urllib/request.py", line 1391, in https_open
    return self.do_open(http.client.HTTPSConnection, req,
  File "/usr/lib/python3.11/urllib/request.py", line 1351, in do_open
    raise URLError(err)
urllib.error.URLError: <urlopen error [Errno -3] Temporary failure in name resolution>
"""

FAULTHANDLER_DUMP = """\
Fatal Python error: Segmentation fault

Current thread 0x00007f7d6c1b8740 (most recent call first):
  File "/work/train.py", line 3 in <module>

Extension modules: numpy.core._multiarray_umath (total: 1)
"""


def record(
    returncode: int | None = 0, exit_code: int | None = None, sig: str | None = None, **extra: Any
) -> ExitRecord:
    """An exit record as the shim writes it; exit_code/signal derive from returncode."""
    if exit_code is None and returncode is not None:
        exit_code = 128 - returncode if returncode < 0 else returncode
    if sig is None and returncode is not None and returncode < 0:
        sig = signal.Signals(-returncode).name
    fields: dict[str, Any] = {
        "returncode": returncode,
        "exit_code": exit_code,
        "signal": sig,
        "pid": 4242,
        "start_ticks": 1,
        "started_at": 1.0,
        "ended_at": 2.0,
        "max_rss_bytes": None,
    }
    return ExitRecord(**(fields | extra))


def spawn_failure(err: int) -> ExitRecord:
    return record(
        returncode=None,
        exit_code=None,
        spawn_error=f"[Errno {err}] {errno.errorcode[err]}: 'train.py'",
        spawn_errno=err,
    )


def classify(exit: ExitRecord | None, rank: int = 0, **extra: Any) -> Classification:
    return classify_exit(ExitObservation(rank=rank, exit=exit, **extra))


@pytest.mark.parametrize(
    ("observation", "reason"),
    [
        # 1. muster could not launch the shim: INTERNAL, before anything else
        (ExitObservation(0, None, launch_error="disk full", lost=True), Reason.INTERNAL),
        (ExitObservation(0, record(0), launch_error="disk full"), Reason.INTERNAL),
        # 2. lost: no exit record, nothing alive
        (ExitObservation(0, None, lost=True), Reason.LOST),
        (ExitObservation(0, None, lost=True, stop_requested=True), Reason.LOST),
        # 3. spawn errors: the program cannot run (permanent) or muster's problem (internal)
        (ExitObservation(0, spawn_failure(errno.ENOENT)), Reason.PERMANENT_ERROR),
        (ExitObservation(0, spawn_failure(errno.EACCES)), Reason.PERMANENT_ERROR),
        (ExitObservation(0, spawn_failure(errno.ENOEXEC)), Reason.PERMANENT_ERROR),
        (ExitObservation(0, spawn_failure(errno.ENOTDIR)), Reason.PERMANENT_ERROR),
        (ExitObservation(0, spawn_failure(errno.EISDIR)), Reason.PERMANENT_ERROR),
        (ExitObservation(0, spawn_failure(errno.EMFILE)), Reason.INTERNAL),
        (ExitObservation(0, spawn_failure(errno.ENOMEM)), Reason.INTERNAL),
        (
            ExitObservation(0, spawn_failure(errno.ENOENT), stop_requested=True),
            Reason.PERMANENT_ERROR,
        ),
        # 4. stopped by muster, whatever the code
        (ExitObservation(0, record(-15), stop_requested=True), Reason.STOPPED),
        (ExitObservation(0, record(-9, stop_requested=True)), Reason.STOPPED),
        (ExitObservation(0, record(0), stop_requested=True), Reason.STOPPED),
        (ExitObservation(0, record(1), stop_requested=True), Reason.STOPPED),
        (ExitObservation(0, record(-11), stop_requested=True), Reason.STOPPED),
        (
            ExitObservation(0, record(2), log_tail=VALUE_ERROR_TAIL, stop_requested=True),
            Reason.STOPPED,
        ),
        # 5. exit 0
        (ExitObservation(0, record(0)), Reason.OK),
        (ExitObservation(0, record(0), log_tail=VALUE_ERROR_TAIL), Reason.OK),
        # 5b. out of memory: over the shim's limit or killed by the kernel's OOM killer,
        # limit or not (that SIGKILL is not INFRA), or the process said so (after signals
        # and transient codes, before permanent errors)
        (ExitObservation(0, record(-9, **OVER_LIMIT)), Reason.OOM),
        (ExitObservation(0, record(1, **OVER_LIMIT)), Reason.OOM),
        (ExitObservation(0, record(-9, **KERNEL_OOM)), Reason.OOM),
        (ExitObservation(0, record(-9, **KMSG_OOM)), Reason.OOM),
        (ExitObservation(0, record(137, **KERNEL_OOM)), Reason.OOM),  # under a shell
        (ExitObservation(0, record(1, **KMSG_OOM), log_tail=VALUE_ERROR_TAIL), Reason.OOM),
        (ExitObservation(0, record(0, **KERNEL_OOM)), Reason.OK),  # a worker, but it coped
        (ExitObservation(0, record(-9, **KERNEL_OOM), stop_requested=True), Reason.STOPPED),
        (ExitObservation(0, record(-9, **OVER_LIMIT), stop_requested=True), Reason.STOPPED),
        (ExitObservation(0, record(1), log_tail=MEMORY_ERROR_TAIL), Reason.OOM),
        (ExitObservation(0, record(1), log_tail=CUDA_OOM_TAIL), Reason.OOM),
        (ExitObservation(0, record(1), log_tail=TORCH_CPU_OOM_TAIL), Reason.OOM),
        (
            ExitObservation(
                0, record(1), log_tail=VALUE_ERROR_TAIL.replace(
                    "ValueError: bad shape", "RuntimeError: CUDA error: out of memory")
            ),
            Reason.OOM,
        ),
        (ExitObservation(0, record(2), log_tail=MEMORY_ERROR_TAIL), Reason.OOM),
        (ExitObservation(0, record(-9), log_tail=MEMORY_ERROR_TAIL), Reason.INFRA),
        (
            ExitObservation(
                0, record(1), log_tail=MEMORY_ERROR_TAIL, transient_exit_codes=frozenset({1})
            ),
            Reason.TRANSIENT,
        ),
        # 6. signals, Python-style and shell-style
        (ExitObservation(0, record(-6)), Reason.TRANSIENT),
        (ExitObservation(0, record(-11)), Reason.TRANSIENT),
        (ExitObservation(0, record(-7)), Reason.TRANSIENT),  # SIGBUS
        (ExitObservation(0, record(134)), Reason.TRANSIENT),
        (ExitObservation(0, record(139)), Reason.TRANSIENT),
        (ExitObservation(0, record(135)), Reason.TRANSIENT),
        (ExitObservation(0, record(-9)), Reason.INFRA),
        (ExitObservation(0, record(-15)), Reason.INFRA),  # SIGTERM, not from muster
        (ExitObservation(0, record(-2)), Reason.INFRA),
        (ExitObservation(0, record(137)), Reason.INFRA),
        (ExitObservation(0, record(143)), Reason.INFRA),
        (ExitObservation(0, record(-9), transient_exit_codes=frozenset({137})), Reason.INFRA),
        (ExitObservation(0, record(139), log_tail=MAIN_SCRIPT_SYNTAX_ERROR), Reason.TRANSIENT),
        # 7. exit codes the experiment calls transient
        (ExitObservation(0, record(75), transient_exit_codes=frozenset({75})), Reason.TRANSIENT),
        (ExitObservation(0, record(2), transient_exit_codes=frozenset({2})), Reason.TRANSIENT),
        (
            ExitObservation(
                0, record(1), log_tail=MAIN_SCRIPT_SYNTAX_ERROR, transient_exit_codes=frozenset({1})
            ),
            Reason.TRANSIENT,
        ),
        # 8. permanent: usage error, or code that cannot even be imported
        (ExitObservation(0, record(2)), Reason.PERMANENT_ERROR),
        (ExitObservation(0, record(1), log_tail=MAIN_SCRIPT_SYNTAX_ERROR), Reason.PERMANENT_ERROR),
        # 9. anything else non-zero is the user's
        (ExitObservation(0, record(1)), Reason.USER_ERROR),
        (ExitObservation(0, record(1), log_tail=VALUE_ERROR_TAIL), Reason.USER_ERROR),
        (ExitObservation(0, record(1), log_tail=CHAINED_TAIL), Reason.USER_ERROR),
        (ExitObservation(0, record(3)), Reason.USER_ERROR),
        (ExitObservation(0, record(128)), Reason.USER_ERROR),
        (ExitObservation(0, record(170)), Reason.USER_ERROR),  # 128+42 names no signal
        (ExitObservation(0, record(255)), Reason.USER_ERROR),
        (ExitObservation(0, record(75), transient_exit_codes=frozenset({76})), Reason.USER_ERROR),
    ],
)
def test_rules_in_order(observation: ExitObservation, reason: Reason) -> None:
    assert classify_exit(observation).reason is reason


@pytest.mark.parametrize(
    "exception",
    [
        "SyntaxError: invalid syntax",
        "IndentationError: unexpected indent",
        "TabError: inconsistent use of tabs and spaces in indentation",
        "ModuleNotFoundError: No module named 'torch'",
        "ImportError: cannot import name 'x' from 'y'",
    ],
)
def test_import_and_syntax_errors_are_permanent(exception: str) -> None:
    tail = f'Traceback (most recent call last):\n  File "t.py", line 1, in <module>\n{exception}\n'
    verdict = classify(record(1), log_tail=tail)
    assert verdict.reason is Reason.PERMANENT_ERROR
    assert verdict.termination_reason == exception


def test_only_the_last_exception_decides() -> None:
    assert classify(record(1), log_tail=CHAINED_TAIL).reason is Reason.USER_ERROR
    fixed = VALUE_ERROR_TAIL.replace("ValueError: bad shape", "ModuleNotFoundError: No module")
    assert classify(record(1), log_tail=CHAINED_TAIL + fixed).reason is Reason.PERMANENT_ERROR


@pytest.mark.parametrize(
    ("tail", "reason"),
    [
        (VALUE_ERROR_TAIL, "ValueError: bad shape"),
        (CHAINED_TAIL, "KeyError: 'cpu'"),
        (MAIN_SCRIPT_SYNTAX_ERROR, "SyntaxError: '(' was never closed"),
        (
            'Traceback (most recent call last):\n  File "m.py", line 1, in <module>\n'
            "    import bad\n" + MAIN_SCRIPT_SYNTAX_ERROR,
            "SyntaxError: '(' was never closed",
        ),
        (
            "[rank0]: Traceback (most recent call last):\n"
            '[rank0]:   File "t.py", line 4, in <module>\n'
            "[rank0]:     step()\n"
            "[rank0]: RuntimeError: NCCL error\n",
            "RuntimeError: NCCL error",
        ),
        (
            'Traceback (most recent call last):\n  File "t.py", line 4, in <module>\n'
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n"
            "more output after the traceback\n",
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
        ),
        (
            'Traceback (most recent call last):\n  File "t.py", line 4, in <module>\n'
            "KeyboardInterrupt\n",
            "KeyboardInterrupt",
        ),
        ("boom\n", None),  # raise SystemExit("boom") prints only the message
        ("", None),
        ("epoch 1\nepoch 2\n", None),
        (FAULTHANDLER_DUMP, None),
        ('Traceback (most recent call last):\n  File "t.py", line 4, in <module>\n', None),
        # A traceback longer than the tail: its header is gone, its exception is not.
        (URL_ERROR_TAIL, "urllib.error.URLError: <urlopen error [Errno -3] Temporary failure "
                         "in name resolution>"),
        ('  File "t.py", line 4, in <module>\n    x()\nnot an exception line here\n', None),
    ],
)
def test_termination_reason(tail: str, reason: str | None) -> None:
    assert termination_reason(tail) == reason


@pytest.mark.parametrize(
    ("observation", "message"),
    [
        (
            ExitObservation(
                1,
                record(1),
                log_tail="\n".join(f"line {i}" for i in range(14))
                + "\n"
                + VALUE_ERROR_TAIL.split("\n", 1)[1],
            ),
            "The replica worker-1 (rank 1) exited with a non-zero status of 1. "
            "Termination reason: ValueError: bad shape (see the last 20 log lines)",
        ),
        (
            ExitObservation(0, record(-11)),
            "The replica worker-0 (rank 0) exited with a non-zero status of 139 (SIGSEGV)",
        ),
        (
            ExitObservation(0, record(137)),
            "The replica worker-0 (rank 0) exited with a non-zero status of 137 (SIGKILL)",
        ),
        (
            ExitObservation(3, record(-6), log_tail="Fatal Python error: Aborted\n\n"),
            "The replica worker-3 (rank 3) exited with a non-zero status of 134 (SIGABRT) "
            "(see the last 2 log lines)",
        ),
        (
            ExitObservation(2, record(1), log_tail="loading\nboom\n"),
            "The replica worker-2 (rank 2) exited with a non-zero status of 1 "
            "(see the last 2 log lines)",
        ),
        (
            ExitObservation(2, record(1), log_tail="boom"),
            "The replica worker-2 (rank 2) exited with a non-zero status of 1 "
            "(see the last 1 log line)",
        ),
        (
            ExitObservation(0, record(4)),
            "The replica worker-0 (rank 0) exited with a non-zero status of 4",
        ),
        (
            ExitObservation(0, record(4), log_tail="  \n"),
            "The replica worker-0 (rank 0) exited with a non-zero status of 4",
        ),
        (ExitObservation(0, record(0)), "The replica worker-0 (rank 0) exited with status 0"),
        (
            ExitObservation(0, record(-15, signals_sent=["SIGTERM"]), stop_requested=True),
            "The replica worker-0 (rank 0) was stopped by muster (SIGTERM)",
        ),
        (
            ExitObservation(
                0, record(-9, signals_sent=["SIGTERM", "SIGKILL"]), stop_requested=True
            ),
            "The replica worker-0 (rank 0) was stopped by muster (SIGKILL)",
        ),
        (
            ExitObservation(0, record(0, signals_sent=["SIGTERM"], stop_requested=True)),
            "The replica worker-0 (rank 0) was stopped by muster (SIGTERM)",
        ),
        (
            ExitObservation(0, record(0), stop_requested=True),
            "The replica worker-0 (rank 0) was stopped by muster",
        ),
        (
            ExitObservation(0, None, launch_error="No space left on device"),
            "muster could not launch the replica worker-0 (rank 0): No space left on device",
        ),
        (
            ExitObservation(5, None, lost=True),
            "The replica worker-5 (rank 5) was lost: there is no exit record and its shim and "
            "process are gone (e.g. the machine restarted or the shim was killed)",
        ),
        (
            ExitObservation(0, spawn_failure(errno.ENOENT)),
            "The replica worker-0 (rank 0) could not start: [Errno 2] ENOENT: 'train.py'",
        ),
        (
            ExitObservation(1, record(-9, **OVER_LIMIT), log_tail="step 1\n"),
            "The replica worker-1 (rank 1) ran out of memory and exited with a non-zero status "
            "of 137: killed by the kernel's OOM killer at its memory_limit of 4 GiB (peak "
            "4.2 GiB): raise resources.memory_limit or use less memory",
        ),
        (
            ExitObservation(0, record(-9, oom=OomKill(OomSource.WATCHDOG, 150 << 20),
                                      memory_limit_bytes=150 << 20, peak_memory_bytes=None)),
            "The replica worker-0 (rank 0) ran out of memory and exited with a non-zero status "
            "of 137: killed by muster's memory watchdog at its memory_limit of 150 MiB: raise "
            "resources.memory_limit or use less memory",
        ),
        (
            ExitObservation(0, record(-9, **KERNEL_OOM)),
            "The replica worker-0 (rank 0) ran out of memory and exited with a non-zero status "
            "of 137: killed by the kernel's OOM killer at 21.3 GiB (machine 24 GiB, no "
            "memory_limit set): set resources.memory_limit or use less memory",
        ),
        (
            ExitObservation(0, record(-9, **KMSG_OOM)),
            "The replica worker-0 (rank 0) ran out of memory and exited with a non-zero status "
            "of 137: killed by the kernel's OOM killer at 21.3 GiB (machine 24 GiB, no "
            "memory_limit set): set resources.memory_limit or use less memory",
        ),
        (
            ExitObservation(0, record(-9, oom=OomKill(OomSource.KMSG, None, None))),
            "The replica worker-0 (rank 0) ran out of memory and exited with a non-zero status "
            "of 137: killed by the kernel's OOM killer (no memory_limit set): set "
            "resources.memory_limit or use less memory",
        ),
        (
            # The machine ran out before the replica reached its limit (the watchdog's).
            ExitObservation(0, record(-9, oom=OomKill(OomSource.KMSG, 30 * GiB, 24 * GiB),
                                      memory_limit_bytes=30 * GiB, peak_rss_bytes=20 * GiB)),
            "The replica worker-0 (rank 0) ran out of memory and exited with a non-zero status "
            "of 137: killed by the kernel's OOM killer at 20 GiB (machine 24 GiB, below its "
            "memory_limit of 30 GiB): the machine ran out of memory first; use less memory",
        ),
        (
            ExitObservation(0, record(1), log_tail=MEMORY_ERROR_TAIL),
            "The replica worker-0 (rank 0) ran out of memory and exited with a non-zero status "
            "of 1. Termination reason: MemoryError (see the last 4 log lines)",
        ),
        (
            ExitObservation(1, record(1), log_tail=CUDA_OOM_TAIL),
            "The replica worker-1 (rank 1) ran out of memory and exited with a non-zero status "
            "of 1. Termination reason: torch.OutOfMemoryError: CUDA out of memory. Tried to "
            "allocate 2.00 GiB. GPU 0 has a total capacity of 79.10 GiB of which 1.02 GiB is "
            "free. (see the last 4 log lines)",
        ),
    ],
)
def test_messages(observation: ExitObservation, message: str) -> None:
    assert classify_exit(observation).message == message


@pytest.mark.parametrize(
    ("exit", "code", "sig"),
    [
        (record(-9), 137, "SIGKILL"),
        (record(137), 137, "SIGKILL"),
        (record(-11), 139, "SIGSEGV"),
        (record(1), 1, None),
        (record(0), 0, None),
        (record(170), 170, None),
        (record(returncode=None, exit_code=139), 139, "SIGSEGV"),
        (record(returncode=-9, exit_code=None, sig=None), 137, "SIGKILL"),
        (record(returncode=-9, exit_code=137, sig="SIGKILL"), 137, "SIGKILL"),
    ],
)
def test_exit_code_is_shell_style_and_signal_is_named(
    exit: ExitRecord, code: int, sig: str | None
) -> None:
    verdict = classify(exit, stop_requested=False)
    assert (verdict.exit_code, verdict.signal) == (code, sig)


def test_full_classification_of_a_user_error() -> None:
    assert classify(record(1), rank=1, log_tail=VALUE_ERROR_TAIL) == Classification(
        reason=Reason.USER_ERROR,
        message="The replica worker-1 (rank 1) exited with a non-zero status of 1. "
        "Termination reason: ValueError: bad shape (see the last 7 log lines)",
        exit_code=1,
        signal=None,
        termination_reason="ValueError: bad shape",
    )


def test_launch_and_spawn_failures_carry_no_exit_status() -> None:
    for verdict in (
        classify(None, launch_error="boom"),
        classify(None, lost=True),
        classify(spawn_failure(errno.ENOENT)),
    ):
        assert (verdict.exit_code, verdict.signal, verdict.termination_reason) == (None, None, None)


def test_records_without_a_status_are_internal_not_a_crash() -> None:
    assert classify(None).reason is Reason.INTERNAL
    assert classify(record(returncode=None, exit_code=None)).reason is Reason.INTERNAL


_RECORDS = st.builds(
    ExitRecord,
    returncode=st.none() | st.integers(-200, 300),
    exit_code=st.none() | st.integers(-5, 300),
    signal=st.none() | st.sampled_from(["SIGKILL", "SIGTERM", "SIGSEGV", "SIGWHAT"]),
    pid=st.none() | st.integers(1, 2**22),
    start_ticks=st.none() | st.integers(0, 2**40),
    started_at=st.none() | st.floats(allow_nan=False),
    ended_at=st.floats(allow_nan=False),
    max_rss_bytes=st.none() | st.integers(0, 2**40),
    stop_requested=st.booleans(),
    signals_sent=st.lists(st.sampled_from(["SIGTERM", "SIGKILL"]), max_size=2),
    spawn_error=st.none() | st.text(max_size=30),
    spawn_errno=st.none() | st.integers(0, 200),
    oom=st.none() | st.builds(OomKill, st.sampled_from(OomSource),
                              st.none() | st.integers(1, 2**44),
                              st.none() | st.integers(1, 2**44)),
    peak_rss_bytes=st.none() | st.integers(0, 2**44),
    memory_limit_bytes=st.none() | st.integers(1, 2**44),
    peak_memory_bytes=st.none() | st.integers(0, 2**44),
)
_OBSERVATIONS = st.builds(
    ExitObservation,
    rank=st.integers(0, 1024),
    exit=st.none() | _RECORDS,
    lost=st.booleans(),
    launch_error=st.none() | st.text(max_size=30),
    log_tail=st.text(max_size=400)
    | st.sampled_from(
        [VALUE_ERROR_TAIL, CHAINED_TAIL, MAIN_SCRIPT_SYNTAX_ERROR, FAULTHANDLER_DUMP,
         MEMORY_ERROR_TAIL, CUDA_OOM_TAIL]
    ),
    transient_exit_codes=st.frozensets(st.integers(1, 255), max_size=4),
    stop_requested=st.booleans(),
)


@given(_OBSERVATIONS)
def test_never_raises_and_always_names_the_replica(obs: ExitObservation) -> None:
    verdict = classify_exit(obs)
    assert isinstance(verdict.reason, Reason)
    assert f"worker-{obs.rank} (rank {obs.rank})" in verdict.message


@given(_OBSERVATIONS)
def test_ok_only_for_a_clean_exit_zero(obs: ExitObservation) -> None:
    verdict = classify_exit(obs)
    if verdict.reason is Reason.OK:
        assert obs.exit is not None
        assert obs.launch_error is None and not obs.lost and not obs.stop_requested
        assert verdict.exit_code == 0 and verdict.signal is None


def test_a_stalled_replica_is_stalled_even_though_muster_stopped_it() -> None:
    stopped = record(returncode=-15, stop_requested=True, signals_sent=["SIGTERM"])
    verdict = classify(stopped, rank=1, stop_requested=True,
                       stalled="no progress for 300s since step 120")
    assert verdict.reason is Reason.STALLED
    assert verdict.message.startswith(
        "The replica worker-1 (rank 1) made no progress: no progress for 300s since step 120; "
        "muster killed its process group"
    )
    assert verdict.signal == "SIGTERM"
