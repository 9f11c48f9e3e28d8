"""The coded-bias judgement (`muster.diagnostics.bias`), table by table on records written
by hand in the diagnostics file's format: no processes, no torch."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from muster.diagnostics.bias import (
    CHECKS,
    Bounds,
    Finding,
    RankRecords,
    judge,
    parse_records,
    series,
)

DATASET = {"type": "TensorDataset", "size": 100}
DEFAULT_BOUNDS = Bounds()
INTERVAL = 20  # optimizer steps between two update records, as the harness's default


def sampler(number: int = 0, *, type_: str = "RandomSampler", random: bool = True,
            partitioned: bool = False, replacement: bool | None = False,
            generator_seed: int | None = None, torch_initial: int = 1,
            dataset: Mapping[str, Any] = DATASET) -> dict[str, Any]:
    return {"kind": "sampler", "sampler": number, "type": type_, "random": random,
            "partitioned": partitioned, "replacement": replacement,
            "generator_seed": generator_seed, "torch_initial": torch_initial,
            "dataset": dict(dataset)}


def pass_(indices: Sequence[Any], *, number: int = 0, index: int = 0, count: int | None = None,
          complete: bool = True, epoch: int | None = None) -> dict[str, Any]:
    return {"kind": "pass", "sampler": number, "pass": index, "epoch": epoch,
            "count": len(indices) if count is None else count, "complete": complete,
            "indices": list(indices)}


def params(names: Sequence[str], replicated: bool = True) -> dict[str, Any]:
    return {"kind": "params", "names": list(names), "replicated": replicated}


def update(step: int, grad_norm: float | None = 1.0, grad_finite: bool | None = True,
           hash_: Sequence[int] = ()) -> dict[str, Any]:
    return {"kind": "update", "update": step, "grad_norm": grad_norm,
            "grad_finite": grad_finite, "hash": list(hash_)}


def ranks(*per_rank: Sequence[Mapping[str, Any]]) -> dict[int, RankRecords]:
    return {rank: parse_records(lines) for rank, lines in enumerate(per_rank)}


def finding(found: list[Finding], check: str) -> Finding | None:
    matching = [f for f in found if f.check == check]
    assert len(matching) <= 1, matching
    return matching[0] if matching else None


def judged(check: str, records: Mapping[int, RankRecords], bounds: Bounds = DEFAULT_BOUNDS,
           reported: Mapping[int, str] | None = None) -> Finding | None:
    return finding(judge(records, bounds, reported), check)


def assert_words(detail: str, words: Sequence[str]) -> None:
    for word in words:
        assert word in detail, f"{word!r} not in {detail!r}"


# --- parse_records ------------------------------------------------------------------------


def test_parse_records_sorts_each_kind_and_skips_malformed_ones() -> None:
    records = parse_records([
        sampler(3),
        {"kind": "sampler", "sampler": True},  # a bool is not a sampler number
        {"kind": "sampler", "sampler": "3"},
        pass_([1, 2], number=3, index=0),
        {"kind": "pass", "sampler": 3, "pass": 1, "count": 2},  # no indices
        {"kind": "pass", "sampler": 3, "pass": 2, "count": 2.0, "indices": [1]},
        params(["a", "b"]),
        update(0),
        {"kind": "update", "update": None},
        {"kind": "metric", "update": 1},
        {"no": "kind"},
    ])
    assert list(records.samplers) == [3]
    assert list(records.passes) == [(3, 0)]
    assert (records.params, records.replicated) == (["a", "b"], True)
    assert list(records.updates) == [0]


def test_params_replicated_only_when_true() -> None:
    records = parse_records([{"kind": "params", "names": ["w", 7], "replicated": "yes"}])
    assert (records.params, records.replicated) == (["w", "7"], False)


def test_one_rank_is_judged_only_on_what_needs_no_other_rank() -> None:
    records = ranks([sampler(), pass_([1, 2, 3]), pass_([1, 2, 3], index=1), params(["w"]),
                     update(0, hash_=[5])])
    assert [f.check for f in judge(records, Bounds())] == ["finite_all_ranks", "epoch_order"]


def test_findings_come_in_checks_order() -> None:
    line = [sampler(), pass_(range(10)), pass_(range(10, 20), index=1), params(["w"]),
            update(0, hash_=[5]), update(20, hash_=[6])]
    found = judge(ranks(line, line), Bounds())
    assert [f.check for f in found] == list(CHECKS)


def test_nothing_recorded_is_nothing_judged() -> None:
    assert judge(ranks([], []), Bounds()) == []
    assert judge({}, Bounds()) == []


# --- grad_norm_spread ---------------------------------------------------------------------


def spread_series(spreads: Sequence[float]) -> list[list[float]]:
    """Two ranks' norms whose std over mean is each of `spreads`: 1 - s and 1 + s."""
    return [[1 - s for s in spreads], [1 + s for s in spreads]]


