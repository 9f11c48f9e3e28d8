"""The trial page's own copy of its log's last lines (pages._early_log) against a real
server: the lines are in the page, escaped, with the offsets log.js goes on from."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import pytest

from muster.config import load_config
from muster.store import Trial
from tests.server.rank_logs import RankFiles, add_trial_with_ranks
from tests.servers import RunningServer

pytestmark = pytest.mark.lifecycle  # a real server process

CONFIG = "name: one-rank\nentrypoint: python train.py\n"


def _trial(server: RunningServer, run_dir: Path) -> int:
    with server.store() as store:
        trial_id = add_trial_with_ranks(store, [run_dir], 1)
        with store.session_scope() as s:  # a config the page can show
            s.get_one(Trial, trial_id).experiment.config = load_config(CONFIG).to_json_dict()
    return trial_id


def _page(server: RunningServer, trial_id: int) -> httpx.Response:
    return httpx.get(f"{server.url}/trials/{trial_id}", timeout=30,
                     headers={"Authorization": f"Bearer {server.token}"})


def test_the_page_holds_the_last_lines_with_their_offsets(server: RunningServer,
                                                          tmp_path: Path) -> None:
    run_dir = tmp_path / "attempt-1"
    RankFiles(run_dir, 0).append(*((1000.0 + i, f"step {i:04d} <b>\n".encode())
                                   for i in range(1500)))
    page = _page(server, _trial(server, run_dir))
    assert page.status_code == 200
    early = re.search(r'data-offset="(\d+)" data-next="(\d+)"><div>(.*?)</div>', page.text, re.S)
    assert early is not None
    lines = early[3].splitlines()
    assert lines == [f"step {i:04d} &lt;b&gt;" for i in range(500, 1500)]  # text, escaped
    line = len(b"step 0000 <b>\n")
    assert (int(early[1]), int(early[2])) == (500 * line, 1500 * line)


def test_a_log_with_no_file_yet_comes_empty_from_its_start(server: RunningServer,
                                                          tmp_path: Path) -> None:
    """Before a rank's first byte (or where something else than a file stands in its
    place) the page says so: no lines, from offset 0, which a follow then starts at."""
    run_dir = tmp_path / "attempt-1"
    RankFiles(run_dir, 0).log.mkdir(parents=True)  # not a regular file: no log
    page = _page(server, _trial(server, run_dir))
    assert page.status_code == 200
    assert ('<div class="log-early" data-attempt="1" data-offset="0" data-next="0">'
            '<div></div></div>') in page.text
