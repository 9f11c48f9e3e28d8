#!/usr/bin/env bash
# `make demo`: start muster on its embedded SQLite store, write the digits data set as PNG
# files, and run a hyperparameter search on the digits MLP (examples/digits/search.yaml:
# adaptive ASHA, 24 trials, 2 at a time, each verified by muster). Follow it live until it
# ends, show the best trial, then stop the server. Exits 0 only if the search COMPLETED.
# MUSTER_DEMO_SUSPECT=1 also runs the silent-drop example, which must end SUSPECT.
# MUSTER_DEMO_BIAS=1 also runs the coded-bias example both ways (examples/digits/bias.py):
# bias.yaml must end SUSPECT naming the ranks' shared samples, bias-fixed.yaml SUCCEEDED.
# The server listens on MUSTER_DEMO_PORT, else on a port free at the start (it prints its URL:
# open it for the web UI while the demo runs).
set -euo pipefail
cd "$(dirname "$0")/.."
export MUSTER_HOME="${MUSTER_HOME:-$PWD/.muster-demo}"
free_port='import socket
with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    print(s.getsockname()[1])'
port="${MUSTER_DEMO_PORT:-$(.venv/bin/python -c "$free_port")}"
export MUSTER_URL="http://127.0.0.1:$port"
muster=.venv/bin/muster
field() { .venv/bin/python -c "import json, sys; print(json.load(sys.stdin)$1)"; }
ending='import json, sys
exp = json.load(sys.stdin)
best, early = exp["search"]["best"], sum(t["early_stopped"] for t in exp["trials"])
print("the digits search (experiment %d) ended %s: %d trials, %d stopped early by ASHA"
      % (exp["id"], exp["state"], len(exp["trials"]), early)
      + ("" if best is None else "; best %s %.4f in trial %d"
         % (best["metric"], best["value"], best["trial_id"])))'

.venv/bin/python examples/digits/prepare_data.py --corrupt 0.12
$muster up --detach --port "$port" --min-free-disk 100MiB
trap '$muster down' EXIT

experiment=$($muster experiment create examples/digits/search.yaml examples/digits --json \
             | field '["id"]')
$muster experiment watch "$experiment" || true    # its exit status is read from the state below
$muster experiment best "$experiment" || true     # none when no trial succeeded
state=$($muster experiment describe "$experiment" --json | field '["state"]')

if [[ "${MUSTER_DEMO_SUSPECT:-0}" == 1 ]]; then
  $muster experiment create examples/digits/experiment-corrupt.yaml examples/digits --wait \
    || true
fi
bias_ok=1
if [[ "${MUSTER_DEMO_BIAS:-0}" == 1 ]]; then
  verdict='import json, sys
trial = json.load(sys.stdin)["trials"][0]
print(trial["id"], trial["state"])
for check in trial["verification"]["checks"]:
    if check["name"].startswith("diagnostics.") and not check["passed"]:
        print("  %s: %s" % (check["name"], check["detail"]))'
  for config in bias bias-fixed; do
    id=$($muster experiment create "examples/digits/$config.yaml" examples/digits --json \
         | field '["id"]')
    $muster experiment watch "$id" >/dev/null || true
    result=$($muster experiment describe "$id" --json | .venv/bin/python -c "$verdict")
    echo "$config.yaml: trial $result"
    want=SUSPECT; [[ "$config" == bias-fixed ]] && want=SUCCEEDED
    [[ "$(head -1 <<<"$result" | cut -d' ' -f2)" == "$want" ]] || bias_ok=0
  done
fi
line=$($muster experiment describe "$experiment" --json | .venv/bin/python -c "$ending")
$muster down
trap - EXIT
echo "$line"
[[ "$state" == COMPLETED && "$bias_ok" == 1 ]]
