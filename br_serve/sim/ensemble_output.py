"""Tables and plots of ensembles and capacity searches (Markdown, PNG).

Numbers are printed as mean +- s.e.; a gain whose 95% t-interval holds 0 is marked
``(tie)``. Plots (matplotlib, Agg backend): gains with their 95% intervals as error bars,
and capacities by policy.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any


def fmt(v: Any, digits: int = 0) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:,.{digits}f}"
    return str(v)


def pm(mean: Any, se: Any, digits: int = 0, scale: float = 1.0) -> str:
    """``mean +- se`` (``se`` omitted when unknown)."""
    if mean is None:
        return "-"
    m = f"{scale * mean:,.{digits}f}"
    return m if se is None else f"{m} ± {scale * se:,.{digits}f}"


def gain_cell(row: dict[str, Any]) -> str:
    """``+8.0 ± 1.8%``, ``(tie)`` when the 95% interval holds 0; ``baseline`` for it."""
    if row.get("gain_vs_baseline_mean") is None:
        return "-"
    if row["label"] == row.get("baseline"):
        return "baseline"
    m, se = 100 * row["gain_vs_baseline_mean"], row["gain_vs_baseline_se"]
    txt = f"{m:+.1f}%" if se is None else f"{m:+.1f} ± {100 * se:.1f}%"
    return txt + (" (tie)" if row.get("gain_vs_baseline_tie") else "")


def ci_cell(row: dict[str, Any]) -> str:
    ci = row.get("gain_vs_baseline_ci95")
    if ci is None or row["label"] == row.get("baseline"):
        return "-"
    return f"[{100 * ci[0]:+.1f}, {100 * ci[1]:+.1f}]%"


def share_cell(v: Any) -> str:
    return "-" if v is None else f"{100 * v:.0f}%"


def representative_cell(row: dict[str, Any]) -> str:
    """``yes 6/8, no 1`` (replays whose admissions were representative / clearly not;
    the rest too short to tell)."""
    yes, no = row.get("representative_share"), row.get("unrepresentative_share")
    if yes is None or no is None:
        return "-"
    k = row["replays"]
    return f"yes {round(yes * k)}/{k}" + (f", no {round(no * k)}" if no else "")


def deferral(row: dict[str, Any]) -> bool:
    """True when most replays' admissions were clearly unrepresentative (stationary)."""
    return (row.get("unrepresentative_share") or 0.0) >= 0.5


