"""The Ray Tune side of benchmarks/tune_peer.py: `python tune_trivial.py N SEED [reuse]` runs N
trivial trials as a Ray Tune search on a fresh local Ray of 2 CPUs, 2 at a time, and
prints one JSON line: the seconds `Tuner.fit()` took, `ray.init` took, and the trials
that ended TERMINATED with their metric. Run in a loopback-only network namespace (Ray
picks the machine's external address otherwise), as tune_peer.py does.

Each trial is what a user's trivial trainable is: a function reporting one metric from
its one hyperparameter (`tune.report`), one CPU each, the search drawing `x` at random,
like muster's `random` searcher on the other side. With `reuse`, `reuse_actors=True`.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time

import ray
from ray import tune


def trainable(config: dict[str, float]) -> None:
    tune.report({"loss": (config["x"] - 0.3) ** 2})


def main() -> int:
    trials, seed = int(sys.argv[1]), int(sys.argv[2])
    reuse = len(sys.argv) > 3 and sys.argv[3] == "reuse"
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="muster-bench-tune-") as storage:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
                 _temp_dir=f"{storage}/ray")
        up = time.perf_counter()
        tuner = tune.Tuner(
            tune.with_resources(trainable, {"cpu": 1}),
            param_space={"x": tune.uniform(0.0, 1.0)},
            tune_config=tune.TuneConfig(num_samples=trials, max_concurrent_trials=2,
                                        reuse_actors=reuse,
                                        metric="loss", mode="min",
                                        search_alg=tune.search.BasicVariantGenerator(
                                            random_state=seed)),
            run_config=tune.RunConfig(storage_path=f"{storage}/results", verbose=0))
        fit_start = time.perf_counter()
        results = tuner.fit()
        fit_s = time.perf_counter() - fit_start
        ended = [r for r in results if r.error is None and "loss" in (r.metrics or {})]
        ray.shutdown()
    print(json.dumps({"fit_s": fit_s, "init_s": up - started, "trials": len(results),
                      "ended": len(ended), "total_s": time.perf_counter() - started}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
