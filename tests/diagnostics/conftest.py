"""The diagnostics tests run real trials on the supervise tests' rig."""

from tests.supervise.conftest import home, sqlite_rig, sqlite_store  # noqa: F401 - the rig
