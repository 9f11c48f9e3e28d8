"""Determined AI configs brought along. A muster config with Determined's keys in it (issue
12, item 8): each foreign key gets a hint that names muster's way, not a generic "unknown
key". A Determined config as it is (issue 34, deliverable 6): recognised, translated with
one line per key (`muster.config.determined`), and validated as the muster config it makes;
the real ones are Determined's own examples, in tests/fixtures/determined_configs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from muster.config import ExperimentConfig, load_config, space
from muster.config.determined import DETERMINED_KEYS, Translation, detect
from muster.config.loading import LoadedConfig, read_experiment_config
from muster.config.schema import MAX_TRIALS
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
    # `harness` is muster's alone: a muster config, whatever Determined keys it holds
    found = {line.split(":", 1)[0]: line.split(": ", 1)[1]
             for line in problems("harness: true\n" + MNIST_CONST + DISTRIBUTED)}
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


# --- a Determined config, translated ------------------------------------------------------

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "determined_configs"
SLOTS_UNSET = "resources.slots_per_trial: not set"


def read(text: str) -> LoadedConfig:
    loaded = read_experiment_config(text, source="det.yaml")
    assert loaded.translation is not None, "read as muster's own config"
    assert loaded.config.compat == "determined"
    return loaded


def translation(text: str) -> Translation:
    loaded = read(text)
    assert loaded.translation is not None
    return loaded.translation


def line(text: str, key: str) -> str:
    """The one line the translation of `text` says of `key`, after `key: `."""
    found = [entry for entry in translation(text).lines if entry.startswith(f"{key}: ")]
    assert len(found) == 1, translation(text).lines
    return found[0].removeprefix(f"{key}: ")


def refused(text: str) -> list[str]:
    """The problems of a Determined config muster cannot run, one per line."""
    with pytest.raises(ConfigError) as info:
        read_experiment_config(text, source="det.yaml")
    header, *lines = str(info.value).splitlines()
    assert header == "det.yaml: invalid Determined experiment config:"
    return lines


def given_keys(data: dict[str, Any]) -> list[str]:
    """Every key a config gives, a section's keys by their path (what gets a line)."""
    keys = []
    for key, value in data.items():
        if key in DETERMINED_KEYS and key and isinstance(value, dict):
            keys += [f"{key}.{inner}" for inner in value]
        else:
            keys.append(key)
    return keys


# Determined's own examples, and muster's example of a Determined config
DETERMINED_CONFIGS = [*sorted(FIXTURES.glob("*.yaml")),
                      *sorted(path for path in (ROOT / "examples").rglob("*.yaml")
                              if "determined" in path.parent.name)]


@pytest.mark.parametrize("path", DETERMINED_CONFIGS, ids=lambda p: p.stem)
def test_each_of_determineds_examples_becomes_a_muster_config_with_a_line_per_key(
    path: Path,
) -> None:
    text = path.read_text()
    loaded = read(text)
    assert loaded.translation is not None
    said = [entry.split(": ", 1)[0] for entry in loaded.translation.lines
            if not entry.startswith(SLOTS_UNSET)]  # a line of its own, on Determined's default
    assert sorted(said) == sorted(given_keys(yaml.safe_load(text)))
    # what `muster config from-determined` prints is muster's own config, read as it is
    again = read_experiment_config(yaml.safe_dump(loaded.translation.config), "muster.yaml")
    assert again.translation is None and again.config == loaded.config


def test_const_yaml_runs_its_script_with_no_restart() -> None:
    config = read((FIXTURES / "core_api_mnist_const.yaml").read_text()).config
    assert config.entrypoint == ["python3", "model_def.py"]
    assert (config.searcher.name, config.searcher.metric) == ("single", "val_loss")
    assert (config.failure_policy.trial_retries, config.failure_policy.replica_restarts) == (0, 0)
    assert config.resources.gpus_per_replica == 0


