"""The CLI tests run against a real server, one per test module, like the server tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.server.conftest import RunningServer, client
from tests.server.experiments import serving

__all__ = ["client", "server"]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """One server for the module: each test makes and inspects its own experiments."""
    with serving(tmp_path_factory.mktemp("server") / "home") as running:
        yield running
