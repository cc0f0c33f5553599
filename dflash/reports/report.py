"""Write the tables (Markdown, LaTeX) and figures (PNG) for a set of run records."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from dflash.errors import require
from dflash.fileio import write_text
from dflash.reports.records import RunRecord
from dflash.reports.render import to_latex, to_markdown
from dflash.reports.tables import Table, build_tables
from dflash.reports.trends import judge_all
from dflash.reports.trends import to_markdown as trends_markdown

FORMATS = ("md", "tex")
PLOTS_DIR = "plots"


@dataclass
class Report:
    """What `write_report` produced: the tables and every file written."""

    tables: list[Table]
    markdown: str
    files: list[str] = field(default_factory=list)


def write_report(
    records: list[RunRecord],
    out_dir: str,
    formats=FORMATS,
    plots: bool = True,
    ablations: list[str] | tuple = (),
    metric: str = "pooled",
) -> Report:
    """Build the tables of `records` and write `tables.md` / `tables.tex` and `plots/*.png`.

    ablations: only these tables (e.g. ["main", "depth"]); empty: every table.
    metric: the aggregation of tau and speedup, "pooled" or "paper" (`build_tables`).
    The Markdown file links each table's figures below it and, for tables of sweep runs, ends
    with the trends table (`dflash.reports.trends`: the paper's ablation trends against ours).
    """
    unknown = sorted(set(formats) - set(FORMATS))
    require(not unknown, "formats", f"unknown format {unknown[0]!r}; choose from {list(FORMATS)}" if unknown else "")
    tables = build_tables(records, metric)
    if ablations:
        tables = [t for t in tables if t.ablation in ablations]
    os.makedirs(out_dir, exist_ok=True)
    figures = {t.name: [] for t in tables}
    if plots:
        from dflash.reports.plots import render_plots  # matplotlib only when figures are wanted

        figures = {t.name: render_plots([t], os.path.join(out_dir, PLOTS_DIR)) for t in tables}
    sections = []
    for table in tables:
        links = [f"![{os.path.basename(p)}]({PLOTS_DIR}/{os.path.basename(p)})" for p in figures[table.name]]
        sections.append(to_markdown(table) + ("\n" + "\n".join(links) + "\n" if links else ""))
    verdicts = judge_all(tables)
    if verdicts:
        sections.append(trends_markdown(verdicts))
    markdown = "\n".join(sections)
    files = [p for paths in figures.values() for p in paths]
    if "md" in formats:
        files.append(write_text(os.path.join(out_dir, "tables.md"), markdown))
    if "tex" in formats:
        latex = "% Needs \\usepackage{booktabs}.\n" + "\n".join(to_latex(t) for t in tables)
        files.append(write_text(os.path.join(out_dir, "tables.tex"), latex))
    return Report(tables, markdown, files)
