"""The trials table's range filter and CSV export through a real server:
`GET /experiments/{id}/trials?where=...` and `GET /experiments/{id}/trials.csv`."""

from __future__ import annotations

import csv
import io

import httpx
import pytest

from tests.server.test_search_api import raw, store_search
from tests.servers import RunningServer, shared_server

pytestmark = pytest.mark.lifecycle  # starts real processes

server = shared_server()


def test_ranges_filter_the_trials_and_the_csv_follows_the_query(server: RunningServer
                                                                ) -> None:
    stored = store_search(server)  # val_loss 0.4, 0.2, 0.1, none; lr 0.001 * (n + 1)
    path = f"/experiments/{stored['id']}/trials"
    answer = raw(server, path, where="metric:val_loss::0.3", sort="val_loss")
    assert answer.status_code == 200, answer.text
    assert [t["number"] for t in answer.json()] == [2, 1]
    assert answer.headers["X-Total-Count"] == "2"
    exported = raw(server, path + ".csv", where="hparam:lr:0.0015:", order_by="number",
                   order="desc", limit="1")
    assert exported.status_code == 200, exported.text
    assert exported.headers["Content-Type"] == "text/csv; charset=utf-8"
    assert exported.headers["Content-Disposition"] == (
        f'attachment; filename="experiment-{stored["id"]}-trials.csv"')
    rows = list(csv.DictReader(io.StringIO(exported.text, newline="")))
    assert [(r["number"], r["hparam:lr"], r["metric:val_loss"]) for r in rows] == [
        ("3", "0.004", ""), ("2", "0.003", "0.1"), ("1", "0.002", "0.2")]


@pytest.mark.parametrize(("suffix", "word", "status", "says"), [
    ("", "lr:0:1", 400, "a range must look like hparam:NAME:LOW:HIGH"),
    (".csv", "metric:val_loss:x:", 400, "finite numbers or empty, got 'x'"),
    (".csv", "metric:loss::1", 400, "filter by one of its validation metrics"),
])
def test_a_bad_range_is_a_clear_4xx(server: RunningServer, suffix: str, word: str,
                                    status: int, says: str) -> None:
    stored = store_search(server)
    answer = raw(server, f"/experiments/{stored['id']}/trials{suffix}", where=word)
    assert answer.status_code == status and says in answer.json()["message"]


def test_ranges_and_their_words_are_bounded(server: RunningServer) -> None:
    stored = store_search(server)
    token = server.token
    many = [("where", "hparam:lr:0:1")] * 17
    answer = httpx.get(f"{server.url}/api/v1/experiments/{stored['id']}/trials.csv",
                       params=many, headers={"Authorization": f"Bearer {token}"}, timeout=30)
    assert answer.status_code == 422 and "where" in answer.text
    long = raw(server, f"/experiments/{stored['id']}/trials", where="hparam:" + "x" * 400)
    assert long.status_code == 422
