"""The client packs only what the server takes, so a context it would refuse is refused
before it is uploaded."""

from __future__ import annotations

from pathlib import Path

import pytest

from muster.client import MAX_CONTEXT_BYTES, MAX_CONTEXT_MEMBERS, pack_context
from muster.errors import InvalidRequest
from muster.services import uploads


def test_the_limits_are_the_server_s() -> None:
    assert (MAX_CONTEXT_MEMBERS, MAX_CONTEXT_BYTES) == (uploads.MAX_MEMBERS,
                                                        uploads.MAX_UPLOAD_BYTES)


def test_a_link_to_a_directory_is_named_before_upload(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    (tmp_path / "ctx").mkdir()
    (tmp_path / "ctx" / "train.py").write_text("")
    (tmp_path / "ctx" / "data").symlink_to(tmp_path / "data")
    with pytest.raises(InvalidRequest, match=r"'data' is a link to a directory, and the server "
                                             r"copies files, not links"):
        pack_context(tmp_path / "ctx")


def test_too_many_files_are_named_before_upload(tmp_path: Path) -> None:
    for i in range(MAX_CONTEXT_MEMBERS):
        (tmp_path / f"f{i}").touch()
    with pytest.raises(InvalidRequest, match="holds more than 10,000 files"):
        pack_context(tmp_path)  # the directory itself is a member too
