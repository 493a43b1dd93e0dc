#!/usr/bin/env bash
# Research (issue 28): the graph behind Serve's Python HTTP proxy (serve.front=proxy)
# against the graph behind Serve's HAProxy front door (serve.front=haproxy:
# RAY_SERVE_ENABLE_HA_PROXY=1, HAProxy forwards each connection to the ingress replica's
# own HTTP server, no ProxyActor hop), each beside smg round_robin, paired by
# window. One research/gap_bench.py session per (window, front), the fronts alternating
# within each window (the front is fixed when Ray starts), merged per front, then
# research/path_compare.py writes the paired gains. Every session records per-role CPU.
#   bash research/front_compare.sh OUT.json [WINDOWS] [GAP_BENCH ARGS...]
# (FIRST=i in the environment: only windows i..WINDOWS-1 of the WINDOWS drawn)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=$1; N=${2:-4}; shift 2 || shift $#
PY=${PY:-.venv/bin/python}
TMP=$(mktemp -d)
for w in $(seq "${FIRST:-0}" $((N - 1))); do
  for front in proxy haproxy; do
    "$PY" research/gap_bench.py --windows "$N" --only-window "$w" "$@" --set serve.front=$front \
      --out "$TMP/$front-$w.json"
  done
done
"$PY" - "$TMP" "$N" <<'P'
import json, sys, pathlib
tmp, n = pathlib.Path(sys.argv[1]), int(sys.argv[2])
for front in ("proxy", "haproxy"):
    parts = [json.loads((tmp / f"{front}-{w}.json").read_text()) for w in range(n)
             if (tmp / f"{front}-{w}.json").exists()]
    merged = {**parts[0], "runs": [r for p in parts for r in p["runs"]]}
    (tmp / f"{front}.json").write_text(json.dumps(merged))
P
"$PY" research/path_compare.py proxy="$TMP/proxy.json" haproxy="$TMP/haproxy.json" --out "$OUT"
cp "$TMP"/proxy.json "${OUT%.json}_proxy_runs.json"; cp "$TMP"/haproxy.json "${OUT%.json}_haproxy_runs.json"
