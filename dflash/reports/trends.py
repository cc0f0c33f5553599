"""The paper's ablation trends against ours, with a verdict decided by the seed spread.

A `Trend` names an ablation table, a metric (tau or speedup) and the rows the paper
orders from worst to best. Ours is read from the table's cells (one value per training
seed). Each neighbouring pair (a, b) of the order is decided on its own:

    d = mean(b) - mean(a),  se = sqrt(std(a)^2 / n(a) + std(b)^2 / n(b))
    d > 2 se: as the paper;  d < -2 se: against it;  otherwise: not decided.

The trend *matches* when every pair is as the paper, *does not match* when any pair is
against it, and is *inconclusive* otherwise, or when a cell has fewer than two seeds
(no spread to decide by), seeds with identical values (the same run repeated, not a
spread) or is missing. Twice the standard error is a loose test: with
three seeds a side it is about a 90% one (Welch, 4 degrees of freedom), and a true
difference smaller than the seed spread will read as inconclusive.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from dflash.reports.tables import Cell, Row, Table

MATCHES, DOES_NOT, INCONCLUSIVE = "matches", "does not match", "inconclusive"
SPREAD_FACTOR = 2.0


@dataclass(frozen=True)
class Trend:
    """`order`: row selectors from the paper's worst to its best; a selector is the row's
    key values (a tuple of strings) or a predicate on the `Row`."""

    ablation: str
    claim: str
    metric: str
    order: tuple


def _method(prefix: str, temperature: str = "0") -> Callable[[Row], bool]:
    def select(row: Row) -> bool:
        return row.section == f"T = {temperature}" and row.keys[-1].split(" (")[0] == prefix

    select.label = f"{prefix}, T = {temperature}"
    return select


PAPER_TRENDS = (
    Trend("main", "DFlash is faster than EAGLE-3 (T = 0)", "speedup", (_method("EAGLE-3"), _method("DFlash"))),
    Trend("main", "DFlash accepts more than EAGLE-3 (T = 0)", "tau", (_method("EAGLE-3"), _method("DFlash"))),
    Trend(
        "block_size",
        "a drafter trained with a larger B accepts more (each at its own B)",
        "tau",
        (("8", "8"), ("10", "10"), ("16", "16")),
    ),
    Trend("block_size", "a larger inference B accepts more for a given drafter (train B 8)", "tau", (("8", "8"), ("8", "16"))),
    Trend(
        "block_size_controlled",
        "a drafter trained with a larger B accepts more, at equal supervised positions "
        "(B 8 with 164 anchors, B 16 with 64; each at its own B)",
        "tau",
        (("8", "164"), ("16", "64")),
    ),
    Trend("depth", "a deeper drafter accepts more", "tau", (("1",), ("3",), ("5",))),
    Trend("target_features", "more tapped target layers accept more", "tau", (("1",), ("3",), ("5",))),
    Trend(
        "loss",
        "decaying position weights beat uniform ones (CE)",
        "tau",
        (("CE (data)", "uniform"), ("CE (data)", "decay (gamma by B)")),
    ),
    Trend("anchors", "random anchors beat fixed-stride blocks", "tau", (("stride",), ("random",))),
    Trend(
        "target_context",
        "the target's features make the drafter (against a standalone one)",
        "tau",
        (("none (standalone)",), ("injected (DFlash)",)),
    ),
)


@dataclass
class TrendResult:
    trend: Trend
    target: str
    benchmark: str
    cells: list[Cell | None]  # one per selector of `trend.order`; None: no such row
    verdict: str
    reason: str


def judge(trend: Trend, table: Table, benchmark: str) -> TrendResult:
    """The verdict of `trend` on one benchmark of `table` (module docstring)."""
    cells = [_cell(table, selector, benchmark, trend.metric) for selector in trend.order]
    if any(c is None or c.mean is None for c in cells):
        return TrendResult(trend, table.target, benchmark, cells, INCONCLUSIVE, "a row has no result")
    if any(len(c.values) < 2 for c in cells):
        return TrendResult(trend, table.target, benchmark, cells, INCONCLUSIVE, "fewer than two seeds in a row")
    if any(c.std == 0 for c in cells):  # trained seeds never agree to the last digit; identical runs do
        return TrendResult(trend, table.target, benchmark, cells, INCONCLUSIVE, "a row's seeds gave identical values")
    pairs = [_pair(a, b) for a, b in zip(cells, cells[1:])]
    if all(p > 0 for p in pairs):
        return TrendResult(trend, table.target, benchmark, cells, MATCHES, "every step beyond twice its standard error")
    if any(p < 0 for p in pairs):
        return TrendResult(trend, table.target, benchmark, cells, DOES_NOT, "a step reversed beyond twice its standard error")
    return TrendResult(trend, table.target, benchmark, cells, INCONCLUSIVE, "a step within twice its standard error")


def judge_all(tables: list[Table], trends=PAPER_TRENDS) -> list[TrendResult]:
    """Every trend on every benchmark of every table of its ablation."""
    return [
        judge(trend, table, b) for trend in trends for table in tables if table.ablation == trend.ablation for b in table.benchmarks
    ]


def to_markdown(results: list[TrendResult]) -> str:
    """The trends table: claim, metric, our means in the paper's order, verdict."""
    lines = [
        "### Trends: the paper's against ours",
        "",
        "| ablation | the paper says | metric | ours, worst to best by the paper (mean ± std, seeds) | verdict |",
        "| --- | --- | --- | --- | --- |",
    ]
    for r in results:
        ours = " → ".join(_describe(selector, cell) for selector, cell in zip(r.trend.order, r.cells))
        lines.append(
            f"| {r.trend.ablation} ({r.target}) | {r.trend.claim} | {r.trend.metric} | {ours} | **{r.verdict}** ({r.reason}) |"
        )
    lines += [
        "",
        f"Verdict per neighbouring pair: the difference of means against {SPREAD_FACTOR:g}x its standard "
        "error over seeds (dflash/reports/trends.py); every pair as the paper: matches; one reversed: does "
        "not match; otherwise inconclusive.",
        "",
    ]
    return "\n".join(lines)


def _pair(a: Cell, b: Cell) -> int:
    """+1 when b is beyond a by more than the spread allows, -1 when below it, else 0."""
    difference = b.mean - a.mean
    se = math.sqrt(a.std**2 / len(a.values) + b.std**2 / len(b.values))
    if abs(difference) > SPREAD_FACTOR * se:
        return 1 if difference > 0 else -1
    return 0


def _cell(table: Table, selector, benchmark: str, metric: str) -> Cell | None:
    rows = [row for row in table.rows if (selector(row) if callable(selector) else row.keys == tuple(selector))]
    return table.cells.get((rows[0], benchmark, metric)) if len(rows) == 1 else None


def _describe(selector, cell: Cell | None) -> str:
    label = getattr(selector, "label", None) or " / ".join(selector)
    if cell is None or cell.mean is None:
        return f"{label}: –"
    spread = f" ± {cell.std:.2f}" if cell.std is not None else ""
    return f"{label}: {cell.mean:.2f}{spread} ({len(cell.values)})"
