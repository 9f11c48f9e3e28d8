"""The trials table filtered by hyperparameter and metric ranges, and exported as CSV: on
the real store, both backends, rows written as ingestion writes them."""

from __future__ import annotations

import csv
import io
from typing import Any

import pytest

from muster.errors import InvalidRequest
from muster.services import search, trials_export
from muster.services.search import TrialQuery, ValueRange
from muster.store import Store
from tests.server.test_search_views import add_experiment, add_trial, search_config


@pytest.fixture
def table(shared_store: Store) -> int:
    """Five trials: number n has lr 10^-(n+1) (number 4: the text '=cmd'), hidden
    64*(n+1), val_loss 0.1*(n+1) and val_acc 1-0.1*n at two steps (number 3: none)."""
    with shared_store.session_scope() as s:
        exp = add_experiment(s, search_config())
        for n in range(5):
            lr: Any = 10.0 ** -(n + 1) if n != 4 else "=cmd"
            reports = [] if n == 3 else [
                {"val_loss": 0.1 * (n + 1) + 0.5, "val_acc": 0.5 - 0.1 * n},
                {"val_loss": 0.1 * (n + 1), "val_acc": 1 - 0.1 * n}]
            add_trial(s, exp, n, validation=reports,
                      hparams={"lr": lr, "model": {"hidden": 64 * (n + 1)}})
        return exp.id


def numbers(store: Store, exp_id: int, *words: str, **query: Any) -> list[int]:
    ranges = tuple(ValueRange.parse(word) for word in words)
    page = search.trial_page(store, exp_id, TrialQuery(ranges=ranges, **query))
    return [row["number"] for row in page.rows]


def test_ranges_keep_the_trials_inside_every_one(shared_store: Store, table: int) -> None:
    assert numbers(shared_store, table, "hparam:lr:1e-4:0.01") == [1, 2, 3]
    assert numbers(shared_store, table, "hparam:lr::0.001") == [2, 3]  # text is no number
    assert numbers(shared_store, table, "hparam:model.hidden:128:") == [1, 2, 3, 4]
    # The searcher's metric by its best (smallest) value; a trial without one is out.
    assert numbers(shared_store, table, "metric:val_loss:0.15:0.35") == [1, 2]
    # Any other metric by its smallest value, as the table's other metrics.
    assert numbers(shared_store, table, "metric:val_acc::0.35") == [2, 4]
    assert numbers(shared_store, table, "hparam:lr:1e-4:0.1", "metric:val_loss::0.25",
                   sort="val_loss", descending=True) == [1, 0]
    page = search.trial_page(shared_store, table, TrialQuery(
        ranges=(ValueRange.parse("metric:val_acc::0.35"),), limit=1))
    assert page.total == 2 and page.rows[0]["best_validation"] == {
        "val_loss": pytest.approx(0.3), "val_acc": pytest.approx(0.3)}
    assert numbers(shared_store, table, "hparam:absent:0:") == []


@pytest.mark.parametrize(("word", "problem"), [
    ("lr:0:1", "a range must look like"),
    ("hparam::0:1", "a range must look like"),
    ("hparam:lr:0", "a range must look like"),
    ("hparam:lr:low:1", "finite numbers or empty, got 'low'"),
    ("metric:val_loss:0:nan", "finite numbers or empty, got 'nan'"),
    ("metric:val_loss:-inf:", "finite numbers or empty"),
    ("hparam:lr:0.1:0.01", "low end must not be above its high end"),
])
def test_a_malformed_range_says_its_shape(word: str, problem: str) -> None:
    with pytest.raises(InvalidRequest, match=problem):
        ValueRange.parse(word)


def test_a_range_word_reads_back_as_the_same_range() -> None:
    for word in ["hparam:lr:0.0001:0.01", "metric:a:b:-1.5:", "hparam:x::2.0"]:
        assert ValueRange.parse(word).word() == word
    assert ValueRange.parse("metric:a:b:-1.5:") == ValueRange("metric:a:b", -1.5, None)


def test_a_range_over_an_unreported_metric_or_too_many_say_so(shared_store: Store,
                                                               table: int) -> None:
    with pytest.raises(InvalidRequest, match="filter by one of its validation metrics: "
                                             "val_acc, val_loss"):
        numbers(shared_store, table, "metric:loss:0:1")
    with pytest.raises(InvalidRequest, match="at most 16 ranges, got 17"):
        numbers(shared_store, table, *["hparam:lr:0:1"] * 17)


def read_csv(text: str) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(text, newline="")))


def test_the_csv_holds_every_matching_trial_in_the_table_order(shared_store: Store,
                                                               table: int) -> None:
    text = trials_export.trials_csv(shared_store, table, TrialQuery(
        sort="val_loss", descending=True, offset=3, limit=1,
        ranges=(ValueRange.parse("hparam:model.hidden::256"),)))
    assert text.count("\r\n") == 5  # a header and four trials, CRLF ends
    rows = read_csv(text)
    assert list(rows[0]) == [*trials_export.FIXED_COLUMNS, "hparam:lr", "hparam:model.hidden",
                             "metric:val_acc", "metric:val_loss"]
    assert [r["number"] for r in rows] == ["2", "1", "0", "3"]  # no value last
    assert rows[0]["metric:val_loss"] == repr(0.1 * 3)
    assert rows[0]["metric:val_acc"] == repr(0.5 - 0.1 * 2)  # its smallest
    assert (rows[3]["metric:val_loss"], rows[3]["hparam:lr"]) == ("", "0.0001")
    assert rows[0]["state"] == "SUCCEEDED" and rows[0]["trial"].isdigit()


def test_a_csv_text_cell_cannot_become_a_formula(shared_store: Store, table: int) -> None:
    rows = read_csv(trials_export.trials_csv(shared_store, table, TrialQuery()))
    assert rows[4]["hparam:lr"] == "'=cmd"
    with shared_store.session_scope() as s:
        exp = add_experiment(s, search_config())
        add_trial(s, exp, 0, hparams={"lr": '-1+"a",b\n@c', "model": {"hidden": -64}})
        exp_id = exp.id
    [row] = read_csv(trials_export.trials_csv(shared_store, exp_id, TrialQuery()))
    assert (row["hparam:lr"], row["hparam:model.hidden"]) == ("'-1+\"a\",b\n@c", "-64")
