"""A checkpoint storage that cannot work is refused at submission (422), naming the key:
a key source the server cannot read, a shared_fs path it cannot write; and the experiment
config never holds a key itself."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from muster.errors import ConfigError
from muster.services.experiments import create_experiment
from tests.supervise.conftest import Rig


def _create(rig: Rig, storage: dict[str, Any]) -> int:
    config = {"name": "s", "entrypoint": [sys.executable, "-c", "pass"],
              "checkpoint_storage": storage}
    return create_experiment(rig.store, rig.home, rig.admin, yaml.safe_dump(config),
                             archive=None)


def test_a_key_the_server_cannot_read_is_refused(sqlite_rig: Rig,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NO_SUCH_S3_KEY", raising=False)
    with pytest.raises(ConfigError) as info:
        _create(sqlite_rig, {"type": "s3", "bucket": "ckpts", "access_key": "env:NO_SUCH_S3_KEY",
                             "secret_key": "file:/no/such/secret"})
    message = str(info.value)
    assert "checkpoint_storage.access_key: the server's environment has no NO_SUCH_S3_KEY" in (
        message)
    assert "checkpoint_storage.secret_key: the server cannot read /no/such/secret" in message


def test_a_literal_key_is_refused_before_it_is_stored(sqlite_rig: Rig) -> None:
    with pytest.raises(ConfigError) as info:
        _create(sqlite_rig, {"type": "s3", "bucket": "ckpts", "access_key": "AKIAEXAMPLE",
                             "secret_key": "wJalrXUtnFEMI"})
    assert "checkpoint_storage.access_key: write where the server reads it" in str(info.value)


def test_a_path_the_server_cannot_write_is_refused(sqlite_rig: Rig, tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    with pytest.raises(ConfigError) as info:
        _create(sqlite_rig, {"type": "shared_fs", "path": str(blocker / "checkpoints")})
    assert f"checkpoint_storage.path: the server cannot make {blocker / 'checkpoints'}" in str(
        info.value)
    _create(sqlite_rig, {"type": "shared_fs", "path": str(tmp_path / "fine")})
    assert (tmp_path / "fine").is_dir()
