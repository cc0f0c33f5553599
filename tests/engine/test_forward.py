"""The fast engine (dflash.engine.forward) computes what the HF forward computes, and falls
back to it with one log line where it cannot."""

import json
import logging
import os

import pytest
import torch

from dflash.decoding import generate
from dflash.engine import kernels, native
from dflash.engine.forward import StaticCache
from dflash.engine.kernels import KERNELS, Linear, tune
from dflash.target import TargetModel, crop_cache
from dflash.toy.tiny import build_tiny_target
from helpers.decoding import PROMPTS, assert_same_greedy_output, random_proposer

FAST_FAMILIES = ["llama", "qwen3", "qwen2", "mistral"]


def pair(arch: str, **overrides) -> tuple[TargetModel, TargetModel]:
    """The same tiny model behind the HF forward and behind the fast engine."""
    eager = TargetModel(*build_tiny_target(arch, seed=0, **overrides), engine="eager")
    fast = TargetModel(*build_tiny_target(arch, seed=0, **overrides), engine="fast")
    return eager, fast


# head_dim 32: our fused rotary runs too (the tiny models' 16 runs PyTorch's)
@pytest.mark.parametrize(
    ("arch", "sizes"), [(arch, {}) for arch in FAST_FAMILIES] + [("llama", {"num_heads": 2, "num_kv_heads": 1})]
)
def test_fast_forward_equals_hf_forward_over_a_growing_cache(kernel_isa, arch, sizes):
    eager, fast = pair(arch, **sizes)
    assert eager.fast is None and fast.fast is not None
    ids = torch.randint(0, 250, (1, 300), generator=torch.Generator().manual_seed(1))
    taps = [eager.num_layers - 1, 0, 1]  # out of order; the last layer's tap is the final-normed output, as HF's hidden_states[-1]
    caches = [eager.new_cache(), fast.new_cache()]
    assert isinstance(caches[1], StaticCache) and caches[1].capacity == 256  # grows below
    position = 0
    for width in (270, 1, 3, 8, 16, 2):  # the prefill, then verify widths; past the capacity
        outs = []
        for target, cache in zip((eager, fast), caches):
            positions = torch.arange(position, position + width).unsqueeze(0)
            outs.append(target.forward(ids[:, position : position + width], positions, cache, taps))
        torch.testing.assert_close(outs[1].logits, outs[0].logits, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(outs[1].features, outs[0].features, atol=1e-4, rtol=1e-4)
        # keep one position fewer than fed (a rejected draft), as verification does
        keep = position + max(1, width - 1)
        for cache in caches:
            crop_cache(cache, keep)
        position = keep
    assert caches[1].get_seq_length() == caches[0].get_seq_length()


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
@pytest.mark.parametrize("block_size", [1, 4, 8])
def test_fast_engine_decodes_the_hf_forwards_greedy_output(kernel_isa, arch, block_size):
    assert_same_greedy_output(*pair(arch), PROMPTS, block_size)


def test_fast_engine_tunes_on_first_use_and_names_its_kernels():
    _, fast = pair("qwen3")
    assert not fast.fast.prepared and fast.kernel_path == "fast: untuned"
    fast.new_cache()
    assert fast.fast.prepared
    assert fast.kernel_path.startswith("fast: float32; layers qkv ") and "head " in fast.kernel_path
    assert all(name in fast.kernel_path for name in (", o ", ", gate_up ", ", down "))  # every projection's choice
    ops = native.module()
    assert fast.kernel_path.endswith(f"; layer ops ours ({ops.isa})" if ops else "; layer ops torch")


@pytest.mark.parametrize("arch", ["gemma2", "gpt2"])
def test_unsupported_family_falls_back_with_one_log_line(arch, caplog):
    with caplog.at_level(logging.INFO, logger="dflash.target.model"):
        target = TargetModel(*build_tiny_target(arch, seed=0), engine="fast")
    lines = [r for r in caplog.records if "engine" in r.getMessage()]
    assert len(lines) == 1 and "HF forward" in lines[0].getMessage()
    assert target.fast is None and target.kernel_path == "hf"
    ids = target.tokenizer(PROMPTS[0], return_tensors="pt").input_ids
    assert len(generate(target, ids, max_new_tokens=5).output_ids) == 5


def test_a_sliding_window_target_runs_the_hf_forward():
    target = TargetModel(*build_tiny_target("qwen3", seed=0, sliding_window=16), engine="auto")
    assert target.fast is None


def test_engine_eager_keeps_the_hf_forward_and_a_bad_engine_is_one_line():
    target = TargetModel(*build_tiny_target("llama", seed=0), engine="eager")
    assert target.fast is None and target.kernel_path == "hf"
    assert not isinstance(target.new_cache(), StaticCache)
    from dflash.errors import ConfigError

    with pytest.raises(ConfigError, match="^engine: "):  # the field; load_target adds the group
        TargetModel(*build_tiny_target("llama", seed=0), engine="turbo")


def test_a_killed_kernel_build_does_not_block_the_next_one(tmp_path, monkeypatch):
    """torch's build lock file, left by a build that was killed, made every later process
    wait forever (a test run hung on it); the build directory is also per source."""
    import torch.utils.cpp_extension as cpp_extension

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    seen = []

    def fake_load(name, sources, build_directory, **_):
        seen.append((name, os.listdir(build_directory)))
        return "built"

    monkeypatch.setattr(cpp_extension, "load", fake_load)
    build = native.build.__wrapped__
    isa = native.cpu_isas()[0] if native.cpu_isas() else pytest.skip("this CPU runs none of our kernels")
    assert build(isa) == "built"
    ((name, files),) = seen
    (tmp_path / name / "lock").write_text("")  # the stale lock of a killed build
    assert build(isa) == "built"
    assert seen[1] == (name, ["dflash-build.lock"]) and name.startswith(f"dflash_kernels_{isa}_")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_every_kernel_that_runs_here_computes_the_dense_linear(kernel_isa, dtype):
    generator = torch.Generator().manual_seed(0)
    linear = Linear(torch.randn(128, 64, generator=generator).to(dtype), torch.randn(128, generator=generator).to(dtype))
    assert "ours" in linear.candidates()
    tolerance = 1e-4 if dtype == torch.float32 else 3e-2
    # every row count of one chunk and every split into two (chunks of at most 4-12 rows per
    # instruction set), prefetching ahead, and beyond AHEAD_ROWS
    for rows in (*range(1, 26), 40, 80):
        x = torch.randn(1, rows, 64, generator=generator).to(dtype)
        reference = torch.nn.functional.linear(x.double(), linear.weight.double(), linear.bias.double())
        with torch.inference_mode():
            for name, kernel in KERNELS.items():
                if name not in linear.candidates():
                    continue
                try:
                    out = kernel(linear, x)
                except RuntimeError:  # not built into this torch: tune skips it
                    continue
                assert out.shape == reference.shape
                scale = reference.abs().max()
                assert float((out.double() - reference).abs().max() / scale) < tolerance, (name, rows)


def test_tune_gives_every_row_count_a_kernel_and_dense_under_autograd():
    linears = [Linear(torch.randn(48, 32), None) for _ in range(3)]
    tune(linears, rows=(1, 4), repeats=1)
    for linear in linears:
        assert set(linear.choice) == {1, 4} and set(linear.choice.values()) <= set(KERNELS)
    weight = torch.randn(48, 32, requires_grad=True)
    linear = Linear(weight, None)
    linear.choice = {1: "onednn", 64: "onednn"}
    x = torch.randn(1, 32, requires_grad=True)
    linear(x).sum().backward()  # dense: autograd works
    assert x.grad is not None


def test_kernel_choices_are_measured_once_per_machine_and_key(tmp_path, monkeypatch):
    monkeypatch.setenv("DFLASH_KERNEL_CHOICES", str(tmp_path / "choices.json"))
    measured = []
    measure = kernels._measure
    monkeypatch.setattr(
        kernels, "_measure", lambda group, rows, repeats: measured.append(group[0].shape_key) or measure(group, rows, repeats)
    )

    def tuned(shape=(48, 32), count=3, rows=(1, 4)):
        linears = [Linear(torch.randn(*shape), None) for _ in range(count)]
        tune(linears, rows=rows, repeats=1)
        return linears

    first = tuned()
    assert len(measured) == 1
    again = tuned()  # another process's view: the same key reuses the kept choice
    assert len(measured) == 1 and again[0].choice == first[0].choice
    tuned(shape=(64, 32))  # other weights, count, row counts or threads: measured
    tuned(count=2)
    tuned(rows=(1, 8))
    threads = torch.get_num_threads()
    torch.set_num_threads(1 if threads > 1 else 2)
    try:
        tuned()
    finally:
        torch.set_num_threads(threads)
    assert len(measured) == 5
    kept = json.loads((tmp_path / "choices.json").read_text())
    key = next(key for key in kept if "48, 32" in key and ", 3, [1, 4]" in key)
    kept[key] = {"1": "no-such-kernel", "4": "dense"}  # not a candidate here: measured again
    (tmp_path / "choices.json").write_text(json.dumps(kept))
    tuned()
    assert len(measured) == 6
    monkeypatch.setenv("DFLASH_KERNEL_CHOICES", "off")
    tuned()
    tuned()
    assert len(measured) == 8


def test_fused_weights_are_shared_with_the_hf_modules():
    eager, fast = pair("llama")
    attn = fast.model.model.layers[0].self_attn
    fused = fast.fast.layers[0].qkv.weight
    assert attn.q_proj.weight.data_ptr() == fused.data_ptr()
    ids = torch.arange(10).unsqueeze(0)
    torch.testing.assert_close(fast.model(ids).logits, eager.model(ids).logits)


@pytest.mark.parametrize(
    "arch, prefill_rows, system", [("llama", 8, ""), ("qwen3", 8, ""), ("qwen3", 1, ""), ("llama", 2, "# a system turn\n")]
)
def test_batched_greedy_generation_equals_each_prompts_own_greedy_output(arch, prefill_rows, system, monkeypatch):
    """Left padding, per-row positions, the key mask, prefill groups of their own widths (1:
    each row alone), the prompts' shared start run once and stopped rows leaving the batch:
    every row continues as if alone, through its stop token, in the prompts' order; a stopped
    row never reaches the others."""
    from dflash.engine import batched

    monkeypatch.setattr(batched, "PREFILL_ROWS", prefill_rows)
    eager, fast = pair(arch)
    fast.new_cache()  # tunes
    prompts = [eager.tokenizer(system + p).input_ids for p in PROMPTS]  # 1 to 35 tokens, and the system turn's
    # the shared start, up to the shortest prompt's last token (whose logits begin its answer)
    assert batched.shared_prefix(prompts) == (min(map(len, prompts)) - 1 if system else 0)
    alone = [generate(eager, torch.tensor([p]), max_new_tokens=24).output_ids for p in prompts]
    stops = {alone[0][5], alone[2][3]}  # two rows stop early (half the batch: it compacts)

    def through_stop(out):
        ends = [i for i, token in enumerate(out) if token in stops]
        return out[: ends[0] + 1] if ends else out

    expected = [through_stop(out) for out in alone]
    assert batched.greedy_batch(fast.fast, prompts, 24, stops, pad_id=eager.tokenizer.pad_token_id) == expected


def test_regeneration_answers_alike_on_both_engines():
    from dflash.data.generators import HFGenerator

    eager, fast = (TargetModel(*build_tiny_target("qwen3", seed=0, chat_template=True), engine=e) for e in ("eager", "auto"))
    prompts = [[{"role": "user", "content": p}] for p in PROMPTS]
    answers = [HFGenerator(t, max_new_tokens=10)(prompts) for t in (eager, fast)]
    assert [(a.response_ids, a.finished, a.text) for a in answers[0]] == [(a.response_ids, a.finished, a.text) for a in answers[1]]


def test_drafts_read_a_bfloat16_head_and_the_output_stays_the_targets():
    """draft_logits: the head in bfloat16 for proposals on a float32 target (close to the
    float32 logits), and DFlash through it still emits the target's greedy output."""
    eager, fast = pair("qwen3")
    hidden = torch.randn(3, fast.hidden_size)
    assert torch.equal(fast.draft_logits(hidden), fast.logits(hidden))  # untuned engine: the float32 head
    fast.new_cache()
    assert torch.equal(fast.draft_logits(hidden), fast.logits(hidden))  # under autograd: the float32 head
    with torch.inference_mode():  # as the proposer runs
        drafted, exact = fast.draft_logits(hidden), fast.logits(hidden)
    assert fast.fast.draft_head().weight.dtype == torch.bfloat16
    assert not torch.equal(drafted, exact) and torch.allclose(drafted, exact, atol=0.05 * float(exact.abs().max()))
    with torch.inference_mode():
        assert torch.equal(eager.draft_logits(hidden), eager.logits(hidden))
    from dflash.dflash.proposer import DFlashProposer

    ids = eager.tokenizer(PROMPTS[3], return_tensors="pt").input_ids
    drafter = random_proposer(fast).drafter
    outputs = [
        generate(t, ids, max_new_tokens=30, block_size=4, proposer=DFlashProposer(drafter, t.embed, t.draft_logits)).output_ids
        for t in (eager, fast)
    ]
    assert outputs[0] == outputs[1] == generate(eager, ids, max_new_tokens=30).output_ids


def test_an_empty_static_cache_takes_the_batch_of_its_first_forward():
    eager, fast = pair("llama")
    ids = torch.randint(0, 250, (3, 12), generator=torch.Generator().manual_seed(2))
    positions = torch.arange(12).expand(3, 12)
    expected = eager.forward(ids, positions, eager.new_cache()).logits
    cache = fast.new_cache()
    torch.testing.assert_close(fast.forward(ids, positions, cache).logits, expected, atol=1e-4, rtol=1e-4)
    with pytest.raises(ValueError, match="holds 3 rows"):
        fast.forward(ids[:1, :1], positions[:1, :1], cache)
