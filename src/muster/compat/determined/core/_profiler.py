"""`core_context.profiler`: Determined's system-metrics sampler, which reports to its master.
muster records what a trial's ranks run on itself (each rank's snapshot), and its training
dynamics with the config's `diagnostics`."""

from __future__ import annotations

from .._unprovided import unprovided


class ProfilerContext:
    def on(self, sampling_interval: int = 1, samples_per_report: int = 10) -> None:
        raise unprovided("ProfilerContext.on", "muster records what each rank runs on itself "
                         "(its snapshot.json) and training dynamics with the config's "
                         "`diagnostics`")

    def off(self) -> None:
        """Nothing to stop: `on` starts nothing."""
