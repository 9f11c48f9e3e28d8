"""A warm start through a real server: a config naming another trial's checkpoint is resolved
when it is submitted (a source muster does not hold is a 422 that says what to look at),
its trial starts from that checkpoint, and the API, the CLI and `trial diff` name it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from muster import errors
from muster.cli import app
from muster.client import Client
from tests.server.experiments import FIXTURES, only_trial, wait_trial
from tests.servers import RunningServer, shared_server

pytestmark = pytest.mark.lifecycle  # a real server and real trials

server = shared_server()


def _series(client: Client, tmp_path: Path, **searcher: Any) -> dict[str, Any]:
    """A trial of checkpoint_series.py (a checkpoint per value, resuming after the one
    `restore()` gives), run to its end."""
    context = tmp_path / "context"
    context.mkdir(parents=True, exist_ok=True)
    shutil.copy2(FIXTURES / "checkpoint_series.py", context / "checkpoint_series.py")
    config = {"name": "series", "harness": True,
              "entrypoint": ["python", "checkpoint_series.py", "0.5,0.4,0.3,0.2"],
              "searcher": {"name": "single", "metric": "val_loss", **searcher}}
    trial = only_trial(client.create_experiment(json.dumps(config), context))
    return wait_trial(client, trial["id"], {"SUCCEEDED", "SUSPECT", "FAILED"}, timeout=90)


def test_a_trial_starts_from_the_checkpoint_its_config_names(
        server: RunningServer, client: Client, tmp_path: Path) -> None:
    source = _series(client, tmp_path / "a")
    [uuid] = [c["uuid"] for c in client.list_checkpoints(source["id"]) if c["step"] == 2]

    warm = _series(client, tmp_path / "b", source_checkpoint_uuid=uuid)

    named = warm["source"]
    assert named is not None and (named["checkpoint_uuid"], named["step"], named["trial_id"]) \
        == (uuid, 2, source["id"])
    log = client.read_logs(warm["id"]).data.decode()
    assert "resumed from step 2" in log  # the script's own line: it went on from step 3
    assert client.get_experiment(warm["experiment_id"])["source"] == named
    lines = client.diff_trials(source["id"], warm["id"])["lines"]
    assert lines[0] == f"source.checkpoint_uuid: (none) vs {uuid}", lines
    line = (f"warm start: checkpoint {named['checkpoint']} (step 2) of trial {source['id']} "
            f"(experiment {source['experiment_id']}), named by source_checkpoint_uuid: {uuid}")
    for command in (["trial", "describe", str(warm["id"])],
                    ["experiment", "describe", str(warm["experiment_id"])]):
        shown = CliRunner().invoke(app, [*command, "--url", server.url,
                                         "--home", str(server.home)])
        assert shown.exit_code == 0, shown.output
        assert line in " ".join(shown.output.split()), shown.output


def test_a_source_muster_does_not_hold_is_a_422_naming_the_fix(client: Client) -> None:
    config = {"name": "x", "entrypoint": ["python", "-c", "pass"],
              "searcher": {"name": "single", "source_model": "digits@production"}}
    with pytest.raises(errors.ConfigError) as info:
        client.create_experiment(json.dumps(config), None)
    assert ("searcher.source_model: no model named 'digits'; `muster model list` shows the "
            "models") in str(info.value)
