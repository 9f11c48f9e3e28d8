"""The ranks judged together: coded-bias findings from every rank's diagnostics (issue 17).

Each rank of an attempt that used `muster.harness.torch` wrote a diagnostics file
(`muster.harness.diagnostics`), one JSON object per line:

    {"kind": "sampler", "sampler": n, "type": "WeightedRandomSampler", "random": bool,
     "partitioned": bool, "replacement": bool | None, "generator_seed": int | None,
     "torch_initial": int,
     "dataset": {"type": str, "size": int | None}}  # a watched loader's sampler; passes
                                                 # over data sets that differ are not compared
    {"kind": "pass", "sampler": n, "pass": p, "epoch": int | None, "count": int,
     "complete": bool, "indices": [first 4,096]} # one pass over that loader
    {"kind": "params", "names": [str], "replicated": bool}  # the model's parameters
    {"kind": "update", "update": k, "grad_norm": float | None, "grad_finite": bool | None,
     "hash": [int per parameter]}                # every `interval` optimizer steps

`judge` turns them into findings, one per check (`CHECKS`), each with its numbers; `series`
into the curves a chart shows. Pure: `muster.diagnostics.read_rank_records` reads the files.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import combinations
from typing import Any, cast

from muster.words import count, rank_list

__all__ = ["CHECKS", "Bounds", "Finding", "RankRecords", "judge", "parse_records", "series"]

CHECKS = ("sampler_overlap", "rank_seeds", "grad_norm_spread", "replica_hash",
          "finite_all_ranks", "sample_balance", "epoch_order")
SPREAD_WINDOW = 5  # samples in the running median of the gradient-norm spread
MAX_COMPARED_RANKS = 64  # pairwise overlaps are computed for this many ranks at most
SEED_HINT = ("a sampler seeded identically on every rank? pass "
             "generator=torch.Generator().manual_seed(seed + rank), or partition the data "
             "with a DistributedSampler")


@dataclass(frozen=True)
class Bounds:
    """The thresholds (`diagnostics` in the experiment config)."""

    overlap: float = 0.5
    spread: float = 0.5
    ratio: float = 20.0
    imbalance: float = 1.2

    @classmethod
    def of(cls, config: Any) -> Bounds:
        """The bounds a `DiagnosticsConfig` sets."""
        return cls(overlap=config.overlap_bound, spread=config.spread_bound,
                   ratio=config.ratio_bound, imbalance=config.imbalance_bound)


# A record as read: a JSON object, checked only for the keys that place it (its kind's
# number, a pass's indices and count); every other value is checked where it is judged.
Line = dict[str, object]


@dataclass
class RankRecords:
    """What one rank recorded, by kind."""

    samplers: dict[int, Line] = field(default_factory=dict)
    passes: dict[tuple[int, int], Line] = field(default_factory=dict)
    params: list[str] | None = None
    replicated: bool = False
    updates: dict[int, Line] = field(default_factory=dict)


@dataclass(frozen=True)
class Finding:
    """One check's outcome: `found` is True when it found a problem."""

    check: str
    found: bool
    detail: str


def parse_records(lines: Iterable[Mapping[str, Any]]) -> RankRecords:
    """One rank's records; a malformed one is skipped (the file is the harness's, but a
    script could write there too)."""
    records = RankRecords()
    for line in lines:
        kind = line.get("kind")
        if kind == "sampler" and _is_int(line.get("sampler")):
            records.samplers[line["sampler"]] = _sampler(line)
        elif kind == "pass" and _is_int(line.get("sampler")) and _is_int(line.get("pass")) \
                and isinstance(line.get("indices"), list) and _is_int(line.get("count")):
            records.passes[(line["sampler"], line["pass"])] = dict(line)
        elif kind == "params" and isinstance(line.get("names"), list):
            records.params = [str(name) for name in line["names"]]
            records.replicated = line.get("replicated") is True
        elif kind == "update" and _is_int(line.get("update")):
            records.updates[line["update"]] = dict(line)
    return records


def _indices(record: Line) -> list[Any]:
    return cast(list[Any], record["indices"])  # a list: `parse_records` keeps no other pass


