"""Keeping an experiment's git state on each backend: the one sent with the upload, or the
reused snapshot's (run again); a state that cannot be written undoes the submit, like any
other part of it."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import func, select

from muster import git_state
from muster.git_state import GitState
from muster.home import Home
from muster.services.experiments import create_experiment
from muster.services.snapshots import trial_snapshot
from muster.store import Experiment, Store, Trial
from tests.accounts import first_admin

CONFIG = "name: kept\nentrypoint: [python, -c, pass]\n"
STATE = GitState("0b08e936278e6039f9b43ff269aec124775d6e22", "main", True, "diff\n")


def created(store: Store, home: Home, context_from: int | None = None,
            git: GitState | None = None) -> tuple[int, str]:
    """A new experiment's id and uuid."""
    experiment_id = create_experiment(store, home, first_admin(store, home), CONFIG, None,
                                      context_from=context_from, git=git)
    with store.session_scope() as s:
        return experiment_id, s.get_one(Experiment, experiment_id).uuid


def code_git(store: Store, home: Home, experiment_id: int) -> object:
    with store.session_scope() as s:
        trial_id = s.scalars(select(Trial.id).where(Trial.experiment_id == experiment_id)).one()
    return trial_snapshot(store, home, trial_id)["trial"]["code"]["git"]


@pytest.fixture
def home(tmp_path: Path) -> Home:
    return Home(tmp_path / "home").ensure()


def test_the_state_sent_is_kept_and_a_run_again_inherits_it(store: Store, home: Home) -> None:
    state = git_state.parse_field(STATE.field().encode())  # its diff's sha256 filled in
    first, _ = created(store, home, git=state)
    assert code_git(store, home, first) == state.snapshot()
    again, _ = created(store, home, context_from=first)
    assert code_git(store, home, again) == state.snapshot()
    plain, plain_uuid = created(store, home)
    assert code_git(store, home, plain) is None
    assert not home.context_git_file(plain_uuid).exists()
    bare_again, bare_uuid = created(store, home, context_from=plain)
    assert code_git(store, home, bare_again) is None
    assert not home.context_git_file(bare_uuid).exists()


def test_a_state_that_cannot_be_written_undoes_the_submit(
    store: Store, home: Home, monkeypatch: pytest.MonkeyPatch
) -> None:
    def full_disk(home: Home, experiment_uuid: str, state: GitState) -> None:
        raise OSError(28, "No space left on device")

    with store.session_scope() as s:
        before = s.scalar(select(func.count()).select_from(Experiment))
    monkeypatch.setattr(git_state, "save", full_disk)
    with pytest.raises(OSError, match="No space left"):
        created(store, home, git=STATE)
    with store.session_scope() as s:
        assert s.scalar(select(func.count()).select_from(Experiment)) == before
    assert list(home.experiments_dir.iterdir()) == []