def norms_records(per_rank: Sequence[Sequence[float | None]]) -> dict[int, RankRecords]:
    return ranks(*([update(i * INTERVAL, norm) for i, norm in enumerate(norms)]
                   for norms in per_rank))


CLEAN = [0.05, 0.2, 0.35, 0.1, 0.3, 0.05, 0.15, 0.35, 0.25, 0.1, 0.2, 0.3]
JUMP = [0.05] * 5 + [0.6] * 5  # samples 5..9 jump; the median of 5 crosses at sample 7


@pytest.mark.parametrize(("norms", "found", "words"), [
    pytest.param(spread_series(CLEAN), False, ["12 samples", "0.20 of their mean", "at most 0.35"],
                 id="clean-noisy"),
    pytest.param([[1.0, 1.1, 250.0, 1.0, 0.9, 1.0], [1.0, 1.0, 1.0, 1.0, 1.0, 1.0]], True,
                 ["update 40", "rank 0's local gradient norm was 250", "rank 1's 1",
                  "250x apart", "bound 20x"], id="one-sample-250x-larger-rank-0"),
    pytest.param([[1.0, 1.0, 1.0], [1.0, 1.0, 250.0]], True,
                 ["update 40", "rank 1's local gradient norm was 250", "rank 0's 1",
                  "250x apart"], id="one-sample-250x-larger-rank-1"),
    pytest.param([[1.0], [20.0]], True, ["update 0", "20x apart"], id="exactly-the-ratio"),
    pytest.param([[1.0], [19.9]], False, ["1 sample"], id="just-under-the-ratio"),
    pytest.param(spread_series(JUMP), True,
                 ["by update 140", "0.60 of their mean over 5 samples", "bound 0.5"],
                 id="sustained-jump"),
    pytest.param(spread_series([0.05] * 5 + [0.6] * 2 + [0.05] * 5), False,
                 ["12 samples", "at most 0.60"], id="two-high-samples-are-not-sustained"),
    pytest.param([[0.0, 1.0], [0.5, 1.0]], True,
                 ["update 0", "rank 1's local gradient norm was 0.5", "rank 0's 0"],
                 id="rank-norm-zero-vs-positive"),
    pytest.param([[0.0, 0.0], [0.0, 0.0]], False, ["2 samples"], id="both-zero"),
    pytest.param(spread_series([0.8] * 4), False, ["4 samples", "0.80 of their mean"],
                 id="fewer-than-5-samples"),
    pytest.param([[1.0, 1.0, 1.0], [1.0, 30.0, 1.05], [1.1, 1.2, 1.0]], True,
                 ["update 20", "rank 1's local gradient norm was 30", "rank 0's 1",
                  "rank 2's 1.2", "30x apart"], id="3-ranks-one-outlier-above"),
    pytest.param([[1.0, 1.0], [1.1, 1.0], [0.05, 1.0]], True,
                 ["update 0", "rank 2's local gradient norm was 0.05", "22x apart"],
                 id="3-ranks-one-outlier-below"),
    pytest.param([[1.0, None, 1.0], [1.0, 500.0, 1.0]], False, ["2 samples"],
                 id="a-sample-without-every-rank-is-not-compared"),
])
def test_gradient_spread_on_recorded_series(norms: list[list[float | None]], found: bool,
                                            words: list[str]) -> None:
    result = judged("grad_norm_spread", norms_records(norms))
    assert result is not None
    assert result.found is found, result.detail
    assert_words(result.detail, words)