def _drawn(record: Line) -> int:
    return cast(int, record["count"])  # an int: `parse_records` keeps no other pass


def _sampler(line: Mapping[str, Any]) -> Line:
    """A sampler record with its seeds as ints or None and its data set as plain text, so
    a judgement compares and hashes them safely whatever the file held."""
    dataset = line.get("dataset")
    return {**line,
            "generator_seed": line["generator_seed"] if _is_int(line.get("generator_seed"))
            else None,
            "torch_initial": line["torch_initial"] if _is_int(line.get("torch_initial"))
            else None,
            "dataset": repr(dataset)[:200] if dataset is not None else None}


def judge(ranks: Mapping[int, RankRecords], bounds: Bounds,
          reported_non_finite: Mapping[int, str] | None = None) -> list[Finding]:
    """A finding per check that has something to judge, in `CHECKS` order.

    `reported_non_finite` names, per rank, the first non-finite metric it reported (from
    its metrics file), for `finite_all_ranks`.
    """
    several = len(ranks) > 1
    findings = [
        _sampler_overlap(ranks, bounds.overlap) if several else None,
        _rank_seeds(ranks) if several else None,
        _grad_norm_spread(ranks, bounds) if several else None,
        _replica_hash(ranks) if several else None,
        _finite_all_ranks(ranks, reported_non_finite or {}),
        _sample_balance(ranks, bounds.imbalance) if several else None,
        _epoch_order(ranks),
    ]
    return [f for f in findings if f is not None]


def series(ranks: Mapping[int, RankRecords]) -> dict[str, list[list[float]]]:
    """Curves for a chart: the gradient-norm spread per sampled update, and the largest
    share of the same samples two ranks drew, per pass."""
    spread = [[update, value] for update, norms in _norms_by_update(ranks)
              if (value := _spread(norms)) is not None]
    overlap = []
    for key in _shared_passes(ranks):
        found = _worst_overlap(ranks, key)
        if found is not None:
            overlap.append([key[1], found[0]])
    return {"grad_norm_spread": spread, "sampler_overlap": overlap}


# --- sampler overlap ----------------------------------------------------------------------


def _sampler_overlap(ranks: Mapping[int, RankRecords], bound: float) -> Finding | None:
    keys = _shared_passes(ranks)
    if not keys:
        return None
    worst: tuple[float, tuple[int, int], tuple[int, int]] | None = None  # share, ranks, key
    flagged = []
    for key in keys:
        found = _worst_overlap(ranks, key)
        if found is None:
            continue
        share, pair = found
        if worst is None or share > worst[0]:
            worst = (share, pair, key)
        if share > bound:
            flagged.append((key, share, pair))
    if worst is None:
        return None
    if not flagged:
        return Finding("sampler_overlap", False,
                       f"{count(len(keys), 'pass', 'passes')} compared: at most "
                       f"{_percent(worst[0])} of the samples shared by two ranks "
                       f"(ranks {worst[1][0]} and {worst[1][1]})")
    key, share, (a, b) = flagged[0]
    kind = ranks[a].samplers.get(key[0], {}).get("type", "sampler")
    more = f" (and in {count(len(flagged) - 1, 'more pass', 'more passes')})" \
        if len(flagged) > 1 else ""
    return Finding("sampler_overlap", True,
                   f"{_epoch_name(ranks[a], key)}: ranks {a} and {b} drew {_percent(share)} the "
                   f"same samples from their {kind}{more} — {SEED_HINT}")


def _shared_passes(ranks: Mapping[int, RankRecords]) -> list[tuple[int, int]]:
    """The (sampler, pass) keys at least two ranks recorded, in order."""
    counted: dict[tuple[int, int], int] = {}
    for records in ranks.values():
        for key in records.passes:
            counted[key] = counted.get(key, 0) + 1
    return sorted(key for key, n in counted.items() if n > 1)