def test_distributed_yaml_runs_a_replica_per_slot_without_the_launcher() -> None:
    text = (FIXTURES / "core_api_mnist_distributed.yaml").read_text()
    config = read(text).config
    assert config.entrypoint == ["python3", "model_def_distributed.py"]
    assert (config.resources.replicas, config.resources.gpus_per_replica) == (4, 1)
    assert config.resources.distributed_env == "always"
    # Determined's single searcher draws one point of the ranges: muster's random, once
    assert (config.searcher.name, config.searcher.max_trials) == ("random", 1)
    assert "records_per_epoch: ignored: " in "\n".join(translation(text).ignored)


# --- searchers ----------------------------------------------------------------------------

SPACE = """\
name: search
entrypoint: python3 train.py
max_restarts: 1
hyperparameters:
  lr: {type: log, base: 10, minval: -4, maxval: -1, count: 3}
  layers: {type: int, minval: 1, maxval: 2}
"""


@pytest.mark.parametrize(("searcher", "expected"), [
    ("{name: single, metric: loss}", ("random", 1, None, "steps", None)),  # ranges: one draw
    ("{name: grid, metric: loss}", ("grid", None, None, "steps", None)),
    ("{name: random, metric: loss, max_trials: 7}", ("random", 7, None, "steps", None)),
    ("{name: adaptive_asha, metric: loss, max_trials: 8, max_length: {batches: 900}}",
     ("adaptive_asha", 8, 900, "batches", None)),
    ("{name: adaptive_asha, metric: loss, max_trials: 8, max_length: 50}",
     ("adaptive_asha", 8, 50, "steps", None)),
    ("{name: adaptive_asha, metric: loss, max_trials: 8, max_time: 20, time_metric: epochs}",
     ("adaptive_asha", 8, 20, "steps", "epochs")),
    ("{name: adaptive_asha, metric: loss, max_trials: 8, max_time: 5, time_metric: my_step}",
     ("adaptive_asha", 8, 5, "steps", "my_step")),
    ("{name: async_halving, metric: loss, max_trials: 4, max_length: {epochs: 3}, "
     "num_rungs: 3}", ("asha", 4, 3, "epochs", None)),
])
def test_each_searcher(searcher: str, expected: tuple[object, ...]) -> None:
    got = read(SPACE + f"searcher: {searcher}\n").config.searcher
    assert (got.name, got.max_trials, got.max_length, got.max_length_unit,
            got.time_metric) == expected


def test_determineds_pbt_is_musters() -> None:
    """Determined's PBT (retired in its 0.38) keeps its keys (`muster.search.pbt`)."""
    text = SPACE + ("searcher: {name: pbt, metric: loss, population_size: 6, num_rounds: 4, "
                    "length_per_round: {batches: 100}, replace_function: "
                    "{truncate_fraction: 0.5}, explore_function: {resample_probability: 0.1, "
                    "perturb_factor: 0.3}}\n")
    config = read(text).config
    got = config.searcher
    assert (got.name, got.population_size, got.num_rounds, got.length_per_round,
            got.max_length_unit, config.trial_count()) == ("pbt", 6, 4, 100, "batches", 24)
    assert got.replace_function.truncate_fraction == 0.5
    assert (got.explore_function.resample_probability,
            got.explore_function.perturb_factor) == (0.1, 0.3)
    assert line(text, "searcher.name") == "pbt → the same"


def test_max_time_is_counted_in_the_time_metric_as_on_determined() -> None:
    text = SPACE + ("searcher: {name: adaptive_asha, metric: loss, max_trials: 8, max_time: 20, "
                    "time_metric: epochs}\n")
    assert line(text, "searcher.max_time") == ("20 → searcher.max_length: 20 (counted in "
                                               "time_metric's values, as Determined counts "
                                               "max_time)")
    assert line(text, "searcher.time_metric") == "epochs → the same"