def test_gradient_spread_bounds_come_from_the_config() -> None:
    records = norms_records([[1.0] * 6, [5.0] * 6])  # 5x apart, spread 0.67 throughout
    assert judged("grad_norm_spread", records).found  # type: ignore[union-attr]
    relaxed = judged("grad_norm_spread", records, Bounds(spread=0.7, ratio=6.0))
    assert relaxed is not None and not relaxed.found


def test_gradient_spread_is_not_judged_without_common_samples() -> None:
    records = ranks([update(0, 1.0)], [update(20, 1.0)])
    assert judged("grad_norm_spread", records) is None


def test_series_gives_the_spread_per_update_and_the_worst_overlap_per_pass() -> None:
    line_a = [sampler(), pass_(range(10)), pass_(range(10), index=1),
              update(0, 0.5), update(20, 1.0)]
    line_b = [sampler(), pass_(range(5, 15)), pass_(range(10, 20), index=1),
              update(0, 1.5), update(20, 1.0)]
    curves = series(ranks(line_a, line_b))
    assert curves["grad_norm_spread"] == [[0, pytest.approx(0.5)], [20, 0.0]]
    assert curves["sampler_overlap"] == [[0, 0.5], [1, 0.0]]


# --- sampler_overlap ----------------------------------------------------------------------


REPEATS = [i % 10 for i in range(100)]  # with replacement: every sample drawn 10 times


@pytest.mark.parametrize(("indices", "replacement", "found", "words"), [
    pytest.param([list(range(100)), list(range(100))], False, True,
                 ["pass 0", "ranks 0 and 1 drew 100%", "RandomSampler", "DistributedSampler"],
                 id="no-replacement-same-order"),
    pytest.param([list(range(100)), list(reversed(range(100)))], False, True,
                 ["ranks 0 and 1 drew 100%"], id="no-replacement-every-rank-the-whole-set"),
    pytest.param([list(range(0, 100, 2)), list(range(1, 100, 2))], False, False,
                 ["1 pass compared", "at most 0%"], id="disjoint-partition"),
    pytest.param([list(range(0, 60)), list(range(40, 100))], False, False,
                 ["at most 33%"], id="one-third-shared"),
    pytest.param([REPEATS, list(REPEATS)], True, True, ["drew 100%"],
                 id="replacement-same-sequence"),
    pytest.param([REPEATS, [(i + 1) % 10 for i in range(100)]], True, False,
                 ["at most 0%"], id="replacement-independent-draws-share-every-sample"),
    pytest.param([REPEATS, [i % 10 if i % 4 else 99 for i in range(100)]], True, True,
                 ["drew 75%"], id="replacement-three-quarters-the-same-positions"),
])
def test_sampler_overlap(indices: list[list[int]], replacement: bool, found: bool,
                         words: list[str]) -> None:
    records = ranks(*([sampler(replacement=replacement, generator_seed=rank), pass_(drawn)]
                      for rank, drawn in enumerate(indices)))
    result = judged("sampler_overlap", records)
    assert result is not None
    assert result.found is found, result.detail
    assert_words(result.detail, words)


def test_overlap_names_the_first_flagged_pass_and_counts_the_others() -> None:
    same = list(range(50))
    line = [sampler(), pass_(range(50), epoch=0)]
    line_b = [sampler(), pass_(range(50, 100), epoch=0)]
    for index in (1, 2, 3):
        line.append(pass_(same, index=index, epoch=index))
        line_b.append(pass_(same, index=index, epoch=index))
    result = judged("sampler_overlap", ranks(line, line_b))
    assert result is not None and result.found
    assert_words(result.detail, ["pass 1 (sampler epoch 1)", "and in 2 more passes"])


