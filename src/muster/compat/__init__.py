"""Other platforms' training APIs, served by muster: what a trial imports under their names.

Each subpackage is muster's own code, written from the platform's public documentation, and
imports under the platform's name once this directory is on the trial's `sys.path`
(`muster.startup` puts it first for `compat: <name>`):

- `determined`: Determined's Core API (`import determined as det`; `det.core.init()`), over
  `muster.harness` (docs/how-to/coming-from-determined.md).

Nothing here is imported by `import muster`.
"""
