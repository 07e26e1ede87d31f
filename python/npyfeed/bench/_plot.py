"""The figure of `npyfeed.bench.BenchReport.plot`: one bar per measured row (samples/s, log scale), warm and cold
in two colours, with the physical limits of each cache state as dashed lines. The only module that imports
matplotlib (the ``bench`` extra)."""

from __future__ import annotations

import os

from ._text import _bytes

COLOURS = {"warm": "#d9822b", "cold": "#2b6cb0"}


def plot(report, path: str) -> None:
    """Write `report`'s figure to `path` (``.svg`` or ``.png``)."""
    kind = os.path.splitext(path)[1].lower().lstrip(".")
    if kind not in ("svg", "png"):
        raise ValueError(f"the plot is written as .svg or .png, got {path!r}")
    try:
        import matplotlib
        from matplotlib.figure import Figure
    except ImportError:
        raise ImportError("the plot needs matplotlib: pip install 'npyfeed[bench]'") from None
    rows = [r for r in report.rows if r.samples_per_s]
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "npyfeed", "font.size": 9}):
        fig = Figure(figsize=(8, 0.9 + 0.32 * max(len(rows), 1)))
        ax = fig.add_subplot()
        labels = [f"{r.name} ({r.cache})" for r in rows]
        y = list(range(len(rows)))[::-1]
        ax.barh(y, [r.samples_per_s for r in rows], color=[COLOURS.get(r.cache, "grey") for r in rows])
        for yi, r in zip(y, rows):
            ax.text(r.samples_per_s * 1.05, yi, f"{r.samples_per_s:,.0f}", va="center", fontsize=8)
        ax.set_yticks(y)
        ax.set_yticklabels(labels)
        ax.set_xscale("log")
        ax.set_xlabel("samples/s (log scale)")
        limits = [("copy", "warm"), ("disk_random", "cold"), ("disk_random_cached", "cold"), ("disk_seq", "cold")]
        for key, cache in limits:
            lim = report.limits.get(key)
            if lim is not None and lim.samples_per_s:
                style = {"disk_seq": ":", "disk_random_cached": "-."}.get(key, "--")
                ax.axvline(lim.samples_per_s, color=COLOURS[cache], linestyle=style, linewidth=1,
                           label=f"{lim.name} ({cache} limit)")
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.12 - 1.2 / fig.get_figheight() / 10), ncol=2,
                      fontsize=7, frameon=False)
        top = max([r.samples_per_s for r in rows] + [v.samples_per_s or 0 for v in report.limits.values()] + [1])
        ax.set_xlim(right=top * 3)
        d = report.data
        ax.set_title(f"{d['keys']:,} keys, {_bytes(d['bytes'])}, W={d['window']}, B={d['batch_size']}, "
                     f"{d['threads']} threads, {report.machine['cpus']} CPUs", fontsize=9)
        fig.savefig(path, format=kind, metadata={"Date": None} if kind == "svg" else None, bbox_inches="tight")
