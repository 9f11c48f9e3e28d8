"""Per-experiment Python environments: a trial's own interpreter and packages.

```
$MUSTER_HOME/envs/<hash>                    -> store/<hash>-<nonce>: published = built (a link)
$MUSTER_HOME/envs/store/<hash>-<nonce>/     a venv built by uv; .muster/ holds its record
$MUSTER_HOME/envs/requests/<hash>.json      what to build (written at submission)
$MUSTER_HOME/envs/logs/<hash>.log           the build's output; .stage, .result.json beside it
$MUSTER_HOME/envs/locks/<hash>.lock         held (flock) by the one process building it
$MUSTER_HOME/envs/harness/muster            -> muster's own package: `import muster.harness`
$MUSTER_HOME/envs/runtime/current           -> <key>-<nonce>/: the runtime base (links)
$MUSTER_HOME/runs/<trial>/env/              the trial's own layer over it (`layers`)
```

- `request`: what an experiment's `environment:` block asks for, and its content hash.
- `interpreters`: the facts of a base interpreter (version, site-packages, packages).
- `layers`: a venv layered over lower ones (the trial's own; inherited packages).
- `runtime_plan`, `runtime_base`: what a trial without an environment block imports (muster's
  installation less muster's own dependencies), and building and publishing it.
- `build`: the build itself, in a child process (`python -m muster.environments.build`).
- `registry`: the server's view: which are built, building or failed; list and prune.
"""

from muster.environments.layout import EnvHome

__all__ = ["EnvHome"]
