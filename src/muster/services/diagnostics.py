"""A trial's coded-bias diagnostics as the API shows them: what each check finds now and
the series behind them, from the harness's files of the trial's latest attempt (issue 17;
`muster.diagnostics.bias` judges, this module only reads and assembles)."""

from __future__ import annotations

from pathlib import Path

from muster import api
from muster.diagnostics import bias, read_rank_records
from muster.services.experiments import trial_or_404
from muster.store import Store
from muster.store.configs import experiment_config

__all__ = ["trial_diagnostics"]


def trial_diagnostics(store: Store, trial_id: int) -> api.TrialDiagnostics:
    """`{attempt, ranks, findings: [{check, found, detail, mode}], series}` of the trial's
    latest attempt that ran (a warm standby's is skipped); `attempt` null and the rest
    empty before one ran. `series` holds `grad_norm_spread` ([update, std/mean]) and
    `sampler_overlap` ([pass, the largest share of the same samples two ranks drew]).

    Raises:
        NotFound: no such trial.
    """
    with store.session_scope() as s:
        trial = trial_or_404(s, trial_id)
        config = experiment_config(trial.experiment).diagnostics
        ran = sorted((a for a in trial.attempts if not a.standby), key=lambda a: a.number)
        attempt = (ran[-1].number, Path(ran[-1].run_dir)) if ran else None
    if attempt is None:
        return {"attempt": None, "ranks": [], "findings": [],
                "series": {"grad_norm_spread": [], "sampler_overlap": []}}
    records = read_rank_records(attempt[1])
    findings = bias.judge(records, bias.Bounds.of(config))
    return {
        "attempt": attempt[0],
        "ranks": sorted(records),
        "findings": [{"check": f"diagnostics.{f.check}", "found": f.found, "detail": f.detail,
                      "mode": getattr(config, f.check)} for f in findings],
        "series": bias.series(records),
    }