@pytest.mark.parametrize(("searcher", "problem"), [
    ("{name: custom, metric: loss}", "searcher.name: 'custom' is one of Determined's retired "
                                     "searchers"),
    ("{name: adaptive_asha, metric: l, max_trials: 2, max_time: 9}",
     "searcher.max_time: goes with searcher.time_metric"),
    ("{name: adaptive_asha, metric: l, max_trials: 2, max_time: 9, time_metric: x, "
     "max_length: 9}", "searcher.max_time: and searcher.max_length both say"),
    ("{name: adaptive_asha, metric: l, max_trials: 2, max_length: 9, divisor: 2.5}",
     "searcher.divisor: muster's divisor is a whole number (>= 2), got 2.5"),
])
def test_a_searcher_muster_cannot_run_is_refused(searcher: str, problem: str) -> None:
    assert any(found.startswith(problem) for found in refused(SPACE + f"searcher: {searcher}\n"))


def test_determineds_searcher_numbers_are_read() -> None:
    text = SPACE + ("searcher: {name: adaptive_asha, metric: loss, max_trials: 8, max_length: 9, "
                    "divisor: 3.0, max_concurrent_trials: 0, mode: aggressive, max_rungs: 3, "
                    "bracket_rungs: [1, 2], stop_once: true}\n")
    got = read(text).config.searcher
    assert (got.divisor, got.max_concurrent_trials, got.mode, got.max_rungs) == (
        3, MAX_TRIALS, "aggressive", 3)
    assert line(text, "searcher.bracket_rungs").startswith("ignored: muster's adaptive_asha ")
    assert line(text, "searcher.stop_once").startswith("ignored: muster's asha stops a trial ")


# --- hyperparameters ----------------------------------------------------------------------

HPARAMS = """\
name: types
entrypoint: python3 train.py
max_restarts: 0
searcher: {name: random, metric: loss, max_trials: 2}
hyperparameters:
  global_batch_size: 64
  dropout: {type: const, val: 0.5}
  layers: {type: int, minval: 1, maxval: 4, count: 2}
  momentum: {type: double, minval: 0.1, maxval: 0.9}
  lr: {type: log, base: 2, minval: -10, maxval: -2}
  activation: {type: categorical, vals: [relu, tanh, null]}
  optimizer:
    name: adam
    beta1: {type: double, minval: 0.8, maxval: 0.99}
  weight_decay: 1e-5
"""


def test_each_hyperparameter_type_is_read_as_determined_reads_it() -> None:
    text = HPARAMS
    params = read(text).config.space().params
    assert params["global_batch_size"] == space.Const(64)
    assert params["dropout"] == space.Const(0.5)
    assert params["layers"] == space.Int(1, 4, 2)
    assert params["momentum"] == space.Double(0.1, 0.9)
    assert params["lr"] == space.Log(-10.0, -2.0, 2.0)
    assert params["activation"] == space.Categorical(("relu", "tanh", None))
    assert params["optimizer.beta1"] == space.Double(0.8, 0.99)
    assert params["weight_decay"] == space.Const(1.0e-5)  # YAML 1.2's number, as Determined
    assert "read as numbers, as Determined's YAML 1.2 reads them: weight_decay: 1e-5" in line(
        text, "hyperparameters")


def test_a_categorical_of_lists_is_refused_with_the_fix() -> None:
    found = refused(HPARAMS + "  sizes: {type: categorical, vals: [[1, 2], [3]]}\n")
    assert found[0].startswith("hyperparameters.sizes.vals[0]: muster's categorical values are "
                               "numbers, strings, true/false or null: list names instead")


# --- entrypoints --------------------------------------------------------------------------

BARE = "name: run\nmax_restarts: 0\n"


