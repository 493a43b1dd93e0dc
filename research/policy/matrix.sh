#!/usr/bin/env bash
# Saturated G=8/16 whole-run matrix for issue 26: jsq, br0 (default), br0 with the
# previous default (absolute 30 s beyond FCFS), br0 with ageing off; 4 paired windows
# of 1,000 requests. Usage: research/policy/matrix.sh OUT_DIR TRACE_DIR SHARED_TRACES
set -euo pipefail
out=$1; syn=$2; tr=$3
py=${PYTHON:-.venv/bin/python}
mkdir -p "$out"
# shellcheck source=research/policy/traces.sh
. "$(dirname "$0")/traces.sh"
for g in ${GS:-8 16}; do
  for w in ${WORKLOADS:-mooncake azure_conv chat_rag reasoning r1}; do
    d=$out/${w}_g$g
    [ -f "$d/summary.json" ] && continue
    # shellcheck disable=SC2086
    nice -n 10 "$py" -m br_serve.cli sim ${TRACES[$w]} --sim-saturated --limit 1000 \
      --replays 4 --replicas "$g" --jobs 2 --no-plots --out "$d" \
      --policies jsq,br0,abs30=br0,off=br0 \
      --policy-option abs30.fcfs_wait_factor=1 --policy-option abs30.max_wait_beyond_fcfs_s=30 \
      --policy-option off.max_wait_beyond_fcfs_s=None --policy-option off.ttft_budget_s=None > "$d.log" 2>&1 || echo "failed $d"
  done
done
