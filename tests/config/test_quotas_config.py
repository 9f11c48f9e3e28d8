"""The cluster config's `quotas`: what it reads, and the clear error of each mistake, with
its key path (a user's or group's entry is a section of its own)."""

from __future__ import annotations

from pathlib import Path

import pytest

from muster.config import load_cluster_config
from muster.errors import ConfigError
from muster.states import QuotaLimit


def load(tmp_path: Path, text: str) -> object:
    path = tmp_path / "cluster.yaml"
    path.write_text(text)
    return load_cluster_config(path, tmp_path / "absent.yaml")


def test_quotas_are_read_with_the_limits_each_entry_names(tmp_path: Path) -> None:
    config = load_cluster_config(None, tmp_path / "absent.yaml")
    assert config.quotas.empty
    path = tmp_path / "cluster.yaml"
    path.write_text("quotas:\n  default: {max_gpus: 2}\n  users:\n"
                    "    alice: {max_gpus: 8, max_queued_trials: 0}\n    lead: {max_gpus: null}\n"
                    "  groups: {vision: {max_running_trials: 4}}\n")
    quotas = load_cluster_config(path, tmp_path / "absent.yaml").quotas
    assert not quotas.empty
    assert quotas.users["alice"].declared() == {QuotaLimit.MAX_GPUS: 8,
                                                QuotaLimit.MAX_QUEUED_TRIALS: 0}
    assert quotas.users["lead"].declared() == {QuotaLimit.MAX_GPUS: None}  # "no limit"
    assert quotas.groups["vision"].declared() == {QuotaLimit.MAX_RUNNING_TRIALS: 4}


@pytest.mark.parametrize(("text", "problem"), [
    ("quotas: {users: {alice: {max_gpu: 8}}}",
     "quotas.users.alice.max_gpu: unknown key; did you mean 'max_gpus'?"),
    ("quotas: {groups: {vision: {gpus: 8}}}",
     "quotas.groups.vision.gpus: unknown key; did you mean 'max_gpus'?"),
    ("quotas: {default: {max_slot: 1}}",
     "quotas.default.max_slot: unknown key; did you mean 'max_slots'?"),
    ("quotas: {user: {}}", "quotas.user: unknown key; did you mean 'users'?"),
    ("quotas: {users: {Alice: {max_gpus: 1}}}",
     "quotas.users.Alice: 'Alice' is not a user's or group's name: a lowercase letter or '_' "
     "first, then a-z, 0-9, '_', '.', '-', at most 32 characters"),
    ("quotas: {users: {alice: {max_gpus: -1}}}",
     "quotas.users.alice.max_gpus: must be >= 0, got -1"),
    ("quotas: {users: {alice: {max_gpus: '8'}}}",
     "quotas.users.alice.max_gpus: must be a whole number, got '8', which is quoted: remove "
     "the quotes"),
    ("quotas: {users: {alice: 8}}",
     "quotas.users.alice: must be a mapping (key: value pairs), got 8"),
])
def test_each_mistake_names_its_key_path(tmp_path: Path, text: str, problem: str) -> None:
    with pytest.raises(ConfigError) as raised:
        load(tmp_path, text + "\n")
    assert str(raised.value).splitlines()[1:] == [problem]
