"""Writing a set of runs: summary.json, per-step Parquet, PNG plots, a Markdown table.

Layout under ``out_dir``::

    summary.json                      {"runs": [SimResult.summary(), ...], ...}
    results.md                        one Markdown table row per run
    series/<run>.parquet              per-step columns (decimated past ``max_rows``)
    loads/<run>.parquet               per-replica loads at every stretch start
    plots/loads_G<g>.png              per-replica load over time, one panel per policy
    plots/imbalance_G<g>.png          imbalance distribution (ECDF) per policy
    plots/throughput_G<g>.png         throughput bars with the balanced bound
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from br_serve.sim.result import SimResult


def run_name(summary: dict[str, Any]) -> str:
    """File-system-safe id of a run: ``<label>_G<g>_B<b>_<mode>``."""
    raw = f"{summary['label']}_G{summary['replicas']}_B{summary['slots']}_{summary['mode']}"
    return re.sub(r"[^A-Za-z0-9_.+-]", "_", raw)


def write_series(res: SimResult, path: Path, max_rows: int) -> int:
    """Per-step Parquet; keeps every ``stride``-th step when longer than ``max_rows``.

    Returns the stride used (1 = every step).
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    s = res.steps
    n = len(s)
    stride = max(1, -(-n // max_rows)) if max_rows > 0 else 1
    idx = np.arange(0, n, stride)
    ends = res.step_end_s()
    table = pa.table({
        "step": idx, "end_s": ends[idx], "tau_s": s.tau_s[idx],
        "balanced_tau_s": s.balanced_tau_s[idx], "max_load_tokens": s.max_load_tokens[idx],
        "sum_load_tokens": s.sum_load_tokens[idx], "imbalance_tokens": s.imbalance_tokens[idx],
        "running": s.running[idx], "pool": s.pool[idx],
    })
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path)
    return stride


def write_loads(res: SimResult, path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    s = res.steps
    cols: dict[str, Any] = {"t_s": s.sample_t_s, "step": s.sample_step}
    for g in range(s.sample_loads.shape[1] if s.sample_loads.ndim == 2 else 0):
        cols[f"load_g{g}"] = s.sample_loads[:, g]
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(cols), path)


def _fmt(v: Any, digits: int = 0) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:,.{digits}f}"
    return str(v)


def markdown_table(runs: Sequence[dict[str, Any]]) -> str:
    """One row per run; gains are over the ``jsq`` run with the same G and mode."""
    jsq = {(r["replicas"], r["mode"]): r["throughput_tok_s"] for r in runs
           if r["policy"] == "jsq"}
    head = ("| policy | G | mode | mean imbalance (tokens) | TPOT P50 ms | TPOT P95 ms | "
            "TTFT P95 ms | throughput tok/s | vs jsq | balanced bound tok/s | "
            "headroom share | tick P50 us | tick P99 us |")
    lines = [head, "|" + "---|" * 13]
    for r in runs:
        base = jsq.get((r["replicas"], r["mode"]))
        thr, bound = r["throughput_tok_s"], r["balanced_bound_tok_s"]
        gain = share = None
        if base and thr:
            gain = f"{100 * (thr / base - 1):+.1f}%"
            if bound and bound > base:
                share = f"{100 * (thr - base) / (bound - base):.0f}%"
        lines.append(
            f"| {r['label']} | {r['replicas']} | {r['mode']} | "
            f"{_fmt(r['mean_imbalance_tokens'])} | {_fmt(r['tpot_p50_ms'], 1)} | "
            f"{_fmt(r['tpot_p95_ms'], 1)} | {_fmt(r['ttft_p95_ms'])} | {_fmt(thr)} | "
            f"{gain or '-'} | {_fmt(bound)} | {share or '-'} | {_fmt(r['tick_p50_us'])} | "
            f"{_fmt(r['tick_p99_us'])} |")
    return "\n".join(lines) + "\n"


