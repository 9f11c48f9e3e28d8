"""`adaptive_asha`: several ASHA brackets at once (Optuna's HyperbandPruner), so a slow
starter is not always judged at the earliest rung. Bracket b begins judging at the rung
b (b = 0 is plain ASHA); each trial is assigned one bracket. `mode` sets how many:
aggressive 1, standard ceil(max_rungs / 2), conservative max_rungs."""

from __future__ import annotations

import math

from optuna.pruners import BasePruner, HyperbandPruner

from muster.search.asha import Asha


class AdaptiveAsha(Asha):
    name = "adaptive_asha"

    def brackets(self) -> int:
        rungs = self.config.max_rungs
        return {"aggressive": 1, "standard": math.ceil(rungs / 2),
                "conservative": rungs}[self.config.mode]

    def pruner(self) -> BasePruner:
        low, divisor = self.min_resource(), self.config.divisor
        return HyperbandPruner(min_resource=low, max_resource=self._max_resource(low),
                               reduction_factor=divisor)

    def _max_resource(self, low: int) -> int:
        """The max_resource for which HyperbandPruner makes `brackets()` brackets: it makes
        floor(log(max / min, divisor)) + 1, and floating point may round the exact power
        down, so the first value from the power up that gives the count is taken."""
        want, divisor = self.brackets(), self.config.divisor
        high: int = low * divisor ** (want - 1)
        while math.floor(math.log(high / low, divisor)) + 1 < want:
            high += 1
        return high
