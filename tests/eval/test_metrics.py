"""Both aggregations of tau and speedup (pooled / the paper's harness), in results.json,
the printed summary and the tables (`metric=`)."""

from __future__ import annotations

import json

import pytest

from dflash.decoding import SamplingConfig
from dflash.errors import ConfigError
from dflash.eval import DecodingSettings, EvalSettings, Sample, evaluate, format_results
from dflash.eval.results import GenerationRecord, build_results
from dflash.reports import build_tables, collect_runs, collect_wandb_runs
from dflash.reports.render import to_markdown
from dflash.specs import DrafterSpec, build_drafter
from helpers.tables import DEPTH_AXES, FakeApi, FakeRun, results_for, train_config, wandb_config, write_run


def record(index, tokens, lengths, ar_split, dflash_split, hf_seconds=None) -> GenerationRecord:
    """A generation where every method emitted `tokens` tokens; splits are (prefill, decode) seconds."""
    rec = GenerationRecord(index, 0, 5, acceptance_lengths=list(lengths))
    for method, (prefill, decode) in (("autoregressive", ar_split), ("dflash", dflash_split)):
        rec.outputs[method] = list(range(tokens))
        rec.times_s[method] = prefill + decode
        rec.prefill_times_s[method], rec.decode_times_s[method] = prefill, decode
    if hf_seconds is not None:
        rec.outputs["hf_generate"], rec.times_s["hf_generate"] = list(range(tokens)), hf_seconds
    return rec


# Generation 0: 10 tokens in 2 steps (tau 4.5); generation 1: 20 tokens in 19 steps (tau 1);
# generation 2: a single token from prefill, no verify step. Decode per token:
# autoregressive 0.15, 0.15, 0 s; DFlash 0.05, 0.10, 0 s.
RECORDS = [
    record(0, 10, [4, 5], ar_split=(0.5, 1.5), dflash_split=(0.5, 0.5), hf_seconds=2.5),
    record(1, 20, [1] * 19, ar_split=(1.0, 3.0), dflash_split=(1.0, 2.0), hf_seconds=4.0),
    record(2, 1, [], ar_split=(0.1, 0.0), dflash_split=(0.1, 0.0), hf_seconds=0.2),
]


def built(records=RECORDS, tmp_path=None):
    """`build_results` of `records`; given `tmp_path`, the dictionary of the file it writes there."""
    results = build_results(
        records, benchmark="b", target="t", drafter="d", block_size=8, drafter_block_size=8,
        sampling=SamplingConfig(), max_new_tokens=20, stop_token_ids=[0], device="cpu",
    )  # fmt: skip
    if tmp_path is None:
        return results
    return json.load(open(results.write(str(tmp_path / "results.json"))))


def test_pooled_tau_weighs_steps_the_per_prompt_mean_weighs_generations(tmp_path):
    results = built(tmp_path=tmp_path)
    assert results["tau"] == pytest.approx((9 + 19) / (2 + 19))
    assert results["tau_per_prompt_mean"] == pytest.approx((4.5 + 1.0) / 2)  # generation 2 has no step


def test_end_to_end_speedup_counts_prefill_the_decode_only_one_does_not(tmp_path):
    results = built(tmp_path=tmp_path)
    # end to end: summed seconds (equal token counts): 6.1 s autoregressive, 4.1 s DFlash
    assert results["speedup"]["vs_autoregressive"] == pytest.approx(6.1 / 4.1)
    assert results["speedup"]["vs_hf_generate"] == pytest.approx(6.7 / 4.1)
    # decode only: mean per-generation decode time per token, 0.1 s vs 0.05 s
    assert results["speedup_decode_only"] == {"vs_autoregressive": pytest.approx(2.0)}
    first = results["per_prompt"][0]
    assert first["prefill_time_s"] == {"autoregressive": 0.5, "dflash": 0.5}
    assert first["decode_time_s"] == {"autoregressive": 1.5, "dflash": 0.5}
    assert first["time_s"] == {"autoregressive": 2.0, "dflash": 1.0, "hf_generate": 2.5}


def test_summary_prints_both_aggregations_labelled():
    text = format_results(built())
    assert "pooled over all verify steps: 1.333" in text
    assert "mean of per-generation means (the DFlash paper's harness): 2.750" in text
    assert "end to end (summed time per output token, prefill included): 1.49x" in text
    assert "decode only (mean per-generation time per output token, prefill excluded; the paper's): 2.00x" in text


def test_an_evaluation_records_both_and_they_follow_from_per_prompt(qwen3_target, tmp_path):
    """float32: lossless, no divergence; the harness numbers recomputed from results.json alone."""
    drafter = build_drafter(DrafterSpec(num_layers=1, num_target_features=2, block_size=4), qwen3_target)
    samples = [Sample(turns=["def add(a, b):"], index=0), Sample(turns=["Hello"], index=1)]
    settings = EvalSettings(decoding=DecodingSettings(max_new_tokens=10), hf_generate=False, warmup_tokens=0)
    results = evaluate(qwen3_target, drafter, samples, settings, progress=False)
    results = json.load(open(results.write(str(tmp_path / "results.json"))))
    assert results["target_dtype"] == "float32"
    assert results["lossless"] is True and results["lossless_up_to_ties"] is True
    assert results["divergences"] == {"numerical": 0, "bug": 0, "details": []}
    assert results["hf_generate_divergences"] is None
    per_prompt = results["per_prompt"]
    for entry in per_prompt:
        for method in ("autoregressive", "dflash"):
            total = entry["prefill_time_s"][method] + entry["decode_time_s"][method]
            assert total == pytest.approx(entry["time_s"][method])
    stepped = [p["tau"] for p in per_prompt if p["num_tokens"]["dflash"] > 1]
    assert results["tau_per_prompt_mean"] == pytest.approx(sum(stepped) / len(stepped))

    def per_token(method):
        return sum(p["decode_time_s"][method] / p["num_tokens"][method] for p in per_prompt) / len(per_prompt)

    decode_only = results["speedup_decode_only"]["vs_autoregressive"]
    assert decode_only == pytest.approx(per_token("autoregressive") / per_token("dflash"))