def test_overlap_bound_comes_from_the_config() -> None:
    records = ranks([sampler(), pass_(range(0, 60))], [sampler(), pass_(range(40, 100))])
    result = judged("sampler_overlap", records, Bounds(overlap=0.3))
    assert result is not None and result.found
    assert "33%" in result.detail


def test_datasets_of_different_sizes_are_not_compared() -> None:
    records = ranks([sampler(dataset={"type": "TensorDataset", "size": 100}), pass_(range(50))],
                    [sampler(dataset={"type": "TensorDataset", "size": 50}), pass_(range(50))])
    assert judged("sampler_overlap", records) is None


def test_only_ranks_on_the_same_dataset_are_compared() -> None:
    small = {"type": "TensorDataset", "size": 50}
    records = ranks([sampler(), pass_(range(50))], [sampler(dataset=small), pass_(range(50))],
                    [sampler(), pass_(range(50, 100))])
    result = judged("sampler_overlap", records)
    assert result is not None and not result.found
    assert "ranks 0 and 2" in result.detail


def test_a_pass_one_rank_recorded_is_not_compared() -> None:
    records = ranks([sampler(), pass_(range(50))], [sampler()])
    assert judged("sampler_overlap", records) is None


# --- rank_seeds ---------------------------------------------------------------------------


@pytest.mark.parametrize(("descriptions", "found", "words"), [
    pytest.param([sampler(generator_seed=42), sampler(generator_seed=42)], True,
                 ["ranks 0 and 1", "RandomSampler", "same seed 42", "generator's",
                  "manual_seed(seed + rank)"], id="same-generator-seed"),
    pytest.param([sampler(generator_seed=42), sampler(generator_seed=43)], False,
                 ["1 random sampler", "own seed"], id="seed-plus-rank"),
    pytest.param([sampler(torch_initial=7), sampler(torch_initial=7)], True,
                 ["ranks 0 and 1", "same seed 7", "torch's global seed", "no generator"],
                 id="no-generator-same-torch-seed"),
    pytest.param([sampler(torch_initial=7), sampler(torch_initial=8)], False, ["own seed"],
                 id="no-generator-torch-seeded-per-rank"),
    pytest.param([sampler(generator_seed=5, torch_initial=1),
                  sampler(generator_seed=6, torch_initial=1)], False, ["own seed"],
                 id="the-generator-seed-wins-over-torch"),
    pytest.param([sampler(type_="DistributedSampler", partitioned=True, generator_seed=0)] * 2,
                 False, ["no sampler draws randomly from the whole data set"],
                 id="partitioned-distributed-sampler-same-seed"),
    pytest.param([sampler(type_="SequentialSampler", random=False)] * 2, False,
                 ["does not shuffle"], id="sequential"),
    pytest.param([sampler(generator_seed=3), sampler(generator_seed=4),
                  sampler(generator_seed=3)], True, ["ranks 0 and 2", "same seed 3"],
                 id="3-ranks-two-alike"),
    pytest.param([sampler(type_="WeightedRandomSampler", replacement=True, generator_seed=0)] * 2,
                 True, ["WeightedRandomSampler", "same seed 0"], id="weighted-same-seed"),
])
def test_rank_seeds(descriptions: list[dict[str, Any]], found: bool, words: list[str]) -> None:
    result = judged("rank_seeds", ranks(*([d] for d in descriptions)))
    assert result is not None
    assert result.found is found, result.detail
    assert_words(result.detail, words)


def test_seeds_without_samplers_are_not_judged() -> None:
    assert judged("rank_seeds", ranks([update(0)], [update(0)])) is None


# --- replica_hash -------------------------------------------------------------------------


NAMES = ["fc.weight", "fc.bias", "out.weight"]


