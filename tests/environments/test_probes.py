"""Asking an interpreter what it is (`muster.environments.interpreters`): the program named
runs with a minimal environment, and as root only when no other account could have
written it. Real scripts standing in for `environment.python`; no server."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from muster.environments.interpreters import InterpreterError, inspect

CANARY = "MUSTER_CANARY"


def fake_python(where: Path, record: Path) -> Path:
    """A `python` that writes its environment and uid to `record`, then is the real one."""
    where.mkdir(parents=True, exist_ok=True)
    script = where / "python"
    script.write_text(f"#!/bin/sh\n{{ id -u; env; }} > {record}\n"
                      f"exec {os.path.realpath(sys.executable)} \"$@\"\n")
    script.chmod(0o755)
    return script


def test_a_probe_sees_none_of_the_server_s_environment(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CANARY, "server-only")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "server-only")
    record = tmp_path / "record"
    found = inspect(str(fake_python(tmp_path / "bin", record)))
    assert found.version_info >= (3, 10)
    seen = dict(line.split("=", 1) for line in record.read_text().splitlines()[1:]
                if "=" in line)
    assert CANARY not in seen and "AWS_SECRET_ACCESS_KEY" not in seen
    assert set(seen) <= {"PATH", "LANG", "HOME", "USER", "LOGNAME", "PWD", "SHLVL", "_"}, seen
    assert seen["PATH"] == "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@pytest.mark.skipif(os.geteuid() != 0, reason="the rule is root's")
def test_root_runs_no_interpreter_another_account_could_have_written(tmp_path: Path) -> None:
    record = tmp_path / "record"
    open_dir = tmp_path / "open"
    script = fake_python(open_dir, record)
    open_dir.chmod(0o777)  # anyone could have replaced the script
    with pytest.raises(InterpreterError, match=r"is not run as root: .*open is not root's"):
        inspect(str(script))
    open_dir.chmod(0o755)
    os.chown(script, 54321, 54321)  # another account's script
    with pytest.raises(InterpreterError, match="owner uid 54321"):
        inspect(str(script))
    assert not record.exists(), "it never ran"
    os.chown(script, 0, 0)
    assert inspect(str(script)).version_info >= (3, 10)
    assert record.read_text().split()[0] == "0"
