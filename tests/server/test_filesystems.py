"""`muster.services.cluster.filesystems`: each file system of muster's directories once."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from muster.services.cluster import filesystems


def test_paths_on_one_file_system_are_shown_once(tmp_path: Path) -> None:
    (tmp_path / "runs").mkdir()
    found = filesystems([tmp_path, tmp_path / "runs", tmp_path / "not-made-yet"])
    assert len(found) == 1
    assert found[0].paths == (tmp_path, tmp_path / "runs", tmp_path / "not-made-yet")
    assert found[0].path == tmp_path
    assert 0 < found[0].free_bytes <= found[0].total_bytes
    assert found[0].total_bytes == shutil.disk_usage(tmp_path).total


def test_each_file_system_is_listed_in_the_order_of_its_first_path(tmp_path: Path) -> None:
    other = Path("/dev/shm")
    if not other.is_dir() or os.stat(other).st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("needs /dev/shm on a file system of its own")
    found = filesystems([tmp_path, other, tmp_path / "runs"])
    assert [fs.paths for fs in found] == [(tmp_path, tmp_path / "runs"), (other,)]