@pytest.mark.parametrize(("entrypoint", "argv", "replicas"), [
    ("python3 train.py --epochs 2", ["python3", "train.py", "--epochs", "2"], 1),
    ("[python3, train.py, --lr, '0.1']", ["python3", "train.py", "--lr", "0.1"], 1),
    ("python3 -m determined.launch.torch_distributed python3 train.py --x 1",
     ["python3", "train.py", "--x", "1"], 2),
    ("python3 -m determined.launch.torch_distributed -- python3 train.py",
     ["python3", "train.py"], 2),
    ("[python, -u, -m, determined.launch.deepspeed, python, ds.py]", ["python", "ds.py"], 2),
    ("cd src && python3 train.py > out.log", ["sh", "-c", "cd src && python3 train.py > out.log"],
     1),
])
def test_each_entrypoint_form(entrypoint: str, argv: list[str], replicas: int) -> None:
    config = read(BARE + f"entrypoint: {entrypoint}\nresources: {{slots_per_trial: 2}}\n").config
    assert config.entrypoint == argv
    assert config.resources.replicas == replicas
    assert config.resources.gpus_per_replica == (1 if replicas == 2 else 2)


def test_a_launcher_and_a_shell_say_what_changed() -> None:
    launched = line(BARE + "entrypoint: python3 -m determined.launch.torch_distributed -- "
                    "python3 t.py\nresources: {slots_per_trial: 3}\n", "entrypoint")
    assert launched.endswith("→ entrypoint: python3 t.py, resources.distributed_env: always (3 "
                             "replicas: muster starts the replicas with torchrun's variables "
                             "itself)")
    shell = line(BARE + "entrypoint: python3 t.py | tee log\n", "entrypoint")
    assert shell.endswith("(Determined runs a string with sh -c; muster runs no shell unless "
                          "asked)")


@pytest.mark.parametrize(("entrypoint", "problem"), [
    ("model_def:MNistTrial", "entrypoint: 'model_def:MNistTrial' is a Determined Trial class; "
                             "muster runs scripts, not Trial classes: train in a script with "
                             "Determined's Core API"),
    ("python3 -m determined.launch.torch_distributed --trial model_def:MNistTrial",
     "entrypoint: determined.launch.torch_distributed --trial runs a Trial class; muster runs "
     "scripts"),
    ("python3 -m determined.launch.horovod python3 train.py",
     "entrypoint: runs determined.launch.horovod, which muster does not stand in for"),
    ("python3 -m determined.launch.tensorflow python3 train.py",
     "entrypoint: runs determined.launch.tensorflow, which muster does not stand in for"),
    ("cd x && python3 -m determined.launch.torch_distributed python3 t.py",
     "entrypoint: a determined.launch line inside shell syntax: write it as one command"),
    ("python3 -m determined.launch.torch_distributed",
     "entrypoint: names no script for determined.launch.torch_distributed to run"),
    ("python3 -m determined.launch.torch_distributed --nproc_per_node 2 -- python3 t.py",
     "entrypoint: torch.distributed.run's options --nproc_per_node 2 say how many processes "
     "start and where, which muster decides"),
])
def test_an_entrypoint_muster_cannot_run_says_what_to_do(entrypoint: str, problem: str) -> None:
    assert refused(BARE + f"entrypoint: {entrypoint}\n")[0].startswith(problem)


# --- resources and environment variables --------------------------------------------------


def test_slots_without_a_launcher_are_one_process_with_every_gpu() -> None:
    text = BARE + "entrypoint: python3 t.py\nresources: {slots_per_trial: 4, max_slots: 8}\n"
    resources = read(text).config.resources
    assert (resources.replicas, resources.gpus_per_replica, resources.max_slots) == (1, 4, 2)
    assert line(text, "resources.max_slots") == (
        "8 → resources.max_slots: 2 (muster counts replicas at once, each 4 of Determined's "
        "slots)")
    assert "resources.max_slots: is 2, fewer than one trial's 4 slots" in refused(
        BARE + "entrypoint: python3 t.py\nresources: {slots_per_trial: 4, max_slots: 2}\n")[0]


VARIABLES = BARE + "entrypoint: python3 t.py\nenvironment:\n  environment_variables: "


