"""`dflash.reports`: tables from synthetic results.json files, from a fake wandb, and the CLI."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from dflash.reports import build_tables, collect_runs, collect_wandb_runs, write_report
from dflash.reports.records import axis_value
from dflash.reports.render import to_latex, to_markdown
from helpers import REPO
from helpers.tables import (
    DEPTH_AXES,
    FakeApi,
    FakeFile,
    FakeRun,
    depth_speedup,
    depth_tau,
    make_block_size_sweep,
    make_depth_sweep,
    make_loss_sweep,
    make_main_sweep,
    results_for,
    train_config,
    wandb_config,
    write_run,
)


@pytest.fixture
def sweeps(tmp_path) -> str:
    root = str(tmp_path / "sweeps")
    for make in (make_depth_sweep, make_block_size_sweep, make_main_sweep, make_loss_sweep):
        make(root)
    return root


def _tables(root: str) -> dict:
    return {t.name: t for t in build_tables(collect_runs(root))}


def _row(table, *keys):
    return next(r for r in table.rows if r.keys == keys)


def test_one_table_per_ablation_and_target_plus_the_main_table(sweeps):
    tables = _tables(sweeps)
    assert set(tables) == {"main", "depth_tiny_code", "block_size_tiny_code", "loss_decay_tiny_code"}
    depth = tables["depth_tiny_code"]
    assert depth.key_headers == ["drafter layers"]
    assert [r.keys for r in depth.rows] == [("1",), ("3",), ("5",), ("8",)]  # numeric order
    assert depth.benchmarks == ["gsm8k", "humaneval"]  # the paper's benchmark order


def test_seeds_give_mean_and_sample_std(sweeps):
    depth = _tables(sweeps)["depth_tiny_code"]
    cell = depth.cell(_row(depth, "3"), "humaneval", "tau")
    expected = [depth_tau(3, 0), depth_tau(3, 1)]
    assert cell.values == pytest.approx(expected)
    assert cell.mean == pytest.approx(sum(expected) / 2)
    assert cell.std == pytest.approx(abs(expected[1] - expected[0]) / 2**0.5)
    speedup = depth.cell(_row(depth, "3"), "humaneval", "speedup")
    assert speedup.mean == pytest.approx((depth_speedup(3, 0) + depth_speedup(3, 1)) / 2)
    markdown = to_markdown(depth)
    assert f"{(depth_tau(3, 0) + depth_tau(3, 1)) / 2:.2f} ± 0.07" in markdown
    assert "Mean ± sample std over training seeds" in markdown


def test_missing_and_failed_cells_are_dashes_with_footnotes(sweeps):
    depth = _tables(sweeps)["depth_tiny_code"]
    not_run = depth.cell(_row(depth, "5"), "gsm8k", "tau")
    assert not_run.mean is None and depth.footnotes[not_run.note - 1] == "not run"
    # Layers 8: seed 0 finished, seed 1 failed: the value stands, with the failure as footnote.
    partial = depth.cell(_row(depth, "8"), "humaneval", "tau")
    assert partial.values == [pytest.approx(depth_tau(8, 0))]
    assert "failed: torch.OutOfMemoryError: CUDA out of memory" in depth.footnotes[partial.note - 1]
    markdown = to_markdown(depth)
    assert not_run.note == 1 and "| 5 | –¹ | –¹ |" in markdown
    assert f"{depth_tau(8, 0):.2f}²" in markdown and "² failed: torch.OutOfMemoryError" in markdown
    latex = to_latex(depth)
    assert r"--\textsuperscript{1}" in latex and r"$^{2}$\,failed: torch.OutOfMemoryError" in latex


def test_a_drafter_measured_by_two_stages_counts_once_and_unfinished_runs_are_footnoted(sweeps):
    block = _tables(sweeps)["block_size_tiny_code"]
    assert block.key_headers == ["train B", "inference B"]
    assert len(block.rows) == 9
    # The training stage measured (8, 8) too, earlier: the evaluation stage's value is kept, alone.
    diagonal = block.cell(_row(block, "8", "8"), "humaneval", "tau")
    assert diagonal.values == [pytest.approx(2.0 + 0.8 + 0.4)]
    running = block.cell(_row(block, "16", "8"), "humaneval", "tau")  # config only: still running
    assert running.mean is None and block.footnotes[running.note - 1].startswith("no result yet")
    # The accuracy curves still come from the training stage's metrics.csv (its latest version).
    trained = block.trained[(_row(block, "8", "8"), "humaneval")]
    curves = [r.accuracies["val"] for r in trained if r.accuracies]
    assert curves == [[pytest.approx(0.8 - 0.04 * k) for k in range(7)]]


def test_main_table_has_a_section_per_temperature_and_a_row_per_target_and_method(sweeps):
    main = _tables(sweeps)["main"]
    assert main.key_headers == ["Target", "Method"]
    assert [(r.section, r.keys) for r in main.rows] == [
        ("T = 0", ("Qwen3-8B", "DFlash (B=8)")),
        ("T = 0", ("tiny_code", "DFlash (B=8)")),
        ("T = 1", ("Qwen3-8B", "DFlash (B=8)")),
        ("T = 1", ("tiny_code", "DFlash (B=8)")),
    ]
    assert main.cell(main.rows[0], "humaneval", "speedup").mean == pytest.approx(6.5 * 0.75)
    markdown = to_markdown(main)
    assert "| **T = 1** |" in markdown and "| Qwen3-8B | DFlash (B=8) | –¹ | –¹ | 4.12× | 5.50 |" in markdown
    latex = to_latex(main)
    for rule in (r"\toprule", r"\midrule", r"\bottomrule", r"\cmidrule(lr){3-4}", r"\multicolumn{2}{c}{HumanEval}"):
        assert rule in latex
    assert r"\multicolumn{6}{l}{\textit{T = 1}}" in latex and "tiny\\_code" in latex


def test_axis_names_label_the_rows(sweeps):
    loss = _tables(sweeps)["loss_decay_tiny_code"]
    assert [r.keys for r in loss.rows] == [("decay",), ("uniform",)]


def test_report_writes_markdown_latex_and_the_figures(sweeps, tmp_path):
    out = tmp_path / "report"
    report = write_report(collect_runs(sweeps), str(out))
    names = sorted(os.path.basename(p) for p in report.files)
    assert "tables.md" in names and "tables.tex" in names
    for figure in (
        "tau_vs_block_size_block_size_tiny_code.png",
        "speedup_vs_depth_depth_tiny_code.png",
        "acceptance_main.png",
        "position_accuracy_depth_tiny_code.png",
    ):
        assert figure in names and (out / "plots" / figure).stat().st_size > 10_000
    # The main runs logged no training metrics: no accuracy figure for them, and no error.
    assert "position_accuracy_main.png" not in names
    assert "![tau_vs_block_size_block_size_tiny_code.png](plots/" in (out / "tables.md").read_text()


def test_a_lone_failed_run_and_an_empty_table_do_not_crash(tmp_path):
    from helpers.tables import DEPTH_AXES, train_config, write_run

    write_run(str(tmp_path / "d" / "x"), train_config("depth", "depth", DEPTH_AXES), error="RuntimeError: boom")
    (table,) = build_tables(collect_runs(str(tmp_path)))
    cell = table.cell(table.rows[0], "humaneval", "tau")
    assert cell.mean is None and "RuntimeError: boom" in table.footnotes[cell.note - 1]
    assert "–¹" in to_markdown(table)
    assert build_tables([]) == []


def _fake_wandb_project(root: str) -> FakeApi:
    """The depth runs of `root` as wandb would hold them: config, summary scalars, state."""
    runs = []
    for record in collect_runs(root):
        if record.ablation != "depth":
            continue
        summary = {f"val/acc_{k:02d}": a for k, a in enumerate(record.accuracies.get("val", []), start=1)}
        if record.status == "finished":
            summary |= {"eval/tau": record.results.tau, "eval/speedup_vs_autoregressive": record.results.speedup_vs_autoregressive}
        files = [FakeFile("results.json", record.results.to_json())] if record.status == "finished" else []
        state = {"finished": "finished", "failed": "crashed"}[record.status]
        runs.append(
            FakeRun(
                os.path.basename(record.source),
                wandb_config(record.config),
                summary,
                state,
                group=record.sweep["name"],
                files=files,
            )
        )
    return FakeApi(runs)


def _without_failure_notes(markdown: str) -> list[str]:
    return [line for line in markdown.splitlines() if "failed:" not in line]


def test_wandb_source_builds_the_same_tables(sweeps):
    api = _fake_wandb_project(sweeps)
    from_wandb = collect_wandb_runs(api, "dflash", entity="team", groups=["depth_cpu", "depth_gsm8k"])
    assert api.queries == [("team/dflash", {"group": {"$in": ["depth_cpu", "depth_gsm8k"]}})]
    (wandb_table,) = build_tables(from_wandb)
    dirs_table = _tables(sweeps)["depth_tiny_code"]
    # Equal but for where a failure is reported (a run directory vs a wandb run).
    assert _without_failure_notes(to_markdown(wandb_table)) == _without_failure_notes(to_markdown(dirs_table))
    assert "wandb run crashed" in " ".join(wandb_table.footnotes)
    curves = [r.accuracies["val"] for r in from_wandb if r.accuracies]
    assert curves and all(len(c) == 7 for c in curves)


def test_wandb_runs_without_uploaded_results_use_the_summary():
    from helpers.tables import DEPTH_AXES, train_config

    config = train_config("depth", "depth", DEPTH_AXES, drafter={"num_layers": 5, "block_size": 16})
    run = FakeRun("r1", wandb_config(config), {"eval/tau": 6.1, "eval/speedup_vs_autoregressive": 4.2}, group="depth")
    (record,) = collect_wandb_runs(FakeApi([run]), "dflash")
    assert record.status == "finished" and record.results.tau == 6.1 and record.results.speedup_vs_autoregressive == 4.2
    assert record.results.block_size == 16 and record.benchmark == "humaneval" and record.temperature == 0.0
    assert axis_value(record, DEPTH_AXES[0]) == "5" and record.results.acceptance_histogram is None


@pytest.mark.slow
def test_cli_writes_the_report_and_rejects_a_missing_root(sweeps, tmp_path):
    out = tmp_path / "out"
    run = subprocess.run(
        [sys.executable, "-m", "dflash.tables", f"root={sweeps}", f"out_dir={out}", "plots=false"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert "### Drafter depth: tiny_code, T = 0" in run.stdout
    assert (out / "tables.md").is_file() and (out / "tables.tex").is_file() and not (out / "plots").exists()
    bad = subprocess.run(
        [sys.executable, "-m", "dflash.tables", f"root={tmp_path / 'nope'}", f"out_dir={out}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 2 and bad.stderr.strip().startswith("error: root: no such directory")


def test_wandb_tables_read_what_a_training_run_logs_and_uploads(tmp_path, monkeypatch):
    """Writer (the train app's loggers) and reader (`collect_wandb_runs`) through one fake wandb."""
    import wandb

    from dflash.decoding import SamplingConfig
    from dflash.eval.results import GenerationRecord, build_results
    from dflash.training.after_train import log_evaluation
    from dflash.training.settings import LoggerSettings
    from dflash.training.trainer import build_loggers, finish_loggers
    from helpers.tables import DEPTH_AXES, FakeWandbRun, train_config

    experiment = FakeWandbRun()
    monkeypatch.setattr(wandb, "init", experiment.started)
    config = train_config("depth_cpu", "depth", DEPTH_AXES, drafter={"num_layers": 3, "block_size": 4})
    # a Hydra run directory name with glob characters, as list-valued overrides produce
    run_dir = tmp_path / "drafter.target_layer_ids=[1,3],seed=0"
    loggers = build_loggers(LoggerSettings(kind="wandb", group="depth_cpu"), str(run_dir), config)
    loggers[0].log_metrics({"val/acc_01": 0.7, "val/acc_02": 0.4, "val/acc_03": 0.2}, step=9)
    records = [
        GenerationRecord(0, 0, 5, {"autoregressive": [1] * 9, "dflash": [1] * 9}, {"autoregressive": 2.0, "dflash": 1.0}, [4, 1, 3])
    ]
    results = build_results(
        records, benchmark="humaneval", target="/art/targets/tiny_code", drafter=str(run_dir / "drafter"), block_size=4,
        drafter_block_size=4, sampling=SamplingConfig(), max_new_tokens=9, stop_token_ids=[0], device="cpu", config=config,
    )  # fmt: skip
    log_evaluation(loggers, results.write(str(run_dir / "results.json")), step=10)
    finish_loggers(loggers)

    (record,) = collect_wandb_runs(FakeApi([experiment.as_api_run()]), "dflash", groups=["depth_cpu"])
    assert record.status == "finished" and record.config == config
    assert record.results == results  # the uploaded results.json, in full
    assert record.results.acceptance_histogram == [1, 0, 1, 1] and record.results.tau == pytest.approx(8 / 3)
    assert record.accuracies == {"val": [0.7, 0.4, 0.2]}
    (table,) = build_tables([record])
    assert table.cell(table.rows[0], "humaneval", "tau").mean == pytest.approx(8 / 3)


def test_a_mixed_benchmark_gets_a_column_per_family_beside_the_pooled_one(tmp_path):
    root = str(tmp_path / "sweeps")
    for layers in (1, 3):
        for seed in (0, 1):
            config = train_config("depth_smollm2", "depth", DEPTH_AXES, seed=seed, benchmark="smollm2_mix",
                                  drafter={"num_layers": layers})  # fmt: skip
            results = results_for(config, 1.5 + 0.1 * layers, 1.0)
            # per family: HumanEval slower to accept than math
            results["families"] = {
                family: {**results_for(config, tau + 0.1 * layers + 0.01 * seed, speed), "num_prompts": 6}
                for family, tau, speed in (("humaneval", 1.2, 0.9), ("math", 1.8, 1.3))
            }
            write_run(os.path.join(root, "depth_smollm2", f"drafter.num_layers={layers},seed={seed}"), config, results)
    (table,) = build_tables(collect_runs(root))
    assert table.benchmarks == ["humaneval", "math", "smollm2_mix"]
    assert table.cell(_row(table, "3"), "math", "tau").values == pytest.approx([2.1, 2.11])
    assert table.cell(_row(table, "1"), "humaneval", "speedup").values == [0.9, 0.9]
    assert table.cell(_row(table, "1"), "smollm2_mix", "tau").values == [1.6, 1.6]
    markdown = to_markdown(table)
    assert "Math (held out)" in markdown and "All three" in markdown and "HumanEval" in markdown


def test_acceptance_is_drawn_as_the_share_of_steps_emitting_at_least_k():
    from dflash.reports.plots import at_least

    assert at_least([6, 3, 1]) == [1.0, 0.4, 0.1]  # 10 steps: all emit >= 1, 4 emit >= 2, 1 emits 3


def test_compared_panels_share_one_y_range_under_constrained_layout():
    from matplotlib.layout_engine import ConstrainedLayoutEngine

    from dflash.reports.plots import _panels

    fig, axes = _panels(3, width=3, height=2, sharey=True)
    axes[0].plot([0, 1], [0, 5])
    axes[2].plot([0, 1], [0, 1])
    assert isinstance(fig.get_layout_engine(), ConstrainedLayoutEngine)
    assert axes[2].get_ylim() == axes[0].get_ylim()