def _worst_overlap(ranks: Mapping[int, RankRecords], key: tuple[int, int]
                   ) -> tuple[float, tuple[int, int]] | None:
    """The largest share of the same samples two ranks drew in a pass, and the ranks."""
    having = sorted(r for r, records in ranks.items() if key in records.passes)
    having = having[:MAX_COMPARED_RANKS]
    worst: tuple[float, tuple[int, int]] | None = None
    for a, b in combinations(having, 2):
        if _dataset(ranks[a], key[0]) != _dataset(ranks[b], key[0]):
            continue  # each rank reads its own data: their indices are not comparable
        share = _shared(_indices(ranks[a].passes[key]), _indices(ranks[b].passes[key]))
        if share is not None and (worst is None or share > worst[0]):
            worst = (share, (a, b))
    return worst


def _dataset(records: RankRecords, sampler: int) -> Any:
    return records.samplers.get(sampler, {}).get("dataset")


def _shared(first: Sequence[Any], second: Sequence[Any]) -> float | None:
    """The share of the same samples in two ranks' draws. Without repeats (a permutation,
    a partition) it is the overlap of the sets; with repeats (replacement=True) two
    independent draws share many samples by chance, so it is the share of positions where
    both drew the same sample: near 0 unless they draw the same sequence."""
    n = min(len(first), len(second))
    if n == 0:
        return None
    hashable_a, hashable_b = _hashables(first[:n]), _hashables(second[:n])
    if len(set(hashable_a)) < n or len(set(hashable_b)) < n:
        same = sum(1 for x, y in zip(hashable_a, hashable_b, strict=True) if x == y)
        return same / n
    return len(set(hashable_a) & set(hashable_b)) / n


def _hashables(values: Sequence[Any]) -> list[Any]:
    return [v if isinstance(v, int | str) else repr(v) for v in values]


# --- seeds --------------------------------------------------------------------------------


def _rank_seeds(ranks: Mapping[int, RankRecords]) -> Finding | None:
    """Samplers that draw randomly from the whole data set (not partitioned by rank) must
    draw with a different seed on each rank."""
    ids = sorted({n for records in ranks.values() for n in records.samplers})
    if not ids:
        return None
    checked = 0
    for number in ids:
        described = {rank: records.samplers[number] for rank, records in sorted(ranks.items())
                     if number in records.samplers}
        random = [d for d in described.values() if d.get("random") and not d.get("partitioned")]
        if len(described) < 2 or not random:
            continue
        checked += 1
        by_seed: dict[Any, list[int]] = {}
        for rank, description in described.items():
            by_seed.setdefault(_effective_seed(description), []).append(rank)
        alike = next(((seed, rs) for seed, rs in by_seed.items() if len(rs) > 1 and
                      seed is not None), None)
        if alike is not None:
            seed, same = alike
            kind = random[0].get("type", "sampler")
            source = ("its generator's" if random[0].get("generator_seed") is not None
                      else "torch's global seed: the sampler has no generator")
            return Finding("rank_seeds", True,
                           f"{rank_list(same)} draw their {kind} with the same seed {seed} "
                           f"({source}) — {SEED_HINT}")
    if checked == 0:
        return Finding("rank_seeds", False, "no sampler draws randomly from the whole data set "
                                            "(each partitions it by rank, or does not shuffle)")
    return Finding("rank_seeds", False,
                   f"{count(checked, 'random sampler')}: each rank draws with its own seed")


def _effective_seed(description: Mapping[str, Any]) -> Any:
    seed = description.get("generator_seed")
    return seed if seed is not None else description.get("torch_initial")


# --- gradients ----------------------------------------------------------------------------


def _norms_by_update(ranks: Mapping[int, RankRecords]
                     ) -> list[tuple[int, dict[int, float]]]:
    """Per update every rank sampled, each rank's finite local gradient norm."""
    common = set.intersection(*(set(r.updates) for r in ranks.values())) if ranks else set()
    found = []
    for update in sorted(common):
        norms: dict[int, float] = {}
        for rank, records in ranks.items():
            value = records.updates[update].get("grad_norm")
            if isinstance(value, int | float) and math.isfinite(value):
                norms[rank] = float(value)
        if len(norms) == len(ranks):
            found.append((update, norms))
    return found


