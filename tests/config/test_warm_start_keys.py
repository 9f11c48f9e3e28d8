"""The keys of a warm start (issue 35, deliverable 3): `searcher.source_trial_id` and
`searcher.source_checkpoint_uuid` (Determined's names, kept), `searcher.source_model`
(muster's: a registered version), and `searcher.source_checkpoint` (latest or best of
source_trial_id); at most one source. A Determined config that names one is translated to
the same key. What each resolves to is checked at submission
(tests/services/test_warm_starts.py)."""

from __future__ import annotations

import pytest

from muster.config import load_config
from muster.config.loading import read_experiment_config
from muster.config.schema import SearcherConfig
from muster.errors import ConfigError

BASE = "name: x\nentrypoint: python t.py\n"


@pytest.mark.parametrize(("searcher", "named"), [
    ("{source_trial_id: 12}", ("source_trial_id", "12")),
    ("{source_trial_id: 12, source_checkpoint: best}", ("source_trial_id", "12")),
    ("{source_checkpoint_uuid: 9b2c7e1a-3f4d-4e5f-8a9b-0c1d2e3f4a5b}",
     ("source_checkpoint_uuid", "9b2c7e1a-3f4d-4e5f-8a9b-0c1d2e3f4a5b")),
    ("{source_model: digits@production}", ("source_model", "digits@production")),
    ("{name: single}", None),
])
def test_each_source_key_names_the_warm_start(searcher: str, named: tuple[str, str] | None
                                              ) -> None:
    config = load_config(f"{BASE}searcher: {searcher}\n")
    assert config.searcher.warm_start() == named
    # A stored config reads back as it was accepted.
    assert SearcherConfig.model_validate(config.searcher.model_dump()) == config.searcher


@pytest.mark.parametrize(("searcher", "problem"), [
    ("{source_trial_id: 12, source_model: m@1}",
     "searcher.source_model: source_trial_id and source_model each name the checkpoint the "
     "trials start from; keep one"),
    ("{source_checkpoint: best}",
     "searcher.source_checkpoint: chooses source_trial_id's checkpoint (latest or best): set "
     "source_trial_id, or remove it"),
    ("{source_trial_id: 12, source_checkpoint: 9b2c7e1a}",
     "searcher.source_checkpoint: chooses source_trial_id's checkpoint: latest or best, not "
     "'9b2c7e1a' (a checkpoint named by its uuid is source_checkpoint_uuid)"),
    ("{source_trial_id: 0}", "searcher.source_trial_id: must be >= 1, got 0"),
    ("{source_model: ''}", "searcher.source_model:"),
])
def test_a_source_that_cannot_be_one_is_refused_with_its_key(searcher: str,
                                                             problem: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(f"{BASE}searcher: {searcher}\n", source="exp.yaml")
    assert any(line.startswith(problem) for line in str(info.value).splitlines()), info.value


def test_a_determined_config_with_a_warm_start_translates_to_the_same_keys() -> None:
    loaded = read_experiment_config(
        "name: fine-tune\nentrypoint: python3 train.py\nmax_restarts: 0\n"
        "searcher: {name: single, metric: loss, max_length: {batches: 10}, "
        "source_trial_id: 12}\n", slots="cpu")
    assert loaded.translation is not None
    assert "searcher.source_trial_id: 12 → the same" in loaded.translation.mapped
    assert not any("source_" in line for line in loaded.translation.ignored)
    assert loaded.config.searcher.warm_start() == ("source_trial_id", "12")

    by_uuid = read_experiment_config(
        "name: fine-tune\nentrypoint: python3 train.py\nmax_restarts: 0\n"
        "searcher: {name: single, metric: loss, max_length: {batches: 10}, "
        "source_checkpoint_uuid: 9b2c7e1a-3f4d-4e5f-8a9b-0c1d2e3f4a5b}\n", slots="cpu")
    assert by_uuid.translation is not None
    assert ("searcher.source_checkpoint_uuid: 9b2c7e1a-3f4d-4e5f-8a9b-0c1d2e3f4a5b → the "
            "same") in by_uuid.translation.mapped
    assert by_uuid.config.searcher.source_checkpoint_uuid == (
        "9b2c7e1a-3f4d-4e5f-8a9b-0c1d2e3f4a5b")
