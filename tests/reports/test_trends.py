"""The trends table: verdicts decided by the spread across seeds (dflash.reports.trends)."""

from __future__ import annotations

import pytest

from dflash.reports.tables import Cell, Row, Table
from dflash.reports.trends import DOES_NOT, INCONCLUSIVE, MATCHES, Trend, judge, judge_all, to_markdown

DEPTH = Trend("depth", "deeper accepts more", "tau", (("1",), ("3",), ("5",)))


def table(ablation: str, rows: dict, metric_values: str = "tau") -> Table:
    """A table of `rows` {Row: [values per seed]} on one benchmark."""
    cells = {(row, "humaneval", metric_values): Cell(list(values)) for row, values in rows.items()}
    return Table("t", "t", ablation, "tiny_code", ["k"], list(rows), ["humaneval"], cells, [], [], {}, {}, "pooled", True)


def depth_table(one, three, five) -> Table:
    return table("depth", {Row(None, ("1",)): one, Row(None, ("3",)): three, Row(None, ("5",)): five})


@pytest.mark.parametrize(
    "one, three, five, verdict",
    [
        ([2.0, 2.1, 2.05], [2.5, 2.6, 2.55], [3.0, 3.1, 3.05], MATCHES),
        ([2.0, 2.1, 2.05], [2.5, 2.6, 2.55], [2.2, 2.25, 2.3], DOES_NOT),  # 5 layers reversed beyond the spread
        ([2.0, 2.1, 2.05], [2.5, 2.6, 2.55], [2.4, 2.9, 2.7], INCONCLUSIVE),  # 3 -> 5 within twice its error
        ([2.0, 2.1, 2.05], [2.5, 2.6, 2.55], [2.0, 2.8, 2.1], INCONCLUSIVE),  # 5 lower on average, but noisy
        ([2.0], [2.5], [3.0], INCONCLUSIVE),  # one seed: no spread to decide by
    ],
)
def test_verdict_follows_the_spread_across_seeds(one, three, five, verdict):
    assert judge(DEPTH, depth_table(one, three, five), "humaneval").verdict == verdict


def test_the_spread_decides_not_the_difference_alone():
    # the same means; only the seed spread differs
    tight = depth_table([2.0, 2.02, 2.04], [2.1, 2.12, 2.14], [2.2, 2.22, 2.24])
    wide = depth_table([1.5, 2.02, 2.54], [1.6, 2.12, 2.64], [1.7, 2.22, 2.74])
    assert judge(DEPTH, tight, "humaneval").verdict == MATCHES
    assert judge(DEPTH, wide, "humaneval").verdict == INCONCLUSIVE


def test_a_row_without_a_result_is_inconclusive_and_named():
    rows = {Row(None, ("1",)): [2.0, 2.1], Row(None, ("3",)): [], Row(None, ("5",)): [3.0, 3.1]}
    result = judge(DEPTH, table("depth", rows), "humaneval")
    assert result.verdict == INCONCLUSIVE and "3: –" in to_markdown([result]) and result.reason == "a row has no result"


def test_a_row_not_in_the_grid_is_left_out_and_named():
    # scale smollm2 trains B = 16 and 8, not 10: the trend 8 -> 10 -> 16 is judged on 8 -> 16
    result = judge(DEPTH, table("depth", {Row(None, ("1",)): [2.0, 2.1, 2.05], Row(None, ("5",)): [3.0, 3.1, 3.05]}), "humaneval")
    assert result.verdict == MATCHES and result.reason.endswith("; not in this grid: 3")
    assert "3: –" in to_markdown([result])
    alone = judge(DEPTH, table("depth", {Row(None, ("5",)): [3.0, 3.1]}), "humaneval")
    assert alone.verdict == INCONCLUSIVE and alone.reason.startswith("fewer than two of the rows in this grid")


def test_the_main_trend_is_judged_for_each_dflash_block_size():
    rows = {
        Row("T = 0", ("smollm2_135m", "DFlash (B=16)")): [1.2, 1.22, 1.24],
        Row("T = 0", ("smollm2_135m", "DFlash (B=3)")): [1.7, 1.72, 1.74],
        Row("T = 0", ("smollm2_135m", "EAGLE-3 (k=6)")): [1.5, 1.52, 1.54],
    }
    results = [r for r in judge_all([table("main", rows, "speedup")]) if r.trend.metric == "speedup"]
    assert [r.verdict for r in results] == [DOES_NOT, MATCHES]
    text = to_markdown(results)
    assert "EAGLE-3 (k=6), T = 0: 1.52 ± 0.02 (3) → DFlash (B=16), T = 0: 1.22 ± 0.02 (3)" in text
    assert "→ DFlash (B=3), T = 0: 1.72 ± 0.02 (3)" in text
    assert text.count("| main (tiny_code) | HumanEval |") == 2  # each verdict names its benchmark


def test_main_table_trend_compares_dflash_chain_with_eagle3_not_the_tree():
    rows = {
        Row("T = 0", ("tiny_code", "DFlash (B=8)")): [1.5, 1.52, 1.54],
        Row("T = 0", ("tiny_code", "DFlash, tree (B=8, N=16)")): [2.5, 2.52, 2.54],
        Row("T = 0", ("tiny_code", "EAGLE-3 (k=7)")): [1.8, 1.82, 1.84],
        Row("T = 1", ("tiny_code", "DFlash (B=8)")): [3.0, 3.02, 3.04],
    }
    results = [r for r in judge_all([table("main", rows, "speedup")]) if r.trend.metric == "speedup"]
    assert [r.verdict for r in results] == [DOES_NOT]
    assert "EAGLE-3 (k=7), T = 0: 1.82 ± 0.02 (3) → DFlash (B=8), T = 0: 1.52 ± 0.02 (3)" in to_markdown(results)


def test_identical_seeds_are_no_spread_to_decide_by():
    # three seeds that trained the same drafter (the bug fixed on 2026-11-23) give std 0
    result = judge(DEPTH, depth_table([2.0, 2.0, 2.0], [2.5, 2.5, 2.5], [3.0, 3.0, 3.0]), "humaneval")
    assert result.verdict == INCONCLUSIVE and "identical" in result.reason