def _spread(norms: Mapping[int, float]) -> float | None:
    mean = statistics.fmean(norms.values())
    return statistics.pstdev(norms.values()) / mean if mean > 0 else None


def _grad_norm_spread(ranks: Mapping[int, RankRecords], bounds: Bounds) -> Finding | None:
    samples = _norms_by_update(ranks)
    if not samples:
        return None
    spreads = [(update, s) for update, norms in samples if (s := _spread(norms)) is not None]
    for update, norms in samples:
        low, high = min(norms.values()), max(norms.values())
        if (low > 0 and high / low >= bounds.ratio) or low == 0 < high:
            out = _outlier(norms)
            others = ", ".join(f"rank {r}'s {v:.4g}" for r, v in sorted(norms.items())
                               if r != out)
            ratio = "" if low == 0 else f", {high / low:.0f}x apart"
            return Finding("grad_norm_spread", True,
                           f"update {update}: rank {out}'s local gradient norm was "
                           f"{norms[out]:.4g} against {others}{ratio} (bound "
                           f"{bounds.ratio:g}x) — does that rank get other data or inputs on "
                           "another scale?")
    running = [(spreads[i + SPREAD_WINDOW - 1][0],
                statistics.median(s for _, s in spreads[i:i + SPREAD_WINDOW]))
               for i in range(len(spreads) - SPREAD_WINDOW + 1)]
    jump = next(((update, s) for update, s in running if s > bounds.spread), None)
    typical = statistics.median(s for _, s in spreads) if spreads else 0.0
    if jump is not None:
        return Finding("grad_norm_spread", True,
                       f"by update {jump[0]} the std of the ranks' local gradient norms was "
                       f"{jump[1]:.2f} of their mean over {SPREAD_WINDOW} samples (bound "
                       f"{bounds.spread:g}; typical here {typical:.2f}) — ranks training on "
                       "different subsets of the data?")
    return Finding("grad_norm_spread", False,
                   f"{count(len(samples), 'sample')}: the std of the ranks' local gradient "
                   f"norms was {typical:.2f} of their mean (median), at most "
                   f"{max(s for _, s in spreads) if spreads else 0.0:.2f}")


def _outlier(norms: Mapping[int, float]) -> int:
    """The rank whose norm stands out: of two, the larger; of more, the farthest from the
    median (on a log scale)."""
    if len(norms) <= 2:
        return max(norms, key=lambda r: norms[r])
    middle = math.log(max(statistics.median(norms.values()), 1e-300))
    return max(norms, key=lambda r: abs(math.log(max(norms[r], 1e-300)) - middle))


def _replica_hash(ranks: Mapping[int, RankRecords]) -> Finding | None:
    """Replicas (DDP) hold the same parameters after every step."""
    if not all(r.replicated and r.params for r in ranks.values()):
        return None
    names = next(iter(ranks.values())).params or []
    if any(r.params != names for r in ranks.values()):
        return Finding("replica_hash", False, "the ranks hold different parameters (not "
                                              "replicas of one model): not compared")
    common = sorted(set.intersection(*(set(r.updates) for r in ranks.values())))
    compared = 0
    for update in common:
        hashes: dict[int, list[Any]] = {}
        for rank, records in ranks.items():
            values = records.updates[update].get("hash")
            if isinstance(values, list) and len(values) == len(names):
                hashes[rank] = values
        if len(hashes) < len(ranks):
            continue
        compared += 1
        reference_rank = min(hashes)
        reference = hashes[reference_rank]
        for rank, values in sorted(hashes.items()):
            differing = [names[i] for i, (x, y) in enumerate(zip(reference, values, strict=True))
                         if x != y]
            if differing:
                return Finding("replica_hash", True,
                               f"update {update}: rank {rank}'s {differing[0]} differs from "
                               f"rank {reference_rank}'s after DDP's sync "
                               f"({count(len(differing), 'parameter')} of {len(names)} "
                               "differ) — a parameter changed on one rank outside the "
                               "all-reduced step?")
    if compared == 0:
        return None
    return Finding("replica_hash", False, f"{count(compared, 'sample')} of "
                                          f"{count(len(names), 'parameter')}: every rank "
                                          "held the same values")


