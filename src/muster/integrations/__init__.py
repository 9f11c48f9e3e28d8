"""muster for the frameworks scripts train with: their own state, mapped onto the harness.

- `lightning`: PyTorch Lightning 2.x (`lightning.pytorch` and `pytorch_lightning`): a
  callback and a logger.
- `transformers`: the Hugging Face `Trainer`'s callback.
- `accelerate`: Accelerate's tracker and `save_state`/`load_state` hooks.
- `session`: what they share: the harness context they open (or join), metric names and
  values made reportable, and the rule that an integration never breaks a script.
- `autohook`: `integrations: auto` — the import hook the trial's environment installs, so a
  script that uses a framework gets its callback without a line changed.

Each module imports its framework only when used: importing `muster.integrations` is cheap.
"""