# ---------------------------------------------------------------- tables: metric=pooled | paper


def depth_run(root, layers: int, paper: tuple[float, float] | None) -> None:
    """A finished depth run: pooled tau 2.0 + layers, speedup 1.5; `paper` = (tau, decode-only speedup) or old results."""
    config = train_config("depth", "depth", DEPTH_AXES, drafter={"num_layers": layers})
    results = results_for(config, tau=2.0 + layers, speedup=1.5)
    if paper is not None:
        results["tau_per_prompt_mean"], results["speedup_decode_only"] = paper[0], {"vs_autoregressive": paper[1]}
    write_run(str(root / f"layers={layers}"), config, results)


def test_tables_show_the_chosen_aggregation_and_name_a_missing_field(tmp_path):
    depth_run(tmp_path, 1, paper=(5.5, 3.25))
    depth_run(tmp_path, 3, paper=None)  # results.json from before the paper's aggregation existed
    failed_seed = train_config("depth", "depth", DEPTH_AXES, seed=1, drafter={"num_layers": 3})
    write_run(str(tmp_path / "layers=3,seed=1"), failed_seed, error="RuntimeError: boom")
    records = collect_runs(str(tmp_path))
    (pooled,) = build_tables(records)
    (paper,) = build_tables(records, metric="paper")
    first, old = pooled.rows
    assert (pooled.cell(first, "humaneval", "tau").mean, pooled.cell(first, "humaneval", "speedup").mean) == (3.0, 1.5)
    assert pooled.cell(old, "humaneval", "tau").mean == 5.0
    assert (paper.cell(first, "humaneval", "tau").mean, paper.cell(first, "humaneval", "speedup").mean) == (5.5, 3.25)
    missing = paper.cell(old, "humaneval", "tau")
    assert missing.mean is None and paper.footnotes[missing.note - 1] == "not measured: the results have no tau_per_prompt_mean"
    markdown = to_markdown(paper)
    assert "| 1 | 3.25× | 5.50 |" in markdown and "as the DFlash paper's harness" in markdown
    # the failed seed's footnote marks values that stand without it: none under metric=paper
    assert not any("boom" in note for note in paper.footnotes)
    assert "RuntimeError: boom" in pooled.footnotes[pooled.cell(old, "humaneval", "tau").note - 1]
    assert "speedup_decode_only.vs_autoregressive" in markdown
    assert "pooled over all verify steps" in to_markdown(pooled)
    assert paper.axis_label("speedup").startswith("decode-only") and pooled.axis_label("tau").startswith("τ pooled")
    with pytest.raises(ConfigError) as info:
        build_tables(records, metric="median")
    assert info.value.key == "metric"


def test_wandb_summaries_carry_the_paper_aggregation():
    config = train_config("depth", "depth", DEPTH_AXES, drafter={"num_layers": 2})
    summary = {"eval/tau": 3.0, "eval/tau_per_prompt_mean": 4.5, "eval/speedup_vs_autoregressive": 1.2,
               "eval/speedup_decode_only_vs_autoregressive": 1.8}  # fmt: skip
    (table,) = build_tables(collect_wandb_runs(FakeApi([FakeRun("r", wandb_config(config), summary)]), "p"), "paper")
    (row,) = table.rows
    assert (table.cell(row, "humaneval", "tau").mean, table.cell(row, "humaneval", "speedup").mean) == (4.5, 1.8)


def test_tables_cli_rejects_an_unknown_metric(tmp_path):
    from dflash.schema import TablesAppConfig

    with pytest.raises(ConfigError, match="choose one of \\['pooled', 'paper'\\]") as info:
        TablesAppConfig(root=str(tmp_path), metric="paperish")
    assert info.value.key == "metric"


FILE_KEYS = [
    "benchmark", "benchmark_source", "method", "target", "target_dtype", "kernel_path", "drafter", "block_size",
    "drafter_block_size", "temperature", "top_p", "top_k", "verify_rule", "max_new_tokens", "num_prompts",
    "num_generations", "tau", "tau_per_prompt_mean", "acceptance_histogram", "tokens_per_s", "speedup",
    "speedup_decode_only", "lossless", "first_mismatch", "lossless_up_to_ties", "divergences", "hf_generate_matches",
    "hf_generate_first_mismatch", "hf_generate_divergences", "methods", "families", "stop_token_ids", "per_prompt",
    "device", "versions", "timestamp", "config",
]  # fmt: skip


def test_results_file_round_trips_through_the_typed_record_unchanged(tmp_path):
    from dflash.layout import Results

    path = tmp_path / "results.json"
    text = open(built().write(str(path))).read()
    assert list(json.loads(text)) == FILE_KEYS  # the file's keys, in the file's order (docs/results-file.md)
    results = Results.read(str(path))
    assert results.tau == pytest.approx((9 + 19) / (2 + 19)) and results.speedup["vs_autoregressive"] > 1
    assert open(results.write(str(tmp_path / "again.json"))).read() == text
    # a file written before a field existed reads it as None; a key it does not know is left out
    old = Results.from_json({"tau": 2.5, "benchmark": "b", "unknown": 1})
    assert (old.tau, old.benchmark, old.methods) == (2.5, "b", None) and "unknown" not in old.to_json()
