"""Tables as Markdown (GitHub) and LaTeX (booktabs).

Cells: tau as "6.53", speedup as "4.91×"; with several seeds "mean ± std". A missing
cell is an en dash with a superscript footnote number (a value whose other seeds
failed carries one too); footnotes and notes follow the table.
"""

from __future__ import annotations

from dflash.reports.tables import METRICS, Cell, Table, benchmark_label

DASH = "–"
SUPERSCRIPT_DIGITS = str.maketrans("0123456789", "⁰¹²³⁴⁵⁶⁷⁸⁹")
LATEX_SPECIAL = {
    "\\": r"\textbackslash{}",
    "&": r"\&",
    "%": r"\%",
    "$": r"\$",
    "#": r"\#",
    "_": r"\_",
    "{": r"\{",
    "}": r"\}",
    "~": r"\textasciitilde{}",
    "^": r"\textasciicircum{}",
    "τ": r"$\tau$",
    "×": r"$\times$",
    "±": r"$\pm$",
    "–": "--",
}


def format_value(cell: Cell, metric: str) -> str | None:
    """ "4.91×" / "6.53", with " ± std" over seeds; None for a missing cell."""
    if cell.mean is None:
        return None
    unit = "×" if metric == "speedup" else ""
    text = f"{cell.mean:.2f}{unit}"
    return text + (f" ± {cell.std:.2f}" if cell.std is not None else "")


def to_markdown(table: Table) -> str:
    """The table as a GitHub Markdown section (title, table, footnotes, notes)."""
    headers = [*table.key_headers] + [f"{benchmark_label(b)} {label}" for b in table.benchmarks for _, label in METRICS]
    align = ["---"] * len(table.key_headers) + ["---:"] * (len(headers) - len(table.key_headers))
    lines = [f"### {table.title}", "", _md_row(headers), _md_row(align)]
    section = None
    for row in table.rows:
        if row.section is not None and row.section != section:
            section = row.section
            lines.append(_md_row([f"**{section}**"] + [""] * (len(headers) - 1)))
        values = [*row.keys] + [_md_cell(table.cell(row, b, m), m) for b in table.benchmarks for m, _ in METRICS]
        lines.append(_md_row(values))
    lines.append("")
    lines += [f"{str(i).translate(SUPERSCRIPT_DIGITS)} {text}  " for i, text in enumerate(table.footnotes, start=1)]
    lines += [f"{note}  " for note in table.notes]
    return "\n".join(lines).rstrip() + "\n"


def to_latex(table: Table) -> str:
    """The table as a LaTeX `table` environment with booktabs rules."""
    keys, groups = len(table.key_headers), len(table.benchmarks)
    width = keys + groups * len(METRICS)
    spec = "l" * keys + ("r" * len(METRICS)) * groups
    group_header = " & " * (keys - 1) + "".join(
        f" & \\multicolumn{{{len(METRICS)}}}{{c}}{{{_tex(benchmark_label(b))}}}" for b in table.benchmarks
    )
    rules = " ".join(f"\\cmidrule(lr){{{keys + 1 + i * len(METRICS)}-{keys + (i + 1) * len(METRICS)}}}" for i in range(groups))
    metric_header = " & ".join(
        [*(_tex(h) for h in table.key_headers), *(_tex(label) for _ in table.benchmarks for _, label in METRICS)]
    )
    lines = [
        r"\begin{table}[t]",
        r"\centering",
        r"\small",
        f"\\caption{{{_tex(table.title)}}}",
        f"\\label{{tab:{table.name}}}",
        f"\\begin{{tabular}}{{{spec}}}",
        r"\toprule",
        group_header + r" \\",
        rules,
        metric_header + r" \\",
        r"\midrule",
    ]
    section = None
    for row in table.rows:
        if row.section is not None and row.section != section:
            if section is not None:
                lines.append(r"\midrule")
            section = row.section
            lines.append(f"\\multicolumn{{{width}}}{{l}}{{\\textit{{{_tex(section)}}}}} \\\\")
        values = [*(_tex(k) for k in row.keys)] + [
            _tex_cell(table.cell(row, b, m), m) for b in table.benchmarks for m, _ in METRICS
        ]
        lines.append(" & ".join(values) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}"]
    notes = [f"$^{{{i}}}$\\,{_tex(text)}" for i, text in enumerate(table.footnotes, start=1)] + [_tex(n) for n in table.notes]
    if notes:
        lines.append(r"\par\smallskip{\footnotesize " + r" \\ ".join(notes) + "}")
    lines.append(r"\end{table}")
    return "\n".join(lines) + "\n"


def _md_cell(cell: Cell, metric: str) -> str:
    text = format_value(cell, metric)
    mark = str(cell.note).translate(SUPERSCRIPT_DIGITS) if cell.note is not None else ""
    return (DASH if text is None else text) + mark


def _md_row(values: list[str]) -> str:
    return "| " + " | ".join(v.replace("|", "\\|") for v in values) + " |"


def _tex_cell(cell: Cell, metric: str) -> str:
    text = format_value(cell, metric)
    mark = f"\\textsuperscript{{{cell.note}}}" if cell.note is not None else ""
    return ("--" if text is None else _tex(text)) + mark


def _tex(text: str) -> str:
    return "".join(LATEX_SPECIAL.get(char, char) for char in str(text))
