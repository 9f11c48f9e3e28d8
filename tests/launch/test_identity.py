"""Process identity: (pid, start ticks) from /proc, never a bare pid."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from muster.launch.base import ProcessIdentity
from muster.launch.identity import (
    group_members,
    is_alive,
    own_identity,
    parse_stat,
    read_identity,
    read_stat,
    send_signal,
)
from tests.waiting import wait_until

pytestmark = pytest.mark.lifecycle  # starts real processes

SLEEPER = [sys.executable, "-c", "import time; time.sleep(600)"]


def _stat_line(pid: int, comm: str, state: str, pgid: int, session: int, start: int) -> str:
    fields = ["0"] * 50
    fields[0], fields[2], fields[3], fields[19] = state, str(pgid), str(session), str(start)
    return f"{pid} ({comm}) " + " ".join(fields) + "\n"


@pytest.mark.parametrize("comm", ["python", "my trainer", "a) S 1 2 (b", ")", "((x))"])
def test_parse_stat_takes_fields_after_the_last_paren(comm: str) -> None:
    stat = parse_stat(_stat_line(4242, comm, "S", 17, 9, 123456))
    assert (stat.pid, stat.state, stat.pgid, stat.session) == (4242, "S", 17, 9)
    assert stat.identity == ProcessIdentity(4242, 123456)


@pytest.mark.parametrize("line", ["", "4242 python S 1", "4242 (python) S 1 2 3"])
def test_parse_stat_rejects_malformed_lines(line: str) -> None:
    with pytest.raises(ValueError, match="stat line"):
        parse_stat(line)


def test_own_identity_is_alive() -> None:
    me = own_identity()
    assert me.pid == os.getpid()
    assert read_identity(os.getpid()) == me
    assert is_alive(me)


def test_a_pid_with_other_start_ticks_is_not_alive() -> None:
    me = own_identity()
    assert not is_alive(ProcessIdentity(me.pid, me.start_ticks + 1))
    assert not is_alive(ProcessIdentity(me.pid, me.start_ticks - 1))


def test_a_pid_nobody_holds_has_no_identity() -> None:
    unused = int(Path("/proc/sys/kernel/pid_max").read_text()) + 1
    assert read_identity(unused) is None
    assert not is_alive(ProcessIdentity(unused, 1))


def test_a_zombie_is_not_alive() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        identity = read_identity(proc.pid)
        assert identity is not None
        wait_until(lambda: _state(proc.pid) == "Z", timeout=30, what="the child to be a zombie")
        assert not is_alive(identity)
    finally:
        proc.wait()


def _state(pid: int) -> str | None:
    stat = read_stat(pid)
    return None if stat is None else stat.state


def test_send_signal_refuses_a_stale_identity() -> None:
    proc = subprocess.Popen(SLEEPER)
    try:
        identity = read_identity(proc.pid)
        assert identity is not None
        stale = ProcessIdentity(identity.pid, identity.start_ticks + 1)
        assert not send_signal(stale, signal.SIGKILL)
        assert is_alive(identity)
        assert send_signal(identity, signal.SIGKILL)
        assert proc.wait() == -signal.SIGKILL
        assert not send_signal(identity, signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()


def test_group_members_lists_the_live_members_of_a_group() -> None:
    leader = subprocess.Popen(SLEEPER, process_group=0)
    try:
        members = group_members(leader.pid)
        assert [m.pid for m in members] == [leader.pid]
        assert members[0].pgid == leader.pid
        assert members[0].session == os.getsid(0)
    finally:
        leader.kill()
        leader.wait()
    assert group_members(leader.pid) == []