@pytest.mark.parametrize(("written", "slots", "expected"), [
    ("[NCCL_DEBUG=INFO, 'A=x=y']", 0, {"NCCL_DEBUG": "INFO", "A": "x=y"}),
    ("{cpu: [OMP_NUM_THREADS=4], cuda: [NCCL_DEBUG=INFO]}", 0, {"OMP_NUM_THREADS": "4"}),
    ("{cpu: [OMP_NUM_THREADS=4], cuda: [NCCL_DEBUG=INFO], rocm: [X=1]}", 1,
     {"NCCL_DEBUG": "INFO"}),
])
def test_environment_variables_in_each_form(written: str, slots: int,
                                            expected: dict[str, str]) -> None:
    text = VARIABLES + f"{written}\nresources: {{slots_per_trial: {slots}}}\n"
    assert read(text).config.environment.variables == expected
    if "cuda" in written:
        kind, unused = ("cuda", "cpu, rocm") if slots else ("cpu", "cuda")
        assert line(text, "environment.environment_variables").endswith(
            f"(the {kind} list: the trial has {'GPUs' if slots else 'no GPU'}; {unused} not "
            "used)")


@pytest.mark.parametrize(("entrypoint", "replicas"), [
    ("python3 -m determined.launch.torch_distributed python3 t.py", 4),
    ("python3 t.py", 1),
])
def test_on_a_server_without_gpus_a_slot_is_a_process(entrypoint: str, replicas: int) -> None:
    text = BARE + f"entrypoint: {entrypoint}\nresources: {{slots_per_trial: 4}}\n"

    loaded = read_experiment_config(text, "det.yaml", slots="cpu")

    resources = loaded.config.resources
    assert (resources.replicas, resources.gpus_per_replica) == (replicas, 0)
    assert loaded.translation is not None
    slots = next(line for line in loaded.translation.mapped
                 if line.startswith("resources.slots_per_trial: 4 → "))
    assert slots.endswith("Determined's slots are processes here, like its CPU slots: this "
                          "server schedules no GPUs)")
    assert not [line for line in loaded.translation.mapped if line.startswith(SLOTS_UNSET)]


def test_an_environment_variable_without_a_value_is_refused() -> None:
    assert refused(VARIABLES + "[NCCL_DEBUG]\n") == [
        "environment.environment_variables[0]: must be NAME=value, got NCCL_DEBUG"]


# --- checkpoint storage -------------------------------------------------------------------

STORED = BARE + "entrypoint: python3 t.py\ncheckpoint_storage:\n"


def test_shared_fs_is_one_directory() -> None:
    text = STORED + ("  type: shared_fs\n  host_path: /mnt/shared\n  storage_path: det/ckpt\n"
                     "  propagation: rprivate\n  save_trial_best: 2\n")
    storage = read(text).config.checkpoint_storage
    assert (storage.type, storage.path, storage.save_trial_best) == (
        "shared_fs", "/mnt/shared/det/ckpt", 2)
    assert line(text, "checkpoint_storage.storage_path") == (
        "det/ckpt → joined to host_path in checkpoint_storage.path")
    assert line(text, "checkpoint_storage.propagation").startswith("ignored: muster mounts ")


def test_s3_keeps_its_bucket_and_where_the_keys_are_read() -> None:
    text = STORED + ("  type: s3\n  bucket: ml-ckpt\n  prefix: team\n  endpoint_url: "
                     "http://minio:9000\n  access_key: env:S3_KEY\n  secret_key: env:S3_SECRET\n"
                     "  save_experiment_best: 1\n")
    storage = read(text).config.checkpoint_storage
    assert (storage.bucket, storage.prefix, storage.endpoint_url, storage.access_key) == (
        "ml-ckpt", "team", "http://minio:9000", "env:S3_KEY")
    assert storage.save_experiment_best == 1


