"""The trial page's snapshot section and its "compare with" page, `/trials/{id}/diff?other=N`,
over plain HTTP (pages take a bearer token as well as a session): the grouped lines, escaped;
no difference said; bad input a 4xx page, never a 500."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.ui.conftest import Team

pytestmark = pytest.mark.lifecycle  # a real server


def page(team: Team, path: str, who: str = "vera", **params: Any) -> httpx.Response:
    return httpx.get(team.server.url + path, params=params, timeout=30, follow_redirects=False,
                     headers={"Authorization": f"Bearer {team.tokens[who]}"})


def trial_of(team: Team, tmp_path: Path, **hparams: Any) -> int:
    """The trial of a new experiment of alice's with these hyperparameters."""
    context = tmp_path / f"ctx-{len(list(tmp_path.iterdir()))}"
    context.mkdir()
    (context / "train.py").write_text("print('training')\n")
    config = json.dumps({"name": "diff", "entrypoint": ["true"], "hyperparameters": hparams})
    with team.client("alice") as alice:
        trial_id: int = alice.create_experiment(config, context)["trials"][0]["id"]
    return trial_id


def test_the_trial_page_shows_its_snapshot_and_a_compare_form(team: Team,
                                                               tmp_path: Path) -> None:
    trial_id = trial_of(team, tmp_path, lr=0.01)
    with team.client("vera") as vera:
        tree = vera.get_trial(trial_id)["snapshot"]["code"]["tree_sha256"]
    shown = page(team, f"/trials/{trial_id}")
    assert shown.status_code == 200, shown.text
    assert "<h2>Snapshot" in shown.text
    assert f'title="{tree}">{tree[:12]}</span> (1 file)' in shown.text
    assert "the base interpreter" in shown.text and "no data manifest" in shown.text
    assert f'action="/trials/{trial_id}/diff"' in shown.text and 'name="other"' in shown.text


def test_the_diff_page_groups_the_lines_and_escapes_them(team: Team, tmp_path: Path) -> None:
    a = trial_of(team, tmp_path, lr=0.01, note="<b>one</b>")
    b = trial_of(team, tmp_path, lr=0.02, note="<i>two</i>")
    shown = page(team, f"/trials/{a}/diff", other=str(b))
    assert shown.status_code == 200, shown.text
    assert "<h2>config</h2>" in shown.text
    assert '<li class="hp">lr: 0.01 vs 0.02</li>' in shown.text
    assert "note: &lt;b&gt;one&lt;/b&gt; vs &lt;i&gt;two&lt;/i&gt;" in shown.text
    assert "<b>one</b>" not in shown.text
    same = page(team, f"/trials/{a}/diff", other=f" {a} ")
    assert same.status_code == 200 and "No difference in what they were made of." in same.text


@pytest.mark.parametrize(("other", "status", "says"), [
    ("abc", 400, "give the other trial&#39;s id, a whole number such as 12; got &#39;abc&#39;"),
    ("", 400, "got &#39;&#39;"),
    ("0", 404, "trial 0 does not exist"),
    ("2147483647", 404, "trial 2147483647 does not exist"),
    ("9" * 21, 422, "query.other"),
], ids=["not-a-number", "empty", "zero", "unknown", "too-long"])
def test_a_bad_other_trial_is_a_4xx_page(team: Team, tmp_path: Path, other: str, status: int,
                                         says: str) -> None:
    trial_id = trial_of(team, tmp_path)
    shown = page(team, f"/trials/{trial_id}/diff", other=other)
    assert shown.status_code == status, shown.text
    assert shown.headers["content-type"].startswith("text/html")
    assert says in shown.text


def test_an_unknown_trial_and_a_visitor_without_a_session(team: Team, tmp_path: Path) -> None:
    trial_id = trial_of(team, tmp_path)
    unknown = page(team, "/trials/2147483646/diff", other=str(trial_id))
    assert unknown.status_code == 404 and "trial 2147483646 does not exist" in unknown.text
    assert page(team, "/trials/x/diff", other="1").status_code == 404
    anonymous = httpx.get(f"{team.server.url}/trials/{trial_id}/diff?other={trial_id}",
                          timeout=30, follow_redirects=False)
    assert anonymous.status_code == 303
    assert anonymous.headers["location"].startswith("/login?next=")
