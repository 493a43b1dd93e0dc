#!/usr/bin/env bash
# The bounded hold's TTFT cost below capacity (docs/core.md, "Bounded hold"): trace-timed,
# 8 paired windows of 1,000 requests at 50% and 80% of the capacity at the SLO that br0 had
# before the hold (results/capacity/earlier-nohold-<cell>.json), for br0 without the hold
# (nohold), the hold at any load (hold_min_busy_share=0: any), the default (share 0.5) and
# share 0.25. Prints and writes TTFT P50 / P95, TPOT P50 / P95 and throughput per run.
# Usage: research/policy/hold_light_load.sh OUT_JSON  (needs ../shared/traces; ~3 min)
set -euo pipefail
cd "$(dirname "$0")/../.."
out=$1
py=${PYTHON:-.venv/bin/python}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
"$py" research/policy/stress_traces.py "$tmp" --requests 4000 --seed 0 >/dev/null
T=../shared/traces
opts=(--policy-option nohold.hold_budget_ms=0 --policy-option any.hold_min_busy_share=0
      --policy-option s25.hold_min_busy_share=0.25)
# name G base_req_s capacity_req_s (the trace's own rate; the capacity the cells measured
# for br0 before the hold: results/capacity/earlier-nohold-<cell>.json) trace flags
one() {
  name=$1; g=$2; base=$3; cap=$4; shift 4
  for frac in 0.5 0.8; do
    sc=$("$py" -c "print(round($base / ($frac * $cap), 4))")
    nice -n 19 "$py" -m br_serve.cli sim "$@" --limit 1000 --replays 8 --replay-mode window \
      --arrival-scale "$sc" --replicas "$g" --policies nohold=br0,any=br0,br0,s25=br0 \
      --baseline nohold "${opts[@]}" --jobs 2 --no-plots --out "$tmp/${name}_$frac" >/dev/null
  done
}
one r1-g16 16 2.389 1.632 --trace "$T/servegen/deepseek_r1_5rps_1h.csv" --min-output 1001
one mooncake-g8 8 3.475 2.186 --trace "$T/mooncake/conversation_trace.jsonl"
one azure-conv-g8 8 5.443 17.44 --trace "$T/azure2023/AzureLLMInferenceTrace_conv.csv"
one chat-rag-g8 8 4.162 0.731 --trace "$tmp/chat_rag.jsonl" --format jsonl
one reasoning-g8 8 1.994 0.758 --trace "$tmp/reasoning.jsonl" --format jsonl
"$py" - "$tmp" "$out" <<'PY'
import json, statistics as st, sys
from pathlib import Path
tmp, out = Path(sys.argv[1]), Path(sys.argv[2])
rows = []
for d in sorted(p for p in tmp.iterdir() if p.is_dir()):
    cell, frac = d.name.rsplit("_", 1)
    by: dict[str, list[dict]] = {}
    for r in json.loads((d / "summary.json").read_text())["runs"]:
        by.setdefault(r["label"], []).append(r)
    for label, rs in by.items():
        m = {k: st.mean(r[k] for r in rs) for k in
             ("offered_req_s", "ttft_p50_ms", "ttft_p95_ms", "tpot_p50_ms", "tpot_p95_ms",
              "throughput_tok_s", "barrier_idle_share")}
        rows.append({"cell": cell, "load_share": float(frac), "label": label,
                     "policy_options": rs[0]["policy_options"], "replays": len(rs), **m})
        print(f"{cell:14s} {frac} {label:7s} offered {m['offered_req_s']:.2f} req/s  TTFT P50 "
              f"{m['ttft_p50_ms'] / 1e3:.2f} s P95 {m['ttft_p95_ms'] / 1e3:.2f} s  TPOT P50 "
              f"{m['tpot_p50_ms']:.1f} P95 {m['tpot_p95_ms']:.1f} ms  {m['throughput_tok_s']:.0f} tok/s")
out.write_text(json.dumps({"what": "the bounded hold below capacity: ensemble means over "
                           "8 paired windows of 1,000 requests", "rows": rows}, indent=1) + "\n")
print(f"wrote {out}")
PY
