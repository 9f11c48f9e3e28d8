"""The allow-lists' rules on real paths (`muster.services.allowances`): what counts as under
a root, which sources a pattern lets through, who may write an interpreter. The server test
(tests/server/test_allowances.py) holds the submissions to them."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from muster import job_secrets
from muster.config import load_config
from muster.containment import inside
from muster.errors import ConfigError
from muster.home import Home
from muster.services.access import Principal
from muster.services.allowances import Allowances, allowance_problems
from muster.states import Role

USER = Principal(user_id=2, name="alice", role=Role.USER)
ADMIN = Principal(user_id=1, name="admin", role=Role.ADMIN)


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    (tmp_path / "data" / "set").mkdir(parents=True)
    (tmp_path / "data2").mkdir()
    (tmp_path / "shared").mkdir()
    (tmp_path / "shared" / "key").write_text("k")
    (tmp_path / "shared" / "out").symlink_to(tmp_path / "data2")
    (tmp_path / "data" / "escape").symlink_to("/etc")
    return tmp_path


@pytest.mark.parametrize(("relative", "expected"), [
    ("data", True),
    ("data/set", True),
    ("data/", True),
    ("data2", False),  # a sibling with the root's name as its prefix
    ("data/../data2", False),  # normalised first
    ("data/escape", False),  # a link inside a root that leads out of it
    ("data/escape/..", False),  # normalised it is `data`, but the kernel reads `/`
])
def test_inside_judges_the_written_path_and_where_it_leads(
        tree: Path, relative: str, expected: bool) -> None:
    assert inside(f"{tree}/{relative}", [str(tree / "data")]) is expected


def test_the_root_directory_allows_everything(tree: Path) -> None:
    assert inside(str(tree / "data2"), ["/"])


def _config(tree: Path, **extra: object) -> str:
    del tree
    return json.dumps({"name": "t", "entrypoint": ["python", "x.py"], **extra})


@pytest.mark.parametrize(("source", "allowed"), [
    ("file:{tree}/shared/key", True),
    ("file:{tree}/shared/../data2/x", False),
    ("file:{tree}/shared/out/x", False),  # a link out of the shared directory
    ("env:ALLOWED", True),
    ("env:ALLOWED_NOT", False),
    ("env:MUSTER_HOME", False),
])
def test_secret_sources_match_patterns_and_names(tree: Path, source: str,
                                                 allowed: bool) -> None:
    config = load_config(_config(tree, environment={"secrets": {
        "X": source.format(tree=tree)}}))
    rules = Allowances(secret_sources=(f"file:{tree}/shared/*", "env:ALLOWED"))
    problems = allowance_problems(config, USER, rules, tree / "home")
    assert (problems == []) is allowed, problems
    assert allowance_problems(config, ADMIN, Allowances(), tree / "home") == []


def test_the_home_is_refused_to_admins_too(tree: Path) -> None:
    home = tree / "home"
    (home / "secrets").mkdir(parents=True)
    config = load_config(_config(tree, environment={"secrets": {
        "X": f"file:{home}/secrets/token"}}, data={"path": str(home)}))
    rules = Allowances(secret_sources=(f"file:{home}/*",), data_roots=(str(tree),))
    for who in (USER, ADMIN):
        problems = allowance_problems(config, who, rules, home)
        assert [p.split(":")[0] for p in problems] == ["environment.secrets.X", "data.path"]


def test_an_interpreter_must_be_writable_by_trusted_owners_only(tree: Path) -> None:
    python = tree / "bin" / "python"
    python.parent.mkdir()
    python.write_text("#!/bin/sh\n")
    python.chmod(0o755)
    config = load_config(_config(tree, environment={"python": str(python)}))
    rules = Allowances(interpreters=(str(python),))
    assert allowance_problems(config, USER, rules, tree / "home") == []
    python.parent.chmod(0o777)
    problems = allowance_problems(config, USER, rules, tree / "home")
    assert problems and f"{python.parent} is writable by its group or by everyone" in problems[0]
    python.parent.chmod(0o1777)  # sticky, as /tmp: others cannot replace root's entries
    assert allowance_problems(config, USER, rules, tree / "home") == []
    python.parent.chmod(0o755)
    python.chmod(0o775)
    assert "writable by its group" in allowance_problems(config, USER, rules, tree / "home")[0]
    if os.geteuid() == 0:
        python.chmod(0o755)
        os.chown(python, 65534, 65534)
        problems = allowance_problems(config, USER, rules, tree / "home")
        assert "belongs to uid 65534" in problems[0], problems


def test_a_launch_never_reads_the_home_whatever_the_stored_config_says(tree: Path) -> None:
    """A config stored before the allow-lists (or by an admin) that names a file in the home
    is refused again at every read, so no launch hands a job the server's token."""
    home = Home((tree / "home").resolve()).ensure()
    home.token_path.write_text("mst_the-admin-token\n")
    config = load_config(_config(tree, environment={"secrets": {
        "X": f"file:{home.token_path}"}}))
    with pytest.raises(ConfigError, match=r"secret X: .* is in the server's home"):
        job_secrets.resolve(config, home, "some-uuid")
    assert job_secrets.masked_values(config.environment.secrets, home, "some-uuid") == []
