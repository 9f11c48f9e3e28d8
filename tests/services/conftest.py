"""The supervisor rig of tests/supervise (a real store and launcher), for the services
tests that watch real trials run (`test_progress`); a module's own `home` fixture wins."""

from tests.supervise.conftest import (  # noqa: F401 - the rigs and their home
    home,
    rig,
    sqlite_rig,
    sqlite_store,
)