@pytest.mark.parametrize(("second_rank_hashes", "found", "words"), [
    pytest.param([[1, 2, 3], [4, 5, 6]], False,
                 ["2 samples of 3 parameters", "every rank held the same values"],
                 id="replicas-equal"),
    pytest.param([[1, 2, 3], [4, 9, 6]], True,
                 ["update 20", "rank 1's fc.bias differs from rank 0's", "1 parameter of 3"],
                 id="one-parameter-differs"),
    pytest.param([[1, 2, 3], [8, 9, 9]], True,
                 ["update 20", "rank 1's fc.weight", "3 parameters of 3"],
                 id="the-first-differing-is-named"),
    pytest.param([[1, 2, 4], [8, 9, 9]], True, ["update 0", "rank 1's out.weight"],
                 id="the-first-update-is-named"),
])
def test_replica_hash(second_rank_hashes: list[list[int]], found: bool,
                      words: list[str]) -> None:
    first = [params(NAMES), update(0, hash_=[1, 2, 3]), update(20, hash_=[4, 5, 6])]
    second = [params(NAMES), *(update(i * INTERVAL, hash_=h)
                               for i, h in enumerate(second_rank_hashes))]
    result = judged("replica_hash", ranks(first, second))
    assert result is not None
    assert result.found is found, result.detail
    assert_words(result.detail, words)


def test_models_that_are_not_replicated_are_not_compared() -> None:
    records = ranks([params(NAMES, replicated=False), update(0, hash_=[1, 2, 3])],
                    [params(NAMES, replicated=False), update(0, hash_=[7, 8, 9])])
    assert judged("replica_hash", records) is None


def test_one_replicated_rank_is_not_enough() -> None:
    records = ranks([params(NAMES), update(0, hash_=[1, 2, 3])],
                    [params(NAMES, replicated=False), update(0, hash_=[7, 8, 9])])
    assert judged("replica_hash", records) is None


def test_different_parameter_lists_are_not_compared() -> None:
    records = ranks([params(NAMES), update(0, hash_=[1, 2, 3])],
                    [params(["other.weight", "fc.bias", "out.weight"]), update(0, hash_=[7, 8, 9])])
    result = judged("replica_hash", records)
    assert result is not None and not result.found
    assert_words(result.detail, ["different parameters", "not compared"])


def test_hash_lists_of_the_wrong_length_are_not_compared() -> None:
    records = ranks([params(NAMES), update(0, hash_=[1, 2, 3])],
                    [params(NAMES), update(0, hash_=[7, 8])])
    assert judged("replica_hash", records) is None


# --- finite_all_ranks ---------------------------------------------------------------------


def finite_records(flags: Sequence[Sequence[bool | None]]) -> dict[int, RankRecords]:
    return ranks(*([update(i * INTERVAL, grad_finite=flag) for i, flag in enumerate(rank)]
                   for rank in flags))


@pytest.mark.parametrize(("flags", "reported", "found", "words"), [
    pytest.param([[True, True, True], [True, False, False]], {}, True,
                 ["rank 1: its local gradient was not finite at update 20",
                  "finite on rank 0"], id="rank-1-not-finite"),
    pytest.param([[True, True], [True, True]], {0: "reported loss=nan at step 3"}, True,
                 ["rank 0: reported loss=nan at step 3", "finite on rank 1"],
                 id="reported-metric-merged"),
    pytest.param([[True, True], [True, False]], {1: "reported loss=nan at step 3"}, True,
                 ["rank 1: reported loss=nan at step 3; its local gradient was not finite at "
                  "update 20", "finite on rank 0"], id="both-on-one-rank"),
    pytest.param([[False], [False]], {}, True,
                 ["rank 0: its local gradient was not finite at update 0",
                  "rank 1: its local gradient was not finite at update 0"], id="every-rank"),
    pytest.param([[True, True], [True, True]], {}, False,
                 ["every rank's local gradients (4 samples)", "finite"], id="all-finite"),
    pytest.param([[True, None], [None, True]], {}, False, ["2 samples"],
                 id="unsampled-updates-are-not-counted"),
])
def test_finite_all_ranks(flags: list[list[bool | None]], reported: dict[int, str],
                          found: bool, words: list[str]) -> None:
    result = judged("finite_all_ranks", finite_records(flags), reported=reported)
    assert result is not None
    assert result.found is found, result.detail
    assert_words(result.detail, words)


