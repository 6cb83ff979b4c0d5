"""--plot: a roofline chart and an A/B ratio chart in one PNG (matplotlib, Agg backend)."""

from __future__ import annotations

import textwrap

from .report import OURS, ab_pairs, ratio_stats

__all__ = ["plot_results", "has_plot_data"]

#: Above this many A/B pairs the ratio chart shows one geomean bar (min..max whiskers) per
#: baseline, op and format: 120 per-config bars (the deepseek suite) are unreadable.
MAX_BARS = 40


def has_plot_data(result: dict) -> bool:
    """True when ``result`` holds something to draw: a timed row with FLOPs or bytes (roofline)
    or a baseline/ours pair (ratios). A CPU (interpreter) run has neither: it times nothing."""
    timed = [r for r in result.get("rows", []) if r.get("status") == "ok" and r.get("median_ms")]
    return any(r.get("flops") and r.get("bytes") for r in timed) or bool(ab_pairs(result.get("rows", [])))


def plot_results(result: dict, path: str) -> str | None:
    """Write a roofline chart and an A/B ratio chart of ``result`` (the bench's result dict) to
    ``path`` (PNG) and return ``path``; write nothing and return None when there is nothing to
    draw (:func:`has_plot_data`), so no empty chart is ever left behind.

    Example: ``plot_results(json.load(open("ds.json")), "ds.png")``.
    """
    if not has_plot_data(result):
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in result["rows"] if r.get("status") == "ok" and r.get("median_ms")]
    rl = result.get("roofline") or {}
    pairs = ab_pairs(result["rows"])
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(15, 6.5), gridspec_kw={"width_ratios": [1.1, 1]})
    env = result.get("env", {})
    fig.suptitle(f"blockscaled bench — {env.get('gpu', '?')} — git {env.get('git_rev', '?')}", fontsize=12)

    # ---- roofline: TFLOP/s against arithmetic intensity (FLOP per byte incl. scales)
    pts = [r for r in rows if r.get("flops") and r.get("bytes")]
    if pts:
        ai = [r["flops"] / r["bytes"] for r in pts]
        lo, hi = max(min(ai) / 2, 0.1), max(ai) * 2
        xs = [lo * (hi / lo) ** (i / 200) for i in range(201)]
        bw = rl.get("copy_gbps")
        for name, peak, ls in (("cuBLAS FP8 peak", rl.get("fp8_tflops"), "-"), ("cuBLAS bf16 peak", rl.get("bf16_tflops"), "--")):
            if peak:
                ys = [min(peak, bw * 1e9 * x / 1e12) if bw else peak for x in xs]
                ax1.plot(xs, ys, ls, color="gray", lw=1.2, label=f"{name} {peak:.0f} TFLOP/s" + (f" / copy {bw:.0f} GB/s" if bw else ""))
        impls = sorted({r["impl"] for r in pts}, key=lambda s: (s != OURS, s))
        markers = "o^sDvP*Xh<>"
        for i, impl in enumerate(impls):
            sel = [r for r in pts if r["impl"] == impl]
            ax1.scatter([r["flops"] / r["bytes"] for r in sel], [r["tflops"] for r in sel],
                        marker=markers[i % len(markers)], s=42 if impl == OURS else 26,
                        zorder=3 if impl == OURS else 2, label=impl, alpha=0.9)
        ax1.set_xscale("log")
        ax1.set_yscale("log")
        ax1.set_xlabel("arithmetic intensity (FLOP / byte, scales included)")
        ax1.set_ylabel("TFLOP/s")
        ax1.grid(True, which="both", alpha=0.3)
        ax1.legend(fontsize=8, loc="lower right")
        ax1.set_title("Roofline (measured on this GPU, this run)")
    else:
        ax1.text(0.5, 0.5, "no timed GEMM rows\n(timings need CUDA)", ha="center", va="center", fontsize=12)
        ax1.set_axis_off()

    # ---- ratios: baseline time / ours per config, one colour per baseline
    if pairs:
        labels, vals, colors, err = [], [], [], None
        cmap = plt.get_cmap("tab10")
        n_pairs = sum(len(ps) for ps in pairs.values())
        if n_pairs <= MAX_BARS:  # one bar per config
            for j, (base, ps) in enumerate(pairs.items()):
                for p in ps:
                    labels.append(f"{p['op']} {p['format']} {p['case']}"[:48] + f"  [{base}]")
                    vals.append(p["ratio"])
                    colors.append(cmap(j % 10))
        else:  # too many to read: one bar per (baseline, op, format) = geomean, whiskers = min..max
            lo, hi = [], []
            for j, (base, ps) in enumerate(pairs.items()):
                groups: dict[tuple[str, str], list[float]] = {}
                for p in ps:
                    groups.setdefault((p["op"], p["format"]), []).append(p["ratio"])
                for (op, fmt), rs in groups.items():
                    st = ratio_stats(rs)
                    if not st:
                        continue
                    labels.append(f"{op} {fmt} vs {base} ({len(rs)} configs)")
                    vals.append(st["geomean"])
                    lo.append(st["geomean"] - st["min"])
                    hi.append(st["max"] - st["geomean"])
                    colors.append(cmap(j % 10))
            err = [lo, hi]
        y = list(range(len(vals)))
        ax2.barh(y, vals, color=colors, xerr=err, capsize=3 if err else 0)
        ax2.axvline(1.0, color="black", lw=1)
        ax2.set_xscale("log")
        ax2.set_yticks(y)
        ax2.set_yticklabels(labels, fontsize=max(5, min(9, 400 // max(1, len(vals)))))
        ax2.invert_yaxis()
        ax2.set_xlabel("baseline time / blockscaled time  (> 1: blockscaled faster)")
        geos = ", ".join(f"{b} {ratio_stats([p['ratio'] for p in ps]).get('geomean', float('nan')):.2f}x"
                         for b, ps in pairs.items())
        ax2.set_title(textwrap.fill(f"A/B ratio (geomean: {geos})", 80), fontsize=9)
        ax2.grid(True, axis="x", which="both", alpha=0.3)
    else:
        ax2.text(0.5, 0.5, "no A/B pairs\n(baselines need CUDA)", ha="center", va="center", fontsize=12)
        ax2.set_axis_off()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