def _finite_all_ranks(ranks: Mapping[int, RankRecords],
                      reported: Mapping[int, str]) -> Finding | None:
    first: dict[int, str] = dict(reported)
    sampled = 0
    for rank, records in ranks.items():
        for update, record in sorted(records.updates.items()):
            if record.get("grad_finite") is None:
                continue
            sampled += 1
            if record["grad_finite"] is False:
                note = f"its local gradient was not finite at update {update}"
                first[rank] = f"{first[rank]}; {note}" if rank in first else note
                break
    if not first and sampled == 0:
        return None
    if first:
        listed = "; ".join(f"rank {rank}: {what}" for rank, what in sorted(first.items()))
        clean = sorted(set(ranks) - set(first))
        rest = f"; finite on {rank_list(clean)}" if clean else ""
        return Finding("finite_all_ranks", True, f"{listed}{rest}")
    return Finding("finite_all_ranks", False,
                   f"every rank's local gradients ({count(sampled, 'sample')}) and reported "
                   "metrics were finite")


# --- data ---------------------------------------------------------------------------------


def _sample_balance(ranks: Mapping[int, RankRecords], bound: float) -> Finding | None:
    keys = [key for key in _shared_passes(ranks)
            if all(key in r.passes and r.passes[key].get("complete") for r in ranks.values())]
    if not keys:
        return None
    for key in keys:
        counts = {rank: _drawn(records.passes[key]) for rank, records in ranks.items()}
        low_rank = min(counts, key=lambda r: counts[r])
        high_rank = max(counts, key=lambda r: counts[r])
        low, high = counts[low_rank], counts[high_rank]
        if (low == 0 and high > 0) or (low > 0 and high / low > bound):
            factor = "all of them" if low == 0 else f"{high / low:.2f}x"
            return Finding("sample_balance", True,
                           f"{_epoch_name(ranks[high_rank], key)}: rank {high_rank} drew "
                           f"{high:,} samples, rank {low_rank} {low:,} ({factor}; bound "
                           f"{bound:g}x): with a loss averaged on each rank, each of rank "
                           f"{low_rank}'s samples weighs more — give every rank as many "
                           "samples per step, or average the loss over all ranks' samples")
    return Finding("sample_balance", False,
                   f"{count(len(keys), 'pass', 'passes')}: the ranks drew within {bound:g}x of "
                   "each other")


def _epoch_order(ranks: Mapping[int, RankRecords]) -> Finding | None:
    """A shuffling sampler that yields the same order in consecutive passes was not told
    the epoch (DistributedSampler.set_epoch)."""
    compared = 0
    for rank, records in sorted(ranks.items()):
        for (number, index), record in sorted(records.passes.items()):
            described = records.samplers.get(number, {})
            previous = records.passes.get((number, index - 1))
            if not described.get("random") or previous is None or len(_indices(record)) < 2:
                continue
            compared += 1
            if previous.get("complete") and previous["indices"] == record["indices"]:
                hint = ("call sampler.set_epoch(epoch) before each epoch"
                        if described.get("partitioned") else
                        "draw each epoch with a new seed")
                return Finding("epoch_order", True,
                               f"rank {rank}'s {described.get('type', 'sampler')} yielded the "
                               f"same order in passes {index - 1} and {index} — {hint}")
    if compared == 0:
        return None
    return Finding("epoch_order", False,
                   f"{count(compared, 'pass', 'passes')} after the first: a new order each time")


# --- words --------------------------------------------------------------------------------


def _epoch_name(records: RankRecords, key: tuple[int, int]) -> str:
    epoch = records.passes.get(key, {}).get("epoch")
    return f"pass {key[1]}" + (f" (sampler epoch {epoch})" if _is_int(epoch) else "")


def _percent(share: float) -> str:
    return f"{share * 100:.0f}%" if share * 100 >= 1 or share == 0 else f"{share * 100:.2f}%"


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