def test_finite_is_not_judged_without_gradient_samples_or_reports() -> None:
    assert judged("finite_all_ranks", finite_records([[None], [None]])) is None


def test_a_reported_non_finite_metric_alone_is_found() -> None:
    result = judged("finite_all_ranks", ranks([sampler()], [sampler()]),
                    reported={1: "reported loss=inf at step 9"})
    assert result is not None and result.found
    assert_words(result.detail, ["rank 1: reported loss=inf", "finite on rank 0"])


# --- sample_balance -----------------------------------------------------------------------


@pytest.mark.parametrize(("counts", "found", "words"), [
    pytest.param([300, 100], True,
                 ["pass 0", "rank 0 drew 300 samples, rank 1 100", "3.00x", "bound 1.2x"],
                 id="3x"),
    pytest.param([100, 300], True, ["rank 1 drew 300 samples, rank 0 100"],
                 id="3x-the-other-way"),
    pytest.param([110, 100], False, ["1 pass", "within 1.2x"], id="within-bound"),
    pytest.param([120, 100], False, ["within 1.2x"], id="exactly-the-bound"),
    pytest.param([0, 50], True, ["rank 1 drew 50 samples, rank 0 0", "all of them"],
                 id="one-rank-nothing"),
    pytest.param([1_500, 100], True, ["drew 1,500 samples"], id="thousands"),
])
def test_sample_balance(counts: list[int], found: bool, words: list[str]) -> None:
    records = ranks(*([sampler(), pass_([0], count=n)] for n in counts))
    result = judged("sample_balance", records)
    assert result is not None
    assert result.found is found, result.detail
    assert_words(result.detail, words)


def test_an_incomplete_pass_is_not_balanced() -> None:
    records = ranks([sampler(), pass_([0], count=300, complete=False)],
                    [sampler(), pass_([1], count=100)])
    assert judged("sample_balance", records) is None


# --- epoch_order --------------------------------------------------------------------------


@pytest.mark.parametrize(("description", "second_pass", "found", "words"), [
    pytest.param(sampler(), [3, 1, 2, 0], True,
                 ["rank 0's RandomSampler", "same order in passes 0 and 1", "new seed"],
                 id="random-same-order"),
    pytest.param(sampler(type_="DistributedSampler", partitioned=True), [3, 1, 2, 0], True,
                 ["DistributedSampler", "set_epoch"], id="distributed-no-set-epoch"),
    pytest.param(sampler(), [0, 2, 1, 3], False, ["1 pass after the first", "new order"],
                 id="random-new-order"),
    pytest.param(sampler(type_="SequentialSampler", random=False), [3, 1, 2, 0], None, [],
                 id="not-random"),
])
def test_epoch_order(description: dict[str, Any], second_pass: list[int],
                     found: bool | None, words: list[str]) -> None:
    line = [description, pass_([3, 1, 2, 0]), pass_(second_pass, index=1)]
    result = judged("epoch_order", ranks(line))
    if found is None:
        assert result is None
        return
    assert result is not None
    assert result.found is found, result.detail
    assert_words(result.detail, words)


def test_epoch_order_names_the_rank_and_passes() -> None:
    fresh = [sampler(), pass_([0, 1, 2]), pass_([2, 0, 1], index=1), pass_([1, 2, 0], index=2)]
    stuck = [sampler(), pass_([0, 1, 2]), pass_([2, 0, 1], index=1), pass_([2, 0, 1], index=2)]
    result = judged("epoch_order", ranks(fresh, stuck))
    assert result is not None and result.found
    assert_words(result.detail, ["rank 1's", "passes 1 and 2"])


def test_epoch_order_after_an_incomplete_pass_is_not_found() -> None:
    line = [sampler(), pass_([3, 1, 2, 0], complete=False), pass_([3, 1, 2, 0], index=1)]
    result = judged("epoch_order", ranks(line))
    assert result is not None and not result.found