def test_an_s3_key_written_in_the_config_is_refused() -> None:
    found = refused(STORED + "  type: s3\n  bucket: ml-ckpt\n  access_key: AKIA1234\n"
                             "  secret_key: s3cr3t\n")
    assert [problem.split(":")[0] for problem in found] == [
        "checkpoint_storage.access_key", "checkpoint_storage.secret_key"]
    assert "would be stored and shown with it" in found[0]


def test_another_storage_leaves_the_servers_default() -> None:
    text = STORED + "  type: gcs\n  bucket: ml-ckpt\n  save_trial_latest: 3\n"
    storage = read(text).config.checkpoint_storage
    assert (storage.type, storage.bucket, storage.save_trial_latest) == (None, None, 3)
    assert line(text, "checkpoint_storage.type").startswith(
        "ignored: muster stores checkpoints on shared_fs or s3, not gcs: the server's default "
        "storage keeps them")
    assert line(text, "checkpoint_storage.bucket") == (
        "ignored: goes with type gcs, which muster does not store to")


# --- every other key ----------------------------------------------------------------------

EVERYTHING_ELSE = """\
name: everything
description: the rest
labels: [mnist]
workspace: research
project: vision
entrypoint: python3 t.py
max_restarts: 3
preemption_timeout: 120
reproducibility: {experiment_seed: 7}
debug: true
bind_mounts:
  - {host_path: /datasets, container_path: /data, read_only: true}
environment:
  image: {cpu: determinedai/pytorch-ngc:0.38.1, cuda: determinedai/pytorch-ngc:0.38.1}
  pod_spec: {spec: {}}
resources: {priority: 40, resource_pool: gpus, shm_size: 4G, weight: 2}
profiling: {enabled: true}
min_validation_period: {batches: 100}
min_checkpoint_period: {epochs: 1}
checkpoint_policy: best
records_per_epoch: 60000
optimizations: {aggregation_frequency: 2}
data: {url: https://example.com/mnist.tgz}
log_policies: [{pattern: ".*CUDA out of memory.*", action: {type: cancel_retries}}]
retention_policy: {log_retention_days: 30}
scheduling_unit: 50
"""


def test_each_key_says_what_it_became_or_why_it_is_ignored() -> None:
    loaded = read(EVERYTHING_ELSE)
    config = loaded.config
    assert config.labels == ["mnist", "workspace:research", "project:vision"]
    assert (config.failure_policy.trial_retries, config.failure_policy.stop_grace) == (3, 120)
    assert (config.reproducibility.experiment_seed, config.resources.priority) == (7, 40)
    assert loaded.translation is not None
    ignored = {entry.split(": ", 1)[0]: entry.split(": ignored: ", 1)[1]
               for entry in loaded.translation.ignored}
    assert set(ignored) == {
        "debug", "bind_mounts", "environment.image", "environment.pod_spec",
        "resources.resource_pool", "resources.shm_size", "resources.weight", "profiling",
        "min_validation_period", "min_checkpoint_period", "checkpoint_policy",
        "records_per_epoch", "optimizations", "data", "log_policies", "retention_policy",
        "scheduling_unit"}
    assert ignored["bind_mounts"].endswith("the script must read /datasets (not /data)")
    assert "not in a container" in ignored["environment.image"]
    assert "does not profile" in ignored["profiling"]
    assert all(len(reason) > 20 for reason in ignored.values())  # a reason, not a word


def test_an_unknown_key_is_refused_with_the_nearest_name() -> None:
    assert refused(BARE + "entrypoint: python3 t.py\nsearcher: {name: single, metric: x, "
                          "max_lenght: 5}\n") == [
        "searcher.max_lenght: not a key of Determined's experiment config; did you mean "
        "'max_length'?"]


