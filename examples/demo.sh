#!/usr/bin/env bash
# `make demo`: start muster on its embedded SQLite store, submit the bundled example,
# follow its log live, print how it ended, and stop the server again.
set -euo pipefail
cd "$(dirname "$0")/.."
export MUSTER_HOME="${MUSTER_HOME:-$PWD/.muster-demo}"
export MUSTER_URL="http://127.0.0.1:${MUSTER_DEMO_PORT:-8765}"
muster=.venv/bin/muster

$muster up --detach --port "${MUSTER_DEMO_PORT:-8765}"
trap '$muster down' EXIT
status=0
$muster experiment create examples/digits/digits.yaml examples/digits --follow --wait || status=$?
$muster experiment list
exit "$status"
