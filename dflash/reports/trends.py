"""The paper's ablation trends against ours, with a verdict decided by the seed spread.

A `Trend` names an ablation table, a metric (tau or speedup) and the rows the paper
orders from worst to best. Only tables of sweep runs are judged (`Table.swept`). Ours is read
from the table's cells (one value per training seed). Each neighbouring pair (a, b) of the
order is decided on its own:

    d = mean(b) - mean(a),  se = sqrt(std(a)^2 / n(a) + std(b)^2 / n(b))
    d > 2 se: as the paper;  d < -2 se: against it;  otherwise: not decided.

The trend *matches* when every pair is as the paper, *does not match* when any pair is
against it, and is *inconclusive* otherwise, or when a cell has fewer than two seeds
(no spread to decide by), seeds with identical values (the same run repeated, not a
spread) or is missing (its row exists: the job failed or has not finished). A row the
table does not have at all was not in the sweep's grid at that scale: it is left out of
the order and named, and the trend is judged on the rows that remain (at least two). A
selector that matches several rows is judged once per row it matches. Twice the standard
error is a loose test (about 90% with three seeds a side, Welch).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from dflash.reports.tables import Cell, Row, Table, benchmark_label

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
    Trend("methods", "DSpark's heads accept more than DFlash (the DSpark paper)", "tau", (("DFlash",), ("DSpark",))),
    Trend("methods", "DFlash2's heads accept more than DFlash (speculators#1014)", "tau", (("DFlash",), ("DFlash2",))),
)


@dataclass
class TrendResult:
    trend: Trend
    target: str
    benchmark: str
    cells: list[Cell | None]  # one per selector of `trend.order`; None: no such row
    verdict: str
    reason: str
    rows: tuple | None = None  # the row each selector was read from (None: not in the table)


def judge(trend: Trend, table: Table, benchmark: str, rows: tuple | None = None) -> TrendResult:
    """The verdict of `trend` on one benchmark of `table` (module docstring).

    rows: the table row (or None: not in the table) of each selector of `trend.order`;
    default: the first choice of `row_choices`.
    """
    rows = rows if rows is not None else row_choices(trend, table)[0]
    cells = [table.cells.get((row, benchmark, trend.metric)) if row is not None else None for row in rows]
    result = _verdict(trend, table, benchmark, cells)
    absent = [_label(selector) for selector, row in zip(trend.order, rows) if row is None]
    if absent:
        result.reason += f"; not in this grid: {', '.join(absent)}"
    result.rows = rows
    return result


def row_choices(trend: Trend, table: Table) -> list[tuple]:
    """Every assignment of table rows to the selectors of `trend.order` (one row per
    selector, None for a selector no row matches): one tuple unless a selector matches
    several rows."""
    choices = [()]
    for selector in trend.order:
        matches = [row for row in table.rows if (selector(row) if callable(selector) else row.keys == tuple(selector))]
        choices = [(*choice, row) for choice in choices for row in (matches or [None])]
    return choices


def _verdict(trend: Trend, table: Table, benchmark: str, all_cells: list) -> TrendResult:
    cells = [c for c in all_cells if c is not None]  # rows of this grid
    if len(cells) < 2:
        return TrendResult(trend, table.target, benchmark, all_cells, INCONCLUSIVE, "fewer than two of the rows in this grid")
    if any(c.mean is None for c in cells):
        return TrendResult(trend, table.target, benchmark, all_cells, INCONCLUSIVE, "a row has no result")
    if any(len(c.values) < 2 for c in cells):
        return TrendResult(trend, table.target, benchmark, all_cells, INCONCLUSIVE, "fewer than two seeds in a row")
    if any(c.std == 0 for c in cells):  # trained seeds never agree to the last digit; identical runs do
        return TrendResult(trend, table.target, benchmark, all_cells, INCONCLUSIVE, "a row's seeds gave identical values")
    pairs = [_pair(a, b) for a, b in zip(cells, cells[1:])]
    if all(p > 0 for p in pairs):
        return TrendResult(trend, table.target, benchmark, all_cells, MATCHES, "every step beyond twice its standard error")
    if any(p < 0 for p in pairs):
        return TrendResult(trend, table.target, benchmark, all_cells, DOES_NOT, "a step reversed beyond twice its standard error")
    return TrendResult(trend, table.target, benchmark, all_cells, INCONCLUSIVE, "a step within twice its standard error")


def judge_all(tables: list[Table], trends=PAPER_TRENDS) -> list[TrendResult]:
    """Every trend on every benchmark of every table of its ablation that holds sweep runs
    (`Table.swept`: the paper's trends say nothing of a user's own evaluations)."""
    return [
        judge(trend, table, b, rows)
        for trend in trends
        for table in tables
        if table.ablation == trend.ablation and table.swept
        for rows in row_choices(trend, table)
        for b in table.benchmarks
    ]


def to_markdown(results: list[TrendResult]) -> str:
    """The trends table: claim, metric, our means in the paper's order, verdict."""
    lines = [
        "### Trends: the paper's against ours",
        "",
        "| ablation | benchmark | the paper says | metric | ours, worst to best by the paper (mean ± std, seeds) | verdict |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for r in results:
        rows = r.rows or (None,) * len(r.cells)
        ours = " → ".join(_describe(selector, row, cell) for selector, row, cell in zip(r.trend.order, rows, r.cells))
        lines.append(
            f"| {r.trend.ablation} ({r.target}) | {benchmark_label(r.benchmark)} | {r.trend.claim} | {r.trend.metric} | {ours} "
            f"| **{r.verdict}** ({r.reason}) |"
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


def _label(selector) -> str:
    return getattr(selector, "label", None) or " / ".join(selector)


def _describe(selector, row: Row | None, cell: Cell | None) -> str:
    label = _label(selector)
    if callable(selector) and row is not None:
        label = f"{row.keys[-1]}, {row.section}" if row.section else row.keys[-1]  # which of the matching rows
    if cell is None or cell.mean is None:
        return f"{label}: –"
    spread = f" ± {cell.std:.2f}" if cell.std is not None else ""
    return f"{label}: {cell.mean:.2f}{spread} ({len(cell.values)})"
