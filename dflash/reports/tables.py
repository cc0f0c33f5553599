"""The paper's tables, built from run records: the main table and one table per ablation.

- Main table (records with `sweep.ablation == "main"`, and finished runs outside any
  sweep that compared methods, e.g. `python -m dflash.evaluate methods=[dflash,ngram]`):
  rows = (target, method), one per method a run compared (results.json `methods`), one
  section per temperature, columns = benchmarks x (speedup, tau). Every method's speedup
  is over the autoregressive baseline of its own run.
- Ablation tables: one per (ablation, target); rows = the sweep's axes (e.g. drafter
  layers), plus T when several temperatures were run; columns as above.

Which aggregation the tau and speedup columns show (`metric`; see METRIC_NOTES and
`dflash.eval.results`): "pooled" (default) or "paper" (the DFlash paper's harness). Runs
whose results.json predates a field get a footnote naming it. A note under the table names
every benchmark's source as its runs recorded it (`Results.source_description`).

Aggregation: replicates of a cell are its finished runs with different training seeds
(mean and sample std over them); several runs of one seed count once (the latest). A
cell without a finished run is a dash with a numbered footnote saying why (not run,
still running, or failed with its error), never an error.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from dflash.errors import require
from dflash.methods import label as method_label
from dflash.methods import width_label as method_width_label
from dflash.reports.records import FAILED, FINISHED, PENDING, RunRecord, axis_value

METRICS = (("speedup", "Speedup"), ("tau", "τ"))
# metric -> column -> (the `Results` property it shows, the results.json field that holds it, axis label)
METRIC_SOURCES = {
    "pooled": {
        "speedup": ("speedup_vs_autoregressive", "speedup.vs_autoregressive", "speedup over autoregressive, end to end (×)"),
        "tau": ("tau", "tau", "τ pooled (tokens per step, bonus incl.)"),
    },
    "paper": {
        "speedup": (
            "speedup_decode_only_vs_autoregressive",
            "speedup_decode_only.vs_autoregressive",
            "decode-only speedup over autoregressive (×)",
        ),
        "tau": ("tau_per_prompt_mean", "tau_per_prompt_mean", "τ per-generation mean (tokens per step, bonus incl.)"),
    },
}
BENCHMARK_NAMES = {
    "gsm8k": "GSM8K",
    "math500": "MATH-500",
    "aime24": "AIME24",
    "aime25": "AIME25",
    "humaneval": "HumanEval",
    "mbpp": "MBPP",
    "livecodebench": "LiveCodeBench",
    "swe_bench_lite": "SWE-Bench",
    "mt_bench": "MT-Bench",
    "alpaca": "Alpaca",
    # the prompt families of a mixed benchmark (dflash.sweep.prompts smollm2_eval), then the mix itself
    "math": "Math (held out)",
    "chat": "Chat (held out)",
    "smollm2_mix": "All three",
}
ABLATION_TITLES = {
    "main": "Main results",
    "block_size": "Block size (training B x inference B)",
    "block_size_controlled": "Training block size at equal supervised positions (training B x anchors)",
    "block_size_controlled_infer": "Training block size at equal supervised positions, at a common inference B "
    "(training B x inference B; B 16 trained with 64 anchors, B 8 with 164)",
    "depth": "Drafter depth",
    "target_features": "Number of tapped target layers",
    "loss_decay": "Loss weights over block positions",
    "loss": "Training objective x position weights",
    "anchors": "Anchor sampling",
    "target_context": "Target context features",
    "methods": "Drafting method at equal training minutes",
    "methods_lookup": "Drafting method at equal training minutes, behind prompt lookup",
}
METRIC_NOTES = {
    "pooled": "τ: acceptance length per verify step, counting the bonus token, pooled over all verify steps. "
    "Speedup: end to end (prefill included) over autoregressive decoding in the same run.",
    "paper": "τ: acceptance length per verify step, counting the bonus token, averaged per generation, then over "
    "generations (as the DFlash paper's harness). Speedup: decode only (mean time per output token without "
    "prefill, as the paper reports it) over autoregressive decoding in the same run.",
}


@dataclass(frozen=True)
class Row:
    """A table row: `keys` fill the key columns; rows with the same `section` are grouped."""

    section: str | None
    keys: tuple[str, ...]


@dataclass
class Cell:
    """Replicate values of one metric (one per training seed) and an optional footnote
    (why the cell is missing, or which of its seeds failed)."""

    values: list[float] = field(default_factory=list)
    note: int | None = None

    @property
    def mean(self) -> float | None:
        return sum(self.values) / len(self.values) if self.values else None

    @property
    def std(self) -> float | None:
        """Sample standard deviation over replicates (None with fewer than two)."""
        if len(self.values) < 2:
            return None
        mean = self.mean
        return math.sqrt(sum((v - mean) ** 2 for v in self.values) / (len(self.values) - 1))


@dataclass
class Table:
    """A table ready to render. cells[(row, benchmark, column)]; footnotes numbered from 1.

    runs: the finished runs of each (row, benchmark) the values come from (one per seed);
    trained: every finished run there (a drafter evaluated twice appears twice), whose
    training metrics the accuracy plot reads. metric: the aggregation shown, "pooled" or "paper".
    swept: it holds runs of a sweep (dflash/conf/sweep: the paper's ablations), which the paper's
    trends judge (`dflash.reports.trends`); a table of a user's own evaluations alone is not judged.
    """

    name: str
    title: str
    ablation: str
    target: str
    key_headers: list[str]
    rows: list[Row]
    benchmarks: list[str]
    cells: dict[tuple[Row, str, str], Cell]
    footnotes: list[str]
    notes: list[str]
    runs: dict[tuple[Row, str], list[RunRecord]]
    trained: dict[tuple[Row, str], list[RunRecord]]
    metric: str
    swept: bool

    def cell(self, row: Row, benchmark: str, metric: str) -> Cell:
        return self.cells[(row, benchmark, metric)]

    def axis_label(self, column: str) -> str:
        """How a figure labels the values of `column` ("tau" or "speedup") under this table's metric."""
        return METRIC_SOURCES[self.metric][column][2]


def build_tables(records: list[RunRecord], metric: str = "pooled") -> list[Table]:
    """The main table (if any main runs), then one table per ablation and target.

    metric: "pooled" or "paper", the aggregation of tau and speedup (module docstring).
    """
    check_metric(metric)
    tables = []
    records = [view for r in records for view in r.family_views()]  # a mixed benchmark: a column per family too
    main = [view for r in records if _in_main_table(r) for view in r.method_views()]
    if main:
        tables.append(_build(main, "main", "all targets", ["Target", "Method"], _main_row, "main", metric))
    ablations = sorted({r.ablation for r in records if r.ablation and r.ablation != "main"})
    for ablation in ablations:
        mine = [r for r in records if r.ablation == ablation]
        for target in sorted({r.target for r in mine}):
            runs = [r for r in mine if r.target == target]
            axes = _axes(runs)
            several_temperatures = len({r.temperature for r in runs}) > 1
            headers = [str(a.get("label", a.get("key"))) for a in axes] + (["T"] if several_temperatures else [])

            if not headers:  # a sweep without axes: one row per sweep
                headers = ["Sweep"]

            def row_of(record: RunRecord, axes=axes, several=several_temperatures) -> Row:
                values = tuple(axis_value(record, axis) for axis in axes) or (str(record.sweep.get("name", "?")),)
                return Row(None, values + ((_temperature(record),) if several else ()))

            tables.append(_build(runs, ablation, target, headers, row_of, f"{ablation}_{_slug(target)}", metric))
    return tables


def check_metric(metric: str) -> None:
    require(metric in METRIC_SOURCES, "metric", f"unknown {metric!r}; choose one of {list(METRIC_SOURCES)}")


def benchmark_label(name: str) -> str:
    return BENCHMARK_NAMES.get(name, name)


def _build(records, ablation, target, headers, row_of, name, metric) -> Table:
    by_cell: dict[tuple[Row, str], list[RunRecord]] = {}
    for record in records:
        by_cell.setdefault((row_of(record), record.benchmark), []).append(record)
    rows = sorted({row for row, _ in by_cell}, key=_row_order)
    benchmarks = sorted({b for _, b in by_cell}, key=_benchmark_order)
    footnotes: list[str] = []
    cells, runs, trained = {}, {}, {}
    for row in rows:
        for benchmark in benchmarks:
            group = by_cell.get((row, benchmark), [])
            finished_runs = [r for r in group if r.status == FINISHED]
            finished = _one_per_seed(finished_runs)
            runs[(row, benchmark)] = finished
            trained[(row, benchmark)] = finished_runs
            if finished:
                # Seeds that failed and never finished: the value stands, with a footnote.
                done = {str(r.seed) for r in finished}
                failed = [r for r in group if r.status == FAILED and str(r.seed) not in done]
                for column, _ in METRICS:
                    prop, results_field, _ = METRIC_SOURCES[metric][column]
                    values = [getattr(r.results, prop) for r in finished if getattr(r.results, prop) is not None]
                    if not values:
                        note = _note(footnotes, f"not measured: the results have no {results_field}")
                    else:
                        note = _note(footnotes, _missing_reason(failed)) if failed else None
                    cells[(row, benchmark, column)] = Cell(values, note)
                continue
            note = _note(footnotes, _missing_reason(group))
            for column, _ in METRICS:
                cells[(row, benchmark, column)] = Cell([], note)
    replicates = {len(v) for v in runs.values() if v}
    notes = [METRIC_NOTES[metric]]
    if replicates - {1}:
        notes.append(f"Mean ± sample std over training seeds ({', '.join(str(n) for n in sorted(replicates))} per cell).")
    sources = source_note([r for group in runs.values() for r in group], benchmarks)
    if sources:
        notes.append(sources)
    title = f"{ABLATION_TITLES.get(ablation, ablation)}: {target}"
    temperatures = sorted({t for t in (r.temperature for r in records) if t is not None})
    if ablation != "main" and len(temperatures) == 1:
        title += f", T = {temperatures[0]:g}"
    swept = any(r.ablation for r in records)
    return Table(name, title, ablation, target, headers, rows, benchmarks, cells, footnotes, notes, runs, trained, metric, swept)


def source_note(records: list[RunRecord], benchmarks: list[str]) -> str | None:
    """ "Data: GSM8K: openai/gsm8k@740312add88f; ..." from the runs' results.json `benchmark_source`
    (`Results.source_description`); None when no run recorded one."""
    if all(r.results.source_description is None for r in records):
        return None
    parts = []
    for benchmark in benchmarks:
        found = dict.fromkeys(r.results.source_description or "source not recorded" for r in records if r.benchmark == benchmark)
        if found:
            parts.append(f"{benchmark_label(benchmark)}: {' and '.join(found)}")
    return "Data: " + "; ".join(parts) + "."


def _in_main_table(record: RunRecord) -> bool:
    unswept_comparison = record.ablation is None and record.status == FINISHED and bool(record.results.methods)
    return record.ablation == "main" or unswept_comparison


def _main_row(record: RunRecord) -> Row:
    """(target, method label): DFlash with its block size B (and tree budget N), chain and
    lookup methods with their drafts per step k (= verify width - 1)."""
    block = record.results.block_size
    name = method_label(record.method)
    if isinstance(block, int) and block > 0:
        name += " " + method_width_label(record.method, block, record.results.settings)
    return Row(f"T = {_temperature(record)}", (record.target, name))


def _axes(records: list[RunRecord]) -> list[dict]:
    for record in records:
        if record.sweep.get("axes"):
            return list(record.sweep["axes"])
    return []


def _temperature(record: RunRecord) -> str:
    return "?" if record.temperature is None else f"{record.temperature:g}"


def _one_per_seed(records: list[RunRecord]) -> list[RunRecord]:
    """The latest finished run of each training seed."""
    latest: dict = {}
    for record in sorted(records, key=lambda r: r.results.timestamp or ""):
        latest[str(record.seed)] = record
    return list(latest.values())


def _missing_reason(group: list[RunRecord]) -> str:
    failed = [r for r in group if r.status == FAILED]
    if failed:
        first = failed[0]
        more = f" and {len(failed) - 1} more" if len(failed) > 1 else ""
        return f"failed: {first.error} ({first.source}{more})"
    if any(r.status == PENDING for r in group):
        return "no result yet: the run has not finished (" + ", ".join(r.source for r in group) + ")"
    return "not run"


def _note(footnotes: list[str], text: str) -> int:
    if text not in footnotes:
        footnotes.append(text)
    return footnotes.index(text) + 1


def _row_order(row: Row):
    return (_natural(row.section or ""), tuple(_natural(k) for k in row.keys))


def _natural(text: str):
    """Sort numbers numerically and before words ("2" < "10" < "auto")."""
    try:
        return (0, float(text), "")
    except ValueError:
        return (1, 0.0, text)


def _benchmark_order(name: str):
    order = list(BENCHMARK_NAMES)
    return (order.index(name), "") if name in order else (len(order), name)


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_") or "target"
