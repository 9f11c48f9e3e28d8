"""Determined AI configs brought along (issue 12, item 8): each foreign key gets a hint that
names muster's way, not a generic "unknown key"; what muster can take, it takes."""

from __future__ import annotations

import pytest

from muster.config import ExperimentConfig, load_config
from muster.errors import ConfigError

# Determined's examples/tutorials/mnist_pytorch/const.yaml and distributed.yaml, as written.
MNIST_CONST = """\
name: mnist_pytorch_const
data:
  url: https://s3-us-west-2.amazonaws.com/determined-ai-test-data/pytorch_mnist.tar.gz
hyperparameters:
  learning_rate: 1.0
  global_batch_size: 64
  n_filters1: 32
  n_filters2: 64
  dropout1: 0.25
  dropout2: 0.5
records_per_epoch: 50000
searcher:
  name: single
  metric: validation_loss
  max_length:
    batches: 937
  smaller_is_better: true
entrypoint: model_def:MNistTrial
"""
DISTRIBUTED = """\
resources:
  slots_per_trial: 8
environment:
  image: determinedai/environments:cuda-11.3-pytorch-1.12-gpu-0.19.4
  environment_variables:
    - NCCL_DEBUG=INFO
bind_mounts:
  - host_path: /data
    container_path: /data
max_restarts: 0
"""


def problems(text: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_config(text, source="const.yaml")
    return str(info.value).splitlines()[1:]


def test_every_foreign_key_gets_its_hint() -> None:
    found = {line.split(":", 1)[0]: line.split(": ", 1)[1]
             for line in problems(MNIST_CONST + DISTRIBUTED)}
    assert found["entrypoint"].startswith("'model_def:MNistTrial' names a Determined Trial "
                                          "class, and Trial classes are not supported; run a "
                                          "script")
    assert found["resources.slots_per_trial"].endswith(
        "use resources.replicas (processes, one per GPU as Determined starts them) and "
        "resources.gpus_per_replica")
    assert "not in a container" in found["environment.image"]
    assert "environment.variables" in found["environment.environment_variables"]
    assert "muster runs on the host" in found["bind_mounts"]
    assert "failure_policy.trial_retries" in found["max_restarts"]
    assert "verify.expected_samples" in found["records_per_epoch"]
    assert "go under hyperparameters" in found["data.url"]
    assert all(hint.startswith("not a muster key (Determined has it): ") for key, hint in
               found.items() if key not in ("entrypoint", "data.path"))
    assert "searcher.max_length" not in found  # {batches: 937} is taken as it is


@pytest.mark.parametrize("unit", ["batches", "epochs", "records"])
def test_max_length_with_a_unit_is_kept(unit: str) -> None:
    config = load_config("name: x\nentrypoint: python t.py\nhyperparameters: {lr: {type: "
                         "double, minval: 0.1, maxval: 1}}\nsearcher: {name: asha, metric: l, "
                         f"max_trials: 4, max_length: {{{unit}: 900}}}}\n")
    assert (config.searcher.max_length, config.searcher.max_length_unit) == (900, unit)
    assert ExperimentConfig.from_json_dict(config.to_json_dict()) == config  # stored as is


@pytest.mark.parametrize(("length", "problem"), [
    ("{minutes: 5}", "searcher.max_length: must be a number of steps, or one unit and its "
                     "count: {batches: N}, {epochs: N} or {records: N}"),
    ("{batches: 5, epochs: 1}", "searcher.max_length: must be a number of steps, or one unit"),
    ("{batches: 0}", "searcher.max_length: must be >= 1, got 0"),
])
def test_a_length_muster_cannot_read_is_named(length: str, problem: str) -> None:
    found = problems(f"name: x\nentrypoint: t\nsearcher: {{max_length: {length}}}\n")
    assert any(line.startswith(problem) for line in found), found
