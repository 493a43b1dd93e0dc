#!/usr/bin/env bash
# Issue 26, session 2: fairness variants of br0 (slack, factor) on the saturated matrix.
# Saturated whole-run cells, 4 paired windows of 1,000 requests, G in $GS, workloads in
# $WORKLOADS; policies: jsq, br0 with ageing off, and the br0 variants in $VARIANTS
# (default: the selection set below; NO_OFF=1 leaves ageing off out, for a rerun whose
# cells lead_assemble.py merges with an earlier one's). Usage:
#   research/policy/lead_matrix.sh OUT_DIR TRACE_DIR SHARED_TRACES
# Selection (choose the default on them): r1, chat_rag, reasoning at G = 8 (the cells
# whose bound was missed by the most); the rest of the matrix checks the choice.
set -euo pipefail
out=$1; syn=$2; tr=$3
py=${PYTHON:-.venv/bin/python}
mkdir -p "$out"
# shellcheck source=research/policy/traces.sh
. "$(dirname "$0")/traces.sh"
# name=factor:slack (factor x FCFS wait + slack s). The slot-wait lead and the cold
# start (lead:cold fields) were measured at commits 41c352e / bea9d20 and removed.
VARIANTS=${VARIANTS:-"f2s120l0=2:120 f2s30l0=2:30"}
if [ -n "${NO_OFF:-}" ]; then pols="jsq"; opts=(); else
  pols="jsq,off=br0"; opts=(--policy-option off.max_wait_beyond_fcfs_s=None --policy-option off.ttft_budget_s=None); fi
for v in $VARIANTS; do
  name=${v%%=*}; IFS=: read -r f s <<< "${v#*=}"
  pols="$pols,$name=br0"
  opts+=(--policy-option "$name.fcfs_wait_factor=$f" --policy-option "$name.max_wait_beyond_fcfs_s=$s")
done
for g in ${GS:-8}; do
  for w in ${WORKLOADS:-r1 chat_rag reasoning}; do
    d=$out/${w}_g$g
    [ -f "$d/summary.json" ] && continue
    # shellcheck disable=SC2086
    nice -n 19 "$py" -m br_serve.cli sim ${TRACES[$w]} --sim-saturated --limit 1000 \
      --replays "${REPLAYS:-4}" --replicas "$g" --jobs "${JOBS:-2}" --no-plots --out "$d" \
      --policies "$pols" "${opts[@]}" > "$d.log" 2>&1 || echo "failed $d"
  done
done