def ensemble_table(rows: Sequence[dict[str, Any]]) -> str:
    """One Markdown row per ensemble row (policy, G, mode)."""
    stationary = any(r["mode"] == "stationary" for r in rows)
    base = next((r["baseline"] for r in rows if r.get("baseline")), "baseline")
    head = ["policy", "G", "mode", "K", "throughput tok/s", f"gain vs {base}", "95% CI",
            "headroom share", "mean imbalance", "barrier idle", "mean step ms",
            "TPOT P95 ms", "TTFT P95 s", "wait beyond FCFS P99 s"]
    if stationary:
        head += ["pool age P99 s", "representative"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["label"], str(r["replicas"]), r["mode"], str(r["replays"]),
                 pm(r["throughput_tok_s_mean"], r["throughput_tok_s_se"], 1),
                 gain_cell(r), ci_cell(r), share_cell(r.get("headroom_share_mean")),
                 pm(r["mean_imbalance_tokens_mean"], r["mean_imbalance_tokens_se"]),
                 share_cell(r.get("barrier_idle_share_mean")),
                 pm(r["mean_step_ms_mean"], r["mean_step_ms_se"], 1),
                 pm(r["tpot_p95_ms_mean"], r["tpot_p95_ms_se"], 1),
                 pm(r["ttft_p95_ms_mean"], r["ttft_p95_ms_se"], 1, 1e-3),
                 pm(r["wait_beyond_fcfs_s_p99_mean"], r["wait_beyond_fcfs_s_p99_se"], 1)]
        if stationary:
            cells += [pm(r["pool_age_s_p99_mean"], r["pool_age_s_p99_se"], 1),
                      representative_cell(r)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def capacity_table(runs: Sequence[dict[str, Any]]) -> str:
    """One Markdown row per spec of a capacity search."""
    lines = ["| policy | G | capacity req/s | vs baseline | TPOT P95 ms | TTFT P95 s | "
             "barrier idle | note |", "|---|---|---|---|---|---|---|---|"]
    for r in runs:
        vs = r.get("capacity_vs_baseline")
        ci = r.get("capacity_vs_baseline_ci95")
        vs_txt = ("baseline" if r["label"] == r.get("baseline") else
                  "-" if vs is None else f"{100 * vs:+.1f}%" + (
                      "" if ci is None else f" [{100 * ci[0]:+.1f}, {100 * ci[1]:+.1f}]"))
        lines.append(
            f"| {r['label']} | {r['replicas']} | {fmt(r['capacity_req_s'], 3)}"
            f"{' (capped)' if r.get('capped') else ''} | {vs_txt} | "
            f"{fmt(r.get('tpot_p95_ms'), 1)} | {fmt(r.get('ttft_p95_s'), 2)} | "
            f"{share_cell(r.get('barrier_idle_share'))} | {r.get('note') or ''} |")
    return "\n".join(lines) + "\n"


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_gains(rows: Sequence[dict[str, Any]], path: Path, title: str = "") -> Path:
    """Bars of the mean gain over the baseline with 95%-interval error bars."""
    plt = _plt()
    sel = [r for r in rows if r.get("gain_vs_baseline_mean") is not None
           and r["label"] != r.get("baseline")]
    fig, ax = plt.subplots(figsize=(max(5.0, 0.7 * len(sel) + 2), 4))
    xs = list(range(len(sel)))
    means = [100 * r["gain_vs_baseline_mean"] for r in sel]
    lo = [m - 100 * r["gain_vs_baseline_ci95"][0] if r["gain_vs_baseline_ci95"] else 0.0
          for m, r in zip(means, sel, strict=True)]
    hi = [100 * r["gain_vs_baseline_ci95"][1] - m if r["gain_vs_baseline_ci95"] else 0.0
          for m, r in zip(means, sel, strict=True)]
    colors = ["0.6" if r.get("gain_vs_baseline_tie") else "C0" for r in sel]
    ax.bar(xs, means, yerr=[lo, hi], capsize=4, color=colors)
    ax.axhline(0, color="k", lw=0.8)
    ax.set_xticks(xs, [r["label"] for r in sel], rotation=30, ha="right", fontsize=8)
    base = sel[0]["baseline"] if sel else "baseline"
    ax.set_ylabel(f"throughput gain vs {base} (%)")
    ax.set_title(title or "mean paired gain, 95% t-interval (grey: tie)", fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def plot_capacity(runs: Sequence[dict[str, Any]], path: Path, title: str = "") -> Path:
    """Bars of the capacity at the SLO by policy."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(max(5.0, 0.7 * len(runs) + 2), 4))
    xs = list(range(len(runs)))
    ax.bar(xs, [r["capacity_req_s"] for r in runs],
           color=["0.6" if r.get("capped") or not r.get("met") else "C1" for r in runs])
    ax.set_xticks(xs, [r["label"] for r in runs], rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("capacity at the SLO (req/s)")
    ax.set_title(title or "capacity at the SLO", fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def plot_ensembles(rows: Sequence[dict[str, Any]], plot_dir: Path) -> list[Path]:
    """``gain_G<g>_<mode>.png`` per replica count and mode."""
    groups: dict[tuple[int, str], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["replicas"], r["mode"]), []).append(r)
    return [plot_gains(g, plot_dir / f"gain_G{k[0]}_{k[1]}.png",
                       f"G={k[0]}, {k[1]}: mean paired gain, 95% t-interval (grey: tie)")
            for k, g in sorted(groups.items())]
