"""The CLI tests run against a real server, one per test module, like the server tests."""

from __future__ import annotations

from tests.server.conftest import client
from tests.servers import shared_server

__all__ = ["client", "server"]


server = shared_server()
