#!/usr/bin/env bash
# Saturated whole-run check of br0 default-change candidates (issue 26's gate for a
# candidate from issue 27's capacity cells): per workload and G, jsq, br0 (the default),
# br0 with ageing off (off) and each candidate, 4 paired windows of 1,000 requests, as
# research/policy/matrix.sh. Assemble with research/policy/lead_assemble.py (whole-run gain
# over jsq, its ratio to off's, TTFT P95 vs jsq, the fairness rule's realised P99 / max).
# Usage: research/policy/candidates_matrix.sh OUT_DIR TRACE_DIR SHARED_TRACES
#   CANDIDATES="name:opt=v[,opt=v] ..." (default "ttft5:ttft_budget_s=5"), GS, WORKLOADS, JOBS,
#   REPLAYS (windows, default 4), SEED (which random windows, default 0), LIMIT (requests
#   per window, default 1000), SPLIT=1 (run
#   through research/policy/fill_split.py: the fairness excess split at the start-up fill)
set -euo pipefail
out=$1; syn=$2; tr=$3
py=${PYTHON:-.venv/bin/python}
mkdir -p "$out"
# shellcheck source=research/policy/traces.sh
. "$(dirname "$0")/traces.sh"
pols="jsq,br0,off=br0"; opts=(--policy-option off.max_wait_beyond_fcfs_s=None --policy-option off.ttft_budget_s=None)
for c in ${CANDIDATES:-ttft5:ttft_budget_s=5}; do
  name=${c%%:*}; pols="$pols,$name=br0"
  IFS=, read -r -a kvs <<< "${c#*:}"
  for kv in "${kvs[@]}"; do opts+=(--policy-option "$name.$kv"); done
done
entry=(-m br_serve.cli)
[ "${SPLIT:-0}" = 1 ] && entry=("$(dirname "$0")/fill_split.py")
for g in ${GS:-8 16}; do
  for w in ${WORKLOADS:-mooncake azure_conv chat_rag reasoning r1}; do
    d=$out/${w}_g$g
    [ -f "$d/summary.json" ] && continue
    echo "== ${w}_g$g ($(uptime))" >&2
    # shellcheck disable=SC2086
    nice -n 19 "$py" "${entry[@]}" sim ${TRACES[$w]} --sim-saturated --limit "${LIMIT:-1000}" \
      --replays "${REPLAYS:-4}" --seed "${SEED:-0}" --replicas "$g" --jobs "${JOBS:-3}" \
      --no-plots --out "$d" \
      --policies "$pols" "${opts[@]}" > "$d.log" 2>&1 || echo "failed $d" >&2
  done
done
