#!/usr/bin/env bash
# `make demo`: start muster on its embedded SQLite store, write the digits data set as PNG
# files, run the example experiment with the harness (metrics, samples, checkpoints), follow
# its log live, and show how it ended and what muster verified. Then stop the server.
# MUSTER_DEMO_SUSPECT=1 also runs the silent-drop example, which must end SUSPECT.
set -euo pipefail
cd "$(dirname "$0")/.."
export MUSTER_HOME="${MUSTER_HOME:-$PWD/.muster-demo}"
port="${MUSTER_DEMO_PORT:-8765}"
export MUSTER_URL="http://127.0.0.1:$port"
muster=.venv/bin/muster
first_trial() { .venv/bin/python -c 'import json, sys; print(json.load(sys.stdin)["trials"][0]["id"])'; }

.venv/bin/python examples/digits/prepare_data.py --corrupt 0.12
$muster up --detach --port "$port" --min-free-disk 100MiB
trap '$muster down' EXIT

trial=$($muster experiment create examples/digits/experiment.yaml examples/digits --json | first_trial)
$muster trial logs "$trial" --follow
$muster trial describe "$trial"
$muster trial metrics "$trial" --kind validation --tail 5
state=$($muster trial describe "$trial" --json | .venv/bin/python -c 'import json, sys; print(json.load(sys.stdin)["state"])')

if [[ "${MUSTER_DEMO_SUSPECT:-0}" == 1 ]]; then
  $muster experiment create examples/digits/experiment-corrupt.yaml examples/digits --wait \
    || true
fi
$muster experiment list
echo "the digits trial ended $state"
[[ "$state" == SUCCEEDED ]]