def test_the_muster_block_marks_the_config_and_lays_muster_settings_over_it() -> None:
    text = ("name: marked\nentrypoint: python3 -m determined.launch.torch_distributed python3 "
            "t.py\nresources: {slots_per_trial: 2}\nmuster:\n  resources: {gpus_per_replica: 0}\n"
            "  environment: {pip: [torchvision]}\n")
    config = read(text).config
    assert (config.resources.replicas, config.resources.gpus_per_replica) == (2, 0)
    assert config.environment.pip == ["torchvision"]
    assert line(text, "muster") == ("resources.gpus_per_replica, environment.pip → set over the "
                                    "translation (muster's own keys)")
    # marked, a config with only keys both know is Determined's too
    assert read("name: x\nentrypoint: python3 t.py\nmuster:\n").translation is not None
    assert refused("name: x\nentrypoint: python3 t.py\nharness: true\nmuster: {}\n") == [
        "harness: is muster's key, not Determined's: in a Determined config, muster's own "
        "settings go under `muster:` (e.g. `muster: {harness: ...}`)"]


# --- detection ----------------------------------------------------------------------------

MUSTER_CONFIGS = [*sorted(path for path in (ROOT / "examples").rglob("*.yaml")
                          if "determined" not in path.parent.name),
                  ROOT / "docs" / "config.md"]


def _yaml_of(path: Path) -> str:
    """A config file, or the first YAML block of a Markdown page (config.md's reference)."""
    text = path.read_text()
    return text.split("```yaml\n", 1)[1].split("```", 1)[0] if path.suffix == ".md" else text


@pytest.mark.parametrize("path", MUSTER_CONFIGS, ids=lambda p: str(p.relative_to(ROOT)))
def test_a_muster_config_is_never_read_as_determineds(path: Path) -> None:
    data = yaml.safe_load(_yaml_of(path))
    found = detect(data)
    assert not found.is_determined and not found.determined_only, found


@pytest.mark.parametrize(("text", "determined"), [
    ("name: x\nentrypoint: python t.py\n", False),  # keys both have: muster's, as it is
    ("name: x\nentrypoint: python t.py\nmax_restarts: 2\n", True),
    ("name: x\nentrypoint: python t.py\nharness: true\nmax_restarts: 2\n", False),
    ("name: x\nentrypoint: python t.py\nfailure_policy: {trial_retries: 1}\n"
     "environment: {environment_variables: [A=1]}\n", False),
    ("name: x\nentrypoint: python t.py\nsearcher: {name: tpe, max_length: {batches: 9}}\n",
     False),
    ("name: x\nentrypoint: python t.py\ndebug: {torch_distributed: detail}\n", False),
    # Determined's forms of keys both have are slips their hints answer (test_diagnostics)
    ("name: x\nentrypoint: python t.py\ndebug: true\n", False),
    ("name: x\nentrypoint: python t.py\ncheckpoint_storage: {type: gcs, bucket: b}\n", False),
    ("name: x\nentrypoint: python3 -m determined.launch.torch_distributed python3 t.py\n",
     True),
    ("name: x\nentrypoint: model_def:MNistTrial\n", True),
])
def test_what_makes_a_config_determineds(text: str, determined: bool) -> None:
    assert detect(yaml.safe_load(text)).is_determined is determined


def test_a_muster_config_with_a_stray_determined_key_still_gets_the_hint() -> None:
    found = problems("name: x\nentrypoint: python t.py\nharness: true\nmax_restarts: 2\n")
    assert found == ["max_restarts: not a muster key (Determined has it): muster spells it "
                     "failure_policy.trial_retries (and counts kinds of failure apart: see "
                     "failure_policy)"]


def test_the_how_to_page_says_what_becomes_of_every_determined_key() -> None:
    page = (ROOT / "docs" / "how-to" / "coming-from-determined.md").read_text()
    table = page.split("### What each key becomes", 1)[1].split("\n### ", 1)[0]
    sections = {name for name in DETERMINED_KEYS if name}
    keys = [f"{section}.{key}" if section else key
            for section, names in DETERMINED_KEYS.items() for key in sorted(names)
            if key not in sections]
    assert [key for key in keys if f"`{key}`" not in table] == []
