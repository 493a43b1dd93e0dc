#!/usr/bin/env bash
# The field's rules as simulator policies, a first look (docs/core.md, "The field's
# rules"): a stationary saturated ensemble (K = 8) and the capacity at the SLO of
# docs/results.md (K = 8) of every field rule, DyntraLB under jsq and under
# sglang_total_tokens, and br0, at G = 8 on ServeGen R1 (outputs > 1000) and Mooncake
# conversation. Writes results/field/*.json. Usage: bash benchmarks/field_first_look.sh
# [CELL...] with CELL in r1-stationary mooncake-stationary r1-capacity mooncake-capacity
# r1-least-load-capacity mooncake-least-load-capacity.
set -euo pipefail
cd "$(dirname "$0")/.."
BR=${BR:-.venv/bin/br-serve}
TRACES=${TRACES:-../shared/traces}
JOBS=${JOBS:-2}
OUT=${OUT:-results/field}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
POLICIES=jsq,sglang_total_tokens,min_max,vllm_dp,smg_min_tokens,smg_least_load,\
smg_power_of_two,smg_cache_aware,vllm_router_p2c,consistent_hash,\
jsq-dyntralb=jsq,stt-dyntralb=sglang_total_tokens,br0
# DyntraLB with vllm-ascend's default threshold (5 blocks of 128 tokens) in static mode:
# its default dynamic mode never switches on for R1 (no prompt above 700 blocks)
DL=()
for e in jsq-dyntralb stt-dyntralb; do
  DL+=(--engine-option "$e.dyntralb_bubble_threshold_blocks=5"
       --engine-option "$e.dyntralb_mode=static")
done
R1=(--trace "$TRACES/servegen/deepseek_r1_5rps_1h.csv" --min-output 1001)
MC=(--trace "$TRACES/mooncake/conversation_trace.jsonl")
COMMON=(--replicas 8 --policies "$POLICIES" "${DL[@]}" --jobs "$JOBS" --no-plots)
ALL_CELLS="r1-stationary mooncake-stationary r1-capacity mooncake-capacity"
ALL_CELLS+=" r1-least-load-capacity mooncake-least-load-capacity"
mkdir -p "$OUT"
run() {
  local cell=$1; shift
  case " ${CELLS:-$ALL_CELLS} " in
    *" $cell "*) ;; *) return 0 ;; esac
  echo "== $cell" >&2
  "$@" --out "$TMP/$cell"
  cp "$TMP/$cell"/*.json "$OUT/$cell.json"
}
[ $# -gt 0 ] && CELLS="$*"
run r1-stationary nice -n 10 "$BR" sim "${R1[@]}" "${COMMON[@]}" --stationary --replays 8 \
  --limit 2304
run mooncake-stationary nice -n 10 "$BR" sim "${MC[@]}" "${COMMON[@]}" --stationary \
  --replays 8 --limit 2304
run r1-capacity nice -n 10 "$BR" capacity "${R1[@]}" "${COMMON[@]}" --replay-mode window \
  --limit 1000 --replays 8 --slo-tpot-p95-ms 61 --slo-ttft-p95-s 10 --rate-tol 0.03 \
  --rate-lo-req-s 0.2 --rate-hi-req-s 1.0
# smg_least_load's KV term needs the engines' KV pool size (the simulated ranks have no KV
# limit): the same rule with a 2^19-token pool per rank, against jsq and the default
LL=(--replicas 8 --policies jsq,smg_least_load,ll-kv=smg_least_load
    --policy-option ll-kv.kv_capacity_tokens=524288 --jobs "$JOBS" --no-plots)
run r1-least-load-capacity nice -n 10 "$BR" capacity "${R1[@]}" "${LL[@]}" \
  --replay-mode window --limit 1000 --replays 8 --slo-tpot-p95-ms 61 --slo-ttft-p95-s 10 \
  --rate-tol 0.03 --rate-lo-req-s 0.05 --rate-hi-req-s 1.0
run mooncake-least-load-capacity nice -n 10 "$BR" capacity "${MC[@]}" "${LL[@]}" \
  --replay-mode window --limit 1000 --replays 8 --slo-tpot-p95-ms 159.6 --slo-ttft-p95-s 10 \
  --rate-tol 0.03 --rate-lo-req-s 0.25 --rate-hi-req-s 4.0
run mooncake-capacity nice -n 10 "$BR" capacity "${MC[@]}" "${COMMON[@]}" --replay-mode window \
  --limit 1000 --replays 8 --slo-tpot-p95-ms 159.6 --slo-ttft-p95-s 10 --rate-tol 0.03 \
  --rate-lo-req-s 1.0 --rate-hi-req-s 4.0
