"""Population-based training through a real server, as a user runs it: a script written the
way PBT scripts are (it resumes from `restore()` and trains to `ctx.max_length`), its
trials' lineage in the API and on the command line (`muster trial describe`)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import httpx
import pytest

from muster.client import Client
from tests.cli.test_cli import on
from tests.servers import RunningServer
from tests.supervise.conftest import FIXTURES
from tests.waiting import wait_until

pytestmark = pytest.mark.lifecycle  # a real server, real trials

SEARCH = """\
name: pbt-cli
entrypoint: python pbt_job.py
harness: true
hyperparameters:
  lr: {type: double, minval: 0.05, maxval: 0.9}
searcher:
  name: pbt
  metric: loss
  population_size: 3
  num_rounds: 2
  length_per_round: 2
  replace_function: {truncate_fraction: 0.34}
  explore_function: {resample_probability: 0.0, perturb_factor: 0.25}
reproducibility: {experiment_seed: 3}
"""


@pytest.fixture(scope="module")
def finished(server: RunningServer, tmp_path_factory: pytest.TempPathFactory
             ) -> dict[str, Any]:
    context = tmp_path_factory.mktemp("pbt-context")
    shutil.copy(FIXTURES / "pbt_job.py", context / "pbt_job.py")
    with Client(url=server.url, token=server.token) as client:
        exp = client.create_experiment(SEARCH, context)
        ended: dict[str, Any] = wait_until(
            lambda: (e := client.get_experiment(exp["id"]))["state"] in (
                "COMPLETED", "ERROR", "CANCELED") and e,
            timeout=180, what="the PBT experiment to end")
        trials = {t["number"]: client.get_trial(t["id"]) for t in ended["trials"]}
    return {"experiment": ended, "trials": trials}


def test_every_round_is_verified_and_names_its_parent(finished: dict[str, Any]) -> None:
    experiment, trials = finished["experiment"], finished["trials"]
    assert experiment["state"] == "COMPLETED", experiment
    assert sorted(trials) == list(range(6))
    assert all(t["state"] == "SUCCEEDED" and t["verified"] for t in trials.values())
    for number in range(3):
        assert trials[number]["lineage"] == {
            "generation": 0, "action": None, "parent_trial_id": None, "parent_number": None,
            "replaces_trial_id": None, "checkpoint_uuid": None, "checkpoint": None,
            "step": None, "changed": {}}
    later = [trials[n]["lineage"] for n in range(3, 6)]
    assert sorted(x["action"] for x in later) == ["continue", "continue", "exploit"]
    for lineage in later:
        parent = trials[lineage["parent_number"]]
        assert lineage["parent_trial_id"] == parent["id"] and lineage["step"] == 2
        assert lineage["generation"] == 1 and lineage["checkpoint"].startswith("step-000000000002-")
    [copy] = [n for n in range(3, 6) if trials[n]["lineage"]["action"] == "exploit"]
    lineage = trials[copy]["lineage"]
    parent_lr = trials[lineage["parent_number"]]["hparams"]["lr"]
    assert lineage["changed"] == {"lr": [parent_lr, trials[copy]["hparams"]["lr"]]}
    assert lineage["replaces_trial_id"] == trials[copy - 3]["id"]


def test_trial_describe_shows_the_lineage(server: RunningServer,
                                          finished: dict[str, Any]) -> None:
    trials = finished["trials"]
    [copy] = [t for t in trials.values() if (t["lineage"] or {}).get("action") == "exploit"]
    lineage = copy["lineage"]
    done = on(server, "trial", "describe", str(copy["id"]))
    assert done.returncode == 0, done.stderr
    [line] = [x for x in done.stdout.splitlines() if x.startswith("lineage: ")]
    old, new = lineage["changed"]["lr"]
    assert line == (f"lineage: generation 1, exploit: copied trial {lineage['parent_trial_id']}'s "
                    f"checkpoint {lineage['checkpoint']} (step 2), replacing trial "
                    f"{lineage['replaces_trial_id']}; explored: lr {old!r} -> {new!r}")
    first = on(server, "trial", "describe", str(trials[0]["id"]))
    assert "lineage: generation 0, drawn afresh (population-based training)" in first.stdout
    as_json = json.loads(on(server, "trial", "describe", str(copy["id"]), "--json").stdout)
    assert as_json["lineage"] == lineage


def test_a_child_trained_on_from_its_parents_weight(server: RunningServer,
                                                    finished: dict[str, Any]) -> None:
    """The checkpoint each later trial saved holds its parent's line of trials and its own:
    it continued the parent's weight, from the parent's step."""
    trials = finished["trials"]
    with Client(url=server.url, token=server.token) as client:
        for number in range(3, 6):
            trial = trials[number]
            [latest] = [c for c in client.list_checkpoints(trial["id"]) if c["step"] == 4]
            state = json.loads((Path(latest["path"]) / "state.json").read_text())
            parent = trials[trial["lineage"]["parent_number"]]
            assert state["line"] == [parent["id"], trial["id"]] and state["from"] == 2


def test_the_trial_page_links_the_parent(server: RunningServer,
                                         finished: dict[str, Any]) -> None:
    trials = finished["trials"]
    [copy] = [t for t in trials.values() if (t["lineage"] or {}).get("action") == "exploit"]
    lineage = copy["lineage"]
    page = httpx.get(f"{server.url}/trials/{copy['id']}", timeout=30,
                     headers={"Authorization": f"Bearer {server.token}"})
    assert page.status_code == 200
    [line] = re.findall(r'<p id="lineage">(.*?)</p>', page.text, re.S)
    old, new = lineage["changed"]["lr"]
    parent, replaced = lineage["parent_trial_id"], lineage["replaces_trial_id"]
    assert line == (f'Population-based training, generation 1: copied <a href="/trials/'
                    f'{parent}">trial {parent}</a>' f"'s checkpoint {lineage['checkpoint']} "
                    f'(step 2), replacing <a href="/trials/{replaced}">trial {replaced}</a>; '
                    f"explored: lr {old} → {new}")
    plain = httpx.get(f"{server.url}/trials/{trials[1]['id']}", timeout=30,
                      headers={"Authorization": f"Bearer {server.token}"})
    assert "generation 0: drawn afresh</p>" in plain.text
