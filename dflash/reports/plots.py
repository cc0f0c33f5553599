"""Figures as PNG files: tau vs block size, speedup vs depth, acceptance curves and
per-position accuracy curves.

Each function takes a built `Table` (values are the table's, so figures and tables
always agree) and returns the PNG path, or None when the table has nothing to draw.
Panels that compare the same quantity share their y range. Acceptance is drawn as the
survival curve P(a verify step emits >= k tokens), which shows the tail a histogram hides.
"""

from __future__ import annotations

import math
import os
import textwrap

import matplotlib

matplotlib.use("Agg")  # files only: no display needed (and none on cluster nodes)
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from dflash.fileio import atomic_write  # noqa: E402
from dflash.reports.tables import Row, Table, benchmark_label  # noqa: E402

DPI = 150
MAX_PANELS = 12


def render_plots(tables: list[Table], out_dir: str) -> list[str]:
    """Every figure the tables support, written under `out_dir`; returns their paths."""
    os.makedirs(out_dir, exist_ok=True)
    paths = []
    for table in tables:
        if table.ablation == "block_size":
            paths.append(tau_vs_block_size(table, out_dir))
        if table.ablation == "depth":
            paths.append(speedup_vs_depth(table, out_dir))
        paths.append(acceptance_histograms(table, out_dir))
        paths.append(position_accuracy(table, out_dir))
    return [p for p in paths if p is not None]


def tau_vs_block_size(table: Table, out_dir: str) -> str | None:
    """tau against inference B (second axis), one line per training B (first axis), a panel per benchmark."""
    series = _numeric_series(table, x_key=1, series_key=0, metric="tau")
    if not series:
        return None
    fig, axes = _panels(len(table.benchmarks), width=4.2, height=3.2, sharey=True)
    for ax, benchmark in zip(axes, table.benchmarks):
        for label, points in sorted(series.get(benchmark, {}).items(), key=lambda kv: _as_float(kv[0])):
            xs, ys, errs = zip(*points)
            ax.errorbar(xs, ys, yerr=errs, marker="o", capsize=3, label=f"{table.key_headers[0]} {label}")
        ax.set_title(benchmark_label(benchmark))
        ax.set_xlabel(table.key_headers[1])
        ax.set_ylabel(table.axis_label("tau"))
        _integer_ticks(ax, [p[0] for pts in series.get(benchmark, {}).values() for p in pts])
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return _save(fig, out_dir, f"tau_vs_block_size_{table.name}", f"τ vs block size: {table.target}")


def speedup_vs_depth(table: Table, out_dir: str) -> str | None:
    """Speedup and tau against drafter layers (first axis), one line per benchmark."""
    speedups = _numeric_series(table, x_key=0, series_key=None, metric="speedup")
    taus = _numeric_series(table, x_key=0, series_key=None, metric="tau")
    if not speedups and not taus:
        return None
    fig, (left, right) = _panels(2, width=4.6, height=3.4)
    for ax, series, ylabel in ((left, speedups, table.axis_label("speedup")), (right, taus, table.axis_label("tau"))):
        for benchmark in table.benchmarks:
            points = series.get(benchmark, {}).get(None)
            if points:
                xs, ys, errs = zip(*points)
                ax.errorbar(xs, ys, yerr=errs, marker="o", capsize=3, label=benchmark_label(benchmark))
        ax.set_xlabel(table.key_headers[0])
        ax.set_ylabel(ylabel)
        _integer_ticks(ax, [p[0] for b in series.values() for pts in b.values() for p in pts])
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    left.axhline(1.0, color="grey", linewidth=0.8, linestyle="--")
    return _save(fig, out_dir, f"speedup_vs_depth_{table.name}", f"Speedup and τ vs drafter depth: {table.target}")


def at_least(counts: list[int]) -> list[float]:
    """P(a verify step emits >= k tokens) for k = 1..len(counts), from counts of steps that
    emitted exactly k (entry k - 1); the first value is 1."""
    total = sum(counts)
    remaining, shares = total, []
    for count in counts:
        shares.append(remaining / total)
        remaining -= count
    return shares


