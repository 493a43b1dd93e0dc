"""Rendering of docs/results.md for benchmarks/results.py: tables, plots and claims.

Every sentence with a number is generated from an ensemble cell and states its interval;
a difference whose 95% interval holds 0 is called a tie, never a win.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from br_serve.sim.ensemble import paired_gain
from br_serve.sim.ensemble_output import (
    capacity_table,
    deferral,
    ensemble_table,
    gain_cell,
    plot_capacity,
)

PAPER = """| workload | policy | mean imbalance (tokens) | TPOT P95 ms | throughput tok/s |
|---|---|---|---|---|
| production | JSQ (best baseline) | 215,110 | 83.2 | 843 |
| production | BR-0 | 51,927 | 79.3 | 943 (+11.8%) |
| production | BR-H survival | 40,757 | 78.7 | 979 (+16.1%) |
| production | BR-H ExactMatch | 36,277 | 78.8 | 977 (+15.9%) |
| production | BR-H oracle | 23,577 | 78.0 | 1,029 (+22.1%) |
| Azure 2024 | JSQ | 104,737 | 89.3 | 785 |
| Azure 2024 | BR-0 | 54,051 | 83.3 | 854 (+8.8%) |
| Azure 2024 | BR-H ExactMatch | 38,496 | 82.3 | 909 (+15.8%) |
| Azure 2024 | BR-H oracle | 35,301 | 77.3 | 957 (+21.9%) |
"""
CELL_TITLES = {"stationary-G4": "stationary saturated, G = 4",
               "stationary-G8": "stationary saturated, G = 8",
               "stationary-G16": "stationary saturated, G = 16",
               "trace-80": "trace-timed at 80% of JSQ's saturated throughput, G = 8",
               "trace-95": "trace-timed at 95% of JSQ's saturated throughput, G = 8"}


def _f(v: Any, d: int = 0) -> str:
    return "-" if v is None else f"{v:,.{d}f}"


def _pct(v: float | None, d: int = 1) -> str:
    return "n/a" if v is None else f"{100 * v:+.{d}f}%"


def _iv(st: Any) -> str:
    """``+3.1% [+1.2, +5.0]`` from a Paired (95% t-interval), marking ties."""
    if st.ci95 is None:
        return f"{_pct(st.mean)} (one replay: no interval)"
    lo, hi = st.ci95
    verdict = "tie" if st.tie else ("higher" if lo > 0 else "lower")
    return f"{_pct(st.mean)} [{100 * lo:+.1f}, {100 * hi:+.1f}] ({verdict})"


def _row_iv(r: dict[str, Any]) -> str:
    ci = r.get("gain_vs_baseline_ci95")
    if ci is None:
        return _pct(r.get("gain_vs_baseline_mean"))
    return f"{_pct(r['gain_vs_baseline_mean'])} [{100 * ci[0]:+.1f}, {100 * ci[1]:+.1f}]"


def _ens_cells(w: dict[str, Any]) -> list[str]:
    return [c for c in CELL_TITLES if c in w["cells"]]


def _plot_gains(w: dict[str, Any], path: Path, title: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = _ens_cells(w)
    labels = [r["label"] for r in w["cells"][cells[0]]["ensemble"]
              if r["label"] != r.get("baseline")] if cells else []
    fig, ax = plt.subplots(figsize=(max(6.0, 1.1 * len(labels) + 2), 4.2))
    width = 0.8 / max(1, len(cells))
    for j, c in enumerate(cells):
        rows = {r["label"]: r for r in w["cells"][c]["ensemble"]}
        xs, ms, lo, hi = [], [], [], []
        for i, lab in enumerate(labels):
            r = rows.get(lab)
            if r is None or r["gain_vs_baseline_mean"] is None:
                continue
            m = 100 * r["gain_vs_baseline_mean"]
            ci = r["gain_vs_baseline_ci95"] or [r["gain_vs_baseline_mean"]] * 2
            xs.append(i + (j - (len(cells) - 1) / 2) * width)
            ms.append(m)
            lo.append(m - 100 * ci[0])
            hi.append(100 * ci[1] - m)
        ax.bar(xs, ms, width=width, yerr=[lo, hi], capsize=2, label=c)
    ax.axhline(0, color="k", lw=0.8)
    ax.set_xticks(range(len(labels)), labels, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("throughput gain vs jsq (%)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def _claims_cell(wl: str, cell: str, c: dict[str, Any]) -> list[str]:
    rows = [r for r in c["ensemble"] if r["label"] != r.get("baseline")
            and r["gain_vs_baseline_mean"] is not None]
    if not rows:
        return []
    g = rows[0]["replicas"]
    bad = [r for r in rows if deferral(r)]
    rows = [r for r in rows if not deferral(r)]
    up = [r for r in rows if r["gain_vs_baseline_ci95"] and r["gain_vs_baseline_ci95"][0] > 0]
    down = [r for r in rows if r["gain_vs_baseline_ci95"]
            and r["gain_vs_baseline_ci95"][1] < 0]
    tie = [r for r in rows if r.get("gain_vs_baseline_tie")]
    k = (rows or bad)[0]["replays"]
    out = [f"- **{wl}, {CELL_TITLES[cell]}** (K = {k}): above jsq: "
           + (", ".join(f"{r['label']} {_row_iv(r)}" for r in up) or "none")
           + "; ties with jsq: " + (", ".join(r["label"] for r in tie) or "none")
           + "; below jsq: " + (", ".join(f"{r['label']} {_row_iv(r)}" for r in down)
                                or "none") + "."]
    if bad:
        out.append("  Not stationary, so not ranked: in most replays the admitted mean "
                   "prompt or output differs from what FCFS would have admitted by more "
                   "than 5% and more than twice its sampling noise (deferral): " + ", ".join(
                       f"{r['label']} (gain {_row_iv(r)}; prompt "
                       f"x{_f(r['admitted_vs_offered_prompt_mean'], 2)}, output "
                       f"x{_f(r['admitted_vs_offered_output_mean'], 2)}; wait beyond FCFS "
                       f"P99 {_f(r['wait_beyond_fcfs_s_p99_mean'])} s)" for r in bad) + ".")
    best = sorted(rows, key=lambda r: -r["gain_vs_baseline_mean"])  # stationary ones only
    rows = rows + bad  # the pairings below are stated with their own intervals
    if len(best) >= 2:
        a, b = best[0]["label"], best[1]["label"]
        st = paired_gain(c["runs"], a, b, g)
        out.append(f"  Best mean{' (of the stationary ones)' if bad else ''}: {a}; against "
                   f"the runner-up {b} its paired throughput ratio is {_iv(st)}.")
    labels = {r["label"] for r in rows}
    for a in ("brh+survival", "brh+exact", "brh+oracle", "sglang_total_tokens"):
        if a in labels and "br0" in labels:
            st = paired_gain(c["runs"], a, "br0", g)
            out.append(f"  {a} against br0: {_iv(st)}.")
    share = [(r["label"], r["headroom_share_mean"]) for r in rows
             if r.get("headroom_share_mean") is not None and not deferral(r)]
    if share:
        top = max(share, key=lambda x: x[1])
        out.append(f"  Largest share of jsq's headroom to the balanced bound: {top[0]} "
                   f"{100 * top[1]:.0f}%.")
    if c.get("mode") == "stationary":
        unsure = [r for r in c["ensemble"] if not deferral(r)
                  and (r.get("representative_share") or 0) < 0.5]
        if unsure:
            out.append("  Window too short to tell whether admissions were representative "
                       "in most replays (beyond 5% but within twice the sampling noise): "
                       + ", ".join(r["label"] for r in unsure) + ".")
    if c.get("mode") == "trace":
        base = next(r for r in c["ensemble"] if r["label"] == r.get("baseline"))
        lat = sorted(c["ensemble"], key=lambda r: r["ttft_p95_ms_mean"] or 0)
        out.append(f"  Throughput here is tokens per decode-busy second (the wall-clock "
                   f"rate is the offered load). TTFT P95 (mean over replays): lowest "
                   f"{lat[0]['label']} {_f((lat[0]['ttft_p95_ms_mean'] or 0) / 1e3, 1)} s, "
                   f"jsq {_f((base['ttft_p95_ms_mean'] or 0) / 1e3, 1)} s, highest "
                   f"{lat[-1]['label']} {_f((lat[-1]['ttft_p95_ms_mean'] or 0) / 1e3, 1)} s.")
    return out


def _claims_capacity(wl: str, c: dict[str, Any]) -> list[str]:
    runs = c["runs"]
    tol = c["bracket"]["rel_tol"]
    base = next((r for r in runs if r["label"] == r.get("baseline")), None)
    if base is None:
        return []
    best = max(runs, key=lambda r: r["capacity_req_s"])
    clear = [r for r in runs if r["capacity_vs_baseline"] is not None
             and abs(r["capacity_vs_baseline"]) > 2 * tol]
    line = (f"- **{wl}, capacity at the SLO** (TPOT P95 <= {c['slo']['tpot_p95_ms']:g} ms, "
            f"TTFT P95 <= {c['slo']['ttft_p95_s']:g} s, G = 8, K = {c['replays']}): jsq "
            f"carries {base['capacity_req_s']:.3f} req/s; the most is {best['label']} with "
            f"{best['capacity_req_s']:.3f} req/s ({_pct(best['capacity_vs_baseline'])}). "
            f"Differences beyond twice the bisection's resolution ({100 * tol:.0f}%): "
            + (", ".join(f"{r['label']} {_pct(r['capacity_vs_baseline'])}" for r in clear)
               or "none") + ".")
    notes = [f"{r['label']}: {r['note']}" for r in runs if r.get("note")]
    return [line] + ([f"  Notes: {'; '.join(notes)}."] if notes else [])


def _headline(doc: dict[str, Any]) -> list[str]:
    pols = [p for p in doc["policies"] if p != "jsq"]
    out = ["| workload | cell | " + " | ".join(pols) + " |",
           "|---|---|" + "---|" * len(pols)]
    for wl, w in doc["workloads"].items():
        for cell in ("stationary-G8", "stationary-G16", "trace-95"):
            c = w["cells"].get(cell)
            if c is None:
                continue
            rows = {r["label"]: r for r in c["ensemble"]}
            cells = []
            for p in pols:
                r = rows.get(p)
                if r is None:
                    cells.append("-")
                    continue
                sh = r.get("headroom_share_mean")
                cells.append(gain_cell(r) + (f" ({100 * sh:.0f}%)" if sh is not None else "")
                             + (" **not stationary**" if deferral(r) else ""))
            out.append(f"| {wl} | {cell} | " + " | ".join(cells) + " |")
        cap = w["cells"].get("capacity")
        if cap is not None:
            rows = {r["label"]: r for r in cap["runs"]}
            cells = [(f"{rows[p]['capacity_req_s']:.3f} ({_pct(rows[p]['capacity_vs_baseline'])})"
                      if p in rows else "-") for p in pols]
            jsq = rows.get("jsq")
            out.append(f"| {wl} | capacity req/s (jsq {_f(jsq and jsq['capacity_req_s'], 3)})"
                       f" | " + " | ".join(cells) + " |")
    return out


def render(doc: dict[str, Any], plot_dir: Path, md_dir: Path) -> str:
    cfg = doc["config"]
    wall = doc.get("wall_s") or 0.0
    k = cfg["replays"]
    parts = [
        "# Simulated results: paired replay ensembles\n",
        "Generated by `python benchmarks/results.py` (overwritten on every run; do not edit "
        f"by hand). Simulated at commit `{doc.get('commit') or 'unrecorded'}` in "
        f"{wall / 60:.1f} min with `--jobs {cfg['jobs']}` on the 2-core development "
        f"machine" + (f"; subset `--only {','.join(cfg['only'])}`" if cfg.get("only") else "")
        + ".\n",
        "## How to read these numbers\n",
        f"- Every cell is an ensemble of K = {k} replays: random windows of the trace (the "
        "window starts are drawn in K equal strata of the trace), every policy on the same "
        "windows with the same seed. A policy's gain is its throughput over jsq's *on the "
        "same window*, averaged over the windows, with the standard error and a two-sided "
        "95% Student t-interval (K - 1 degrees of freedom). **A gain whose interval holds 0 "
        "is a tie**, whatever its mean. Windows overlap when K windows do not fit in the "
        "trace (`window_overlap` per cell in the JSON); the replays are then correlated "
        "and the intervals optimistic.",
        "- **Stationary saturated** (the comparison mode): every request is prefilled, the "
        "pool is topped up from the window to 4 x the cluster's slots, and the metrics "
        "cover max(8 x slots, 4,096) admissions after a warm-up of max(pool depth + 2 x "
        "slots, 4,096) admissions (both shrink together where the trace is shorter, so "
        "that a replay takes at most 80% of it; per cell below). A policy that defers the "
        "requests it cannot place well gains nothing in a long enough window: they stay in "
        "the pool, which shows as pool age and as "
        "*unrepresentative* admissions (admitted mean prompt or output more than 5% off "
        "what FCFS would have admitted, and more than twice the sampling noise of the two "
        "sets' difference). A policy whose admissions were unrepresentative in most "
        "replays is marked **not stationary** and not ranked: its window caught a phase of "
        "its deferral, not its steady state.",
        "- **Trace-timed** cells keep the windows' arrival pattern, scaled so the offered "
        "token rate is 80% or 95% of jsq's stationary throughput at G = 8. Below saturation "
        "the wall-clock token rate is the offered load; the throughput reported is tokens "
        "per decode-busy second, which still tells how much barrier time a policy saved; "
        "barrier idle share = mean imbalance / (G x mean max load).",
        "- **Headroom share** = (thr - thr_jsq) / (balanced bound - thr_jsq), a ratio of "
        "means over the replays; the balanced bound prices every step at the mean load "
        "instead of the max (the same run).",
        f"- **Capacity** = the highest request rate (bisection on the arrival-rate scale, "
        f"resolution {100 * cfg['capacity_tol']:.0f}%) at which the ensemble means of TPOT "
        f"P95 and TTFT P95 meet the SLO: TPOT P95 <= {doc['slo']['tpot_factor']:g} x the "
        "step time of a full, perfectly balanced replica of mean-size requests (`b + a * B "
        "* (mean prompt + mean output / 2)`, per workload), TTFT P95 <= "
        f"{doc['slo']['ttft_p95_s']:g} s; windows of {cfg['capacity_requests']} requests. "
        "A capacity has no interval: differences within twice the resolution are not "
        "claimed.",
        f"- Cluster model: B = {cfg['slots']} slots per replica, no KV limit, step time "
        f"`{doc['step']['a_s_per_token']:g} s/token * max_g L_g + {doc['step']['b_s']:g} s`,"
        " prefill 8 instances of `0.02 s + 2e-5 s/token` (trace-timed), seed "
        f"{cfg['seed']}. Predictors learn online from finished requests (no training "
        "part); `brh+exact` only where the trace has prefix hashes. `vllm_dp` is not run: "
        "without a KV limit its score is JSQ's (a paired gain of exactly 0 in every cell "
        "of an earlier full run); `round_robin` is left out of the capacity searches.\n",
        "## Workloads\n",
        "| workload | requests | input mean / P50 | output mean / P50 | prefix hashes | "
        "recorded rate req/s | SLO TPOT P95 ms |",
        "|---|---|---|---|---|---|---|"]
    for wl, w in doc["workloads"].items():
        i = w["info"]
        cap = w["cells"].get("capacity")
        parts.append(f"| {wl} | {i['requests']:,} | {_f(i['input_mean'])} / "
                     f"{_f(i['input_p50'])} | {_f(i['output_mean'])} / {_f(i['output_p50'])} "
                     f"| {'yes' if i['hash_ids'] else 'no'} | {i['offered_req_s']:.2f} | "
                     f"{_f(cap['slo']['tpot_p95_ms'], 1) if cap else '-'} |")
    parts += ["", "## Headline: gain over jsq (mean ± s.e., share of jsq's headroom)\n",
              *_headline(doc), "",
              "## What the cells say (generated from the intervals)\n"]
    for wl, w in doc["workloads"].items():
        for cell in _ens_cells(w):
            parts += _claims_cell(wl, cell, w["cells"][cell])
        if "capacity" in w["cells"]:
            parts += _claims_capacity(wl, w["cells"]["capacity"])
    parts.append("")
    for wl, w in doc["workloads"].items():
        parts.append(f"## {wl}\n")
        if _ens_cells(w):
            p = _plot_gains(w, plot_dir / f"{wl}_gain.png",
                            f"{wl}: paired gain over jsq, 95% t-intervals")
            parts.append(f"![{wl} gains]({_rel(p, md_dir)})\n")
        for cell in _ens_cells(w):
            c = w["cells"][cell]
            extra = (f" Arrival rate x{c['rate_scale']:.3f} of the recording."
                     if "rate_scale" in c else "")
            parts += [f"### {CELL_TITLES[cell]}\n",
                      f"Windows of {c['window_requests']} requests"
                      + (f" (warm-up {c['warmup_admissions']} admissions)"
                         if c.get("warmup_admissions") else "")
                      + "; window overlap "
                      f"{_f(c.get('window_overlap'), 2)}; {_f(c['wall_s'])} s.{extra}\n",
                      ensemble_table(c["ensemble"])]
        if "capacity" in w["cells"]:
            c = w["cells"]["capacity"]
            p = plot_capacity(c["runs"], plot_dir / f"{wl}_capacity.png",
                              f"{wl}: capacity at TPOT P95 <= {c['slo']['tpot_p95_ms']:g} ms"
                              f", TTFT P95 <= {c['slo']['ttft_p95_s']:g} s (G = 8)")
            parts += ["### capacity at the SLO, G = 8\n",
                      f"![{wl} capacity]({_rel(p, md_dir)})\n",
                      f"Bracket {_f(c['runs'][0]['rate_lo_req_s'], 3)} - "
                      f"{_f(c['runs'][0]['rate_hi_req_s'], 3)} req/s, windows of "
                      f"{c['window_requests']} requests; {_f(c['wall_s'])} s.\n",
                      capacity_table(c["runs"])]
    if (md_dir.parent / "results" / "capacity").is_dir():  # docs/ beside results/
        from capacity_section import section  # benchmarks/, beside this file
        parts.append(section(md_dir.parent))
    parts += ["## The paper's numbers, for reference (G = 8, Ascend 910C, DeepSeek-V3)\n",
              PAPER, "Neither the paper's production trace nor Azure 2024 is available "
              "here, and its cost model is a real cluster's; compare directions, not "
              "values.\n"]
    return "\n".join(parts) + "\n"


def _rel(p: Path, md_dir: Path) -> str:
    try:
        return str(p.resolve().relative_to(md_dir.resolve()))
    except ValueError:
        return str(p)