def plot_runs(results: Sequence[SimResult], plot_dir: Path, max_points: int = 4000) -> list[Path]:
    """PNG plots per replica count (matplotlib, Agg backend). Returns the files written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plot_dir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    by_g: dict[tuple[int, bool], list[SimResult]] = {}
    for r in results:
        by_g.setdefault((r.config.replicas, r.config.sim.saturated), []).append(r)
    for (g, sat), group in sorted(by_g.items()):
        tag = f"G{g}_{'saturated' if sat else 'trace'}"
        # per-replica load over time
        fig, axes = plt.subplots(len(group), 1, figsize=(9, 2.2 * len(group)), sharex=True,
                                 squeeze=False)
        for ax, r in zip(axes[:, 0], group, strict=True):
            s = r.steps
            if s.sample_loads.ndim == 2 and s.sample_loads.shape[0]:
                step = max(1, s.sample_loads.shape[0] // max_points)
                ax.plot(s.sample_t_s[::step], s.sample_loads[::step], lw=0.5)
            ax.set_title(r.config.label, fontsize=9)
            ax.set_ylabel("load (tokens)", fontsize=8)
        axes[-1, 0].set_xlabel("time (s)")
        fig.tight_layout()
        p = plot_dir / f"loads_{tag}.png"
        fig.savefig(p, dpi=90)
        plt.close(fig)
        written.append(p)
        # imbalance ECDF over the headline window
        fig, ax = plt.subplots(figsize=(7, 4))
        for r in group:
            w = r.steady_steps if r.steady_steps is not None else len(r.steps)
            x = np.sort(r.steps.imbalance_tokens[:w])
            if x.size:
                step = max(1, x.size // max_points)
                ax.plot(x[::step], np.linspace(0, 1, x.size)[::step], label=r.config.label)
        ax.set_xlabel("imbalance G*max(L) - sum(L) (tokens)")
        ax.set_ylabel("share of steps")
        ax.legend(fontsize=7)
        fig.tight_layout()
        p = plot_dir / f"imbalance_{tag}.png"
        fig.savefig(p, dpi=90)
        plt.close(fig)
        written.append(p)
        # throughput bars
        fig, ax = plt.subplots(figsize=(max(5, 0.8 * len(group)), 4))
        sums = [r.summary() for r in group]
        xs = np.arange(len(group))
        ax.bar(xs, [s["throughput_tok_s"] or 0 for s in sums], label="throughput")
        ax.scatter(xs, [s["balanced_bound_tok_s"] or 0 for s in sums], color="k", marker="_",
                   s=400, label="balanced bound")
        ax.set_xticks(xs, [s["label"] for s in sums], rotation=30, ha="right", fontsize=7)
        ax.set_ylabel("tokens / s")
        ax.legend(fontsize=7)
        fig.tight_layout()
        p = plot_dir / f"throughput_{tag}.png"
        fig.savefig(p, dpi=90)
        plt.close(fig)
        written.append(p)
    return written


def write_outputs(results: Sequence[SimResult], out_dir: str | Path, *,
                  meta: dict[str, Any] | None = None, max_rows: int = 200_000,
                  plots: bool = True) -> dict[str, Any]:
    """Write everything listed in the module docstring; returns the summary document."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    runs = []
    for r in results:
        s = r.summary()
        name = run_name(s)
        s["series_file"] = f"series/{name}.parquet"
        s["series_stride"] = write_series(r, out / s["series_file"], max_rows)
        s["loads_file"] = f"loads/{name}.parquet"
        write_loads(r, out / s["loads_file"])
        runs.append(s)
    doc: dict[str, Any] = {"runs": runs, **(meta or {})}
    (out / "summary.json").write_text(json.dumps(doc, indent=2, default=str))
    (out / "results.md").write_text(markdown_table(runs))
    if plots:
        plot_runs(results, out / "plots")
    return doc