def acceptance_histograms(table: Table, out_dir: str) -> str | None:
    """P(a verify step emits >= k tokens), a panel per row, a line per benchmark, one y range."""
    panels = []
    for row in table.rows:
        curves = {}
        for benchmark in table.benchmarks:
            counts = _summed_histogram(table.runs.get((row, benchmark), []))
            if counts:
                curves[benchmark] = at_least(counts)
        if curves:
            panels.append((row, curves))
    if not panels:
        return None
    panels = panels[:MAX_PANELS]
    fig, axes = _panels(len(panels), width=3.6, height=2.8, sharey=True)
    for ax, (row, curves) in zip(axes, panels):
        for benchmark, shares in curves.items():
            ax.plot(range(1, len(shares) + 1), shares, marker="o", markersize=3, label=benchmark_label(benchmark))
        ax.set_title(textwrap.fill(_row_label(table, row), width=40), fontsize=9)
        ax.set_xlabel("k: tokens per verify step (bonus incl.)")
        ax.set_ylabel("P(step emits >= k)")
        ax.set_ylim(0, 1.02)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True, nbins=9))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    return _save(fig, out_dir, f"acceptance_{table.name}", f"Acceptance lengths: {table.title}")


def position_accuracy(table: Table, out_dir: str) -> str | None:
    """Per-position draft accuracy acc_k (last validation, else training, metrics), a line per row."""
    lines = []
    for row in table.rows:
        runs = {r.source: r for b in table.benchmarks for r in table.trained.get((row, b), [])}.values()
        curves = [r.accuracies.get("val") or r.accuracies.get("train") for r in runs]
        curves = [c for c in curves if c]
        if curves:
            length = min(len(c) for c in curves)
            lines.append((row, [sum(c[k] for c in curves) / len(curves) for k in range(length)]))
    if not lines:
        return None
    fig, (ax,) = _panels(1, width=5.5, height=3.6)
    for row, accuracies in lines:
        ax.plot(range(1, len(accuracies) + 1), accuracies, marker="o", markersize=3, label=_row_label(table, row))
    ax.set_xlabel("block position k (1 = first masked slot)")
    ax.set_ylabel("accuracy acc_k")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, out_dir, f"position_accuracy_{table.name}", f"Per-position accuracy: {table.title}")


def _numeric_series(table: Table, x_key: int, series_key: int | None, metric: str) -> dict:
    """{benchmark: {series label: [(x, mean, std), ...]}} for rows whose x key is a number."""
    out: dict = {}
    for row in table.rows:
        x = _as_float(row.keys[x_key]) if x_key < len(row.keys) else math.nan
        if math.isnan(x):
            continue
        label = row.keys[series_key] if series_key is not None else None
        for benchmark in table.benchmarks:
            cell = table.cell(row, benchmark, metric)
            if cell.mean is not None:
                out.setdefault(benchmark, {}).setdefault(label, []).append((x, cell.mean, cell.std or 0.0))
    for by_label in out.values():
        for points in by_label.values():
            points.sort()
    return out


def _summed_histogram(runs) -> list[int]:
    histograms = [r.results.acceptance_histogram for r in runs if r.results.acceptance_histogram]
    if not histograms:
        return []
    counts = [0] * max(len(h) for h in histograms)
    for histogram in histograms:
        for k, count in enumerate(histogram):
            counts[k] += count
    return counts if sum(counts) else []


def _row_label(table: Table, row: Row) -> str:
    parts = [f"{h} {v}" for h, v in zip(table.key_headers, row.keys)]
    return ", ".join(([row.section] if row.section else []) + parts)


def _panels(count: int, width: float, height: float, sharey: bool = False):
    """A figure with `count` axes in rows of at most 4 (unused grid cells hidden), laid out by
    matplotlib's constrained layout; `sharey` for panels that compare the same quantity."""
    columns = min(count, 4)
    rows = math.ceil(count / columns)
    fig, axes = plt.subplots(
        rows, columns, figsize=(width * columns, height * rows + 0.5), squeeze=False, sharey=sharey, layout="constrained"
    )
    flat = list(axes.flat)
    for ax in flat[count:]:
        ax.set_visible(False)
    return fig, flat[:count]


def _integer_ticks(ax, values) -> None:
    """Ticks at the measured x values (block sizes, depths) when they are few integers."""
    ticks = sorted({v for v in values if float(v).is_integer()})
    if ticks and len(ticks) <= 12:
        ax.set_xticks(ticks)


def _save(fig, out_dir: str, stem: str, title: str) -> str:
    # Wrap long titles to the figure's width (about 11 characters per inch at this size).
    fig.suptitle(textwrap.fill(title, width=max(30, int(fig.get_figwidth() * 11))))
    path = atomic_write(os.path.join(out_dir, f"{stem}.png"), lambda temporary: fig.savefig(temporary, dpi=DPI, format="png"))
    plt.close(fig)
    return path


def _as_float(text) -> float:
    try:
        return float(text)
    except (TypeError, ValueError):
        return math.nan
