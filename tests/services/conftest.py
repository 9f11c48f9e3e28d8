"""The supervisor rig of tests/supervise (a real store and launcher), for the services
tests that watch real trials run (`test_progress`); a module's own `home` fixture wins."""

from tests.supervise.conftest import home, rig  # noqa: F401 - the rig and its home
