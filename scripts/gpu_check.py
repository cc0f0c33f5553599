"""One-command check of the GPU paths (`make gpu-check`): writes a Markdown report.

Randomly initialised targets from the Qwen3-8B and Llama-3.1-8B configs (full width,
`--layers` decoder layers, no download), in bf16 on CUDA:

a. one drafter training step (target features, blocks, drafter forward + backward, loss)
   under three attention paths of the training block mask: SDPA with the dense mask (the
   reference), SDPA with the factored mask (CPU training) and flex_attention with a
   BlockMask (CUDA training; compiled there): loss and gradient norms within a stated
   tolerance, step time and peak memory, at sequence 3072, 512 anchors, block 16;
b. decode-loop efficiency through `dflash.decoding.generate`: a proposer double
   whose draft slots are right with probability p (it runs the real drafter for the cost
   and then drafts from the target's own greedy output), measured speedup against the
   bound tau * t(1) / (t(B) + t_draft) for B in {4, 8, 16};
c. greedy losslessness against HF `generate()` on small random targets (float32 exact;
   bf16 divergences classified by `dflash.eval.divergence.diagnose`), on CUDA also with
   `target.engine=graphs`;
d. flex_attention compiled by torch.compile against the factored SDPA path on the
   training mask, and flash-attn if installed;
e. CUDA graphs (`target.engine=graphs`, `dflash.engine.graphs`): target forwards of 1-16
   tokens on HF's forward, the fast forward and its graphs, against the kernels' own time
   and the bandwidth floor, and our decode loop on each, for a cut Qwen3-8B and a whole
   SmolLM2-135M (random weights).

Every section catches its own failure and writes it as one line (its traceback on stderr).
Without CUDA the same script runs tiny float32 shapes in seconds, graphs uncaptured
(tests/e2e/test_gpu_check.py).

    PYTHONPATH=$PWD python3 scripts/gpu_check.py --out docs/results/gpu-check.md   # a few minutes on an H100
    PYTHONPATH=$PWD python3 scripts/gpu_check.py --quick                            # fewer repeats and tokens
"""

from __future__ import annotations

import argparse
import datetime
import gc
import importlib.util
import math
import os
import platform
import statistics
import sys
import time
import traceback
import warnings
from dataclasses import dataclass

import torch

from dflash.timing import timed

# Hub config values (Qwen/Qwen3-8B, meta-llama/Llama-3.1-8B-Instruct config.json); depth is cut by --layers.
FAMILIES = {
    "qwen3-8b": dict(
        arch="qwen3", hidden_size=4096, intermediate_size=12288, num_attention_heads=32, num_key_value_heads=8,
        head_dim=128, vocab_size=151936, rms_norm_eps=1e-6, max_position_embeddings=40960, rope_theta=1000000.0,
        tie_word_embeddings=False, num_hidden_layers=36,
    ),
    "llama-3.1-8b": dict(
        arch="llama", hidden_size=4096, intermediate_size=14336, num_attention_heads=32, num_key_value_heads=8,
        head_dim=128, vocab_size=128256, rms_norm_eps=1e-5, max_position_embeddings=131072, tie_word_embeddings=False,
        rope_scaling={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
        num_hidden_layers=32,
    ),
    # whole depth in section e (a small target is the most host-bound one)
    "smollm2-135m": dict(
        arch="llama", hidden_size=576, intermediate_size=1536, num_attention_heads=9, num_key_value_heads=3, head_dim=64,
        vocab_size=49152, rms_norm_eps=1e-5, max_position_embeddings=8192, rope_theta=100000.0, tie_word_embeddings=True,
        num_hidden_layers=30,
    ),
}  # fmt: skip
#: families of sections a and b unless --families says otherwise
DEFAULT_FAMILIES = ("qwen3-8b", "llama-3.1-8b")
#: section e's targets: (family, whole depth on CUDA)
GRAPH_TARGETS = (("qwen3-8b", False), ("smollm2-135m", True))
GRAPH_WIDTHS = (1, 2, 3, 4, 8, 16)
# CPU stand-ins: the same families at toy width.
TINY_WIDTH = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=512)

# Relative tolerances of the training-path comparison (section a), per compute dtype.
TOLERANCE = {
    torch.bfloat16: {"hidden": 2e-2, "loss": 2e-2, "grad": 5e-2},
    torch.float32: {"hidden": 1e-5, "loss": 1e-5, "grad": 1e-4},
}
BLOCK_SIZES = (4, 8, 16)


@dataclass
class Sizes:
    """Shapes of one run: target/drafter depth; training sequence, anchors, block size and
    timed repeats (a); decode prompt and new tokens (b); losslessness tokens and prompts (c)."""

    layers: int
    drafter_layers: int
    seq_len: int
    num_anchors: int
    block_size: int
    repeats: int
    prompt_len: int
    new_tokens: int
    lossless_tokens: int
    lossless_prompts: int


def sizes_for(device: torch.device, quick: bool, layers: int | None) -> Sizes:
    """The paper's training shapes on CUDA (`quick`: one repeat, fewer tokens); toy shapes on CPU."""
    if device.type == "cuda":
        sizes = Sizes(4, 5, 3072, 512, 16, 1 if quick else 3, 256, 64 if quick else 192, 48 if quick else 96, 2 if quick else 4)
    else:
        sizes = Sizes(2, 1, 96, 8, 16, 1, 16, 24, 16, 1)
    if layers is not None:
        sizes.layers = layers
    return sizes


# ---------------------------------------------------------------------------- comparison helpers


def relative_difference(reference: float, value: float) -> float:
    """|value - reference| / max(|reference|, tiny); inf when either is not finite."""
    if not (math.isfinite(reference) and math.isfinite(value)):
        return math.inf
    return abs(value - reference) / max(abs(reference), 1e-12)


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def compare_training(reference: dict, candidate: dict, tolerance: dict) -> tuple[bool, str]:
    """PASS/FAIL of one training path against the reference: the drafter's hidden states
    (relative Frobenius distance), the loss and every gradient norm within their relative
    tolerance. Dicts: {"loss": float, "grads": {name: norm} (empty: forward only),
    "hidden": (b, N*B, D) tensor}."""
    reference_hidden, hidden = reference["hidden"].float(), candidate["hidden"].float()
    hidden_diff = float((hidden - reference_hidden).norm() / reference_hidden.norm().clamp_min(1e-12))
    hidden_diff = hidden_diff if math.isfinite(hidden_diff) else math.inf
    worst_loss = relative_difference(reference["loss"], candidate["loss"])
    ok = worst_loss <= tolerance["loss"] and hidden_diff <= tolerance["hidden"]
    text = f"hidden rel diff {hidden_diff:.2e} (tol {tolerance['hidden']:.0e}), loss rel diff {worst_loss:.2e} (tol {tolerance['loss']:.0e})"
    if candidate.get("grads") and reference.get("grads"):
        worst_grad = max(relative_difference(reference["grads"][n], candidate["grads"][n]) for n in reference["grads"])
        ok = ok and worst_grad <= tolerance["grad"]
        text += f", worst grad-norm rel diff {worst_grad:.2e} (tol {tolerance['grad']:.0e})"
    else:
        text += ", no gradients (forward only)"
    return ok, text


def lossless_verdict(dtype: torch.dtype, kinds: list[str]) -> bool:
    """float32 must match HF generate token for token; lower precision may part only at near-ties."""
    if dtype == torch.float32:
        return not kinds
    return all(kind == "numerical" for kind in kinds)


# ---------------------------------------------------------------------------- models


def build_target(family: str, layers: int, device: torch.device, dtype: torch.dtype, tiny: bool):
    """A random `TargetModel` of `family` cut to `layers` decoder layers (built directly on `device`)."""
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen3Config

    from dflash.target import TargetModel

    values = dict(FAMILIES[family], num_hidden_layers=layers)
    arch = values.pop("arch")
    if tiny:
        values.update(TINY_WIDTH)
    values.setdefault("eos_token_id", values["vocab_size"] - 2)
    config = (Qwen3Config if arch == "qwen3" else LlamaConfig)(**values)
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="sdpa")
    return TargetModel(model)


def build_drafter(target, layers: int, block_size: int, dtype: torch.dtype):
    """A random DFlash drafter as wide as `target` tapping 5 layers spread over its (cut) depth."""
    from dflash.drafter.config import DrafterConfig
    from dflash.drafter.io import place_drafter
    from dflash.drafter.model import DFlashDrafter

    depth = target.num_layers
    taps = [round(i * (depth - 1) / 4) for i in range(5)]
    config = DrafterConfig.from_target(
        target.config,
        num_layers=layers,
        block_size=block_size,
        mask_token_id=target.config.vocab_size - 1,
        target_layer_ids=taps,
    )
    torch.manual_seed(1)
    with torch.device(target.device):
        drafter = DFlashDrafter(config)
    return place_drafter(drafter, target.device, dtype)  # weights in dtype, rotary frequencies in float32


# ---------------------------------------------------------------------------- a. training step


def training_objective(target, drafter, num_anchors: int):
    """The trainer's own `DFlashObjective` (defaults of the `training` group, `num_anchors`
    anchors) on a copy of `drafter`, read back from a drafter directory as `drafter.path`."""
    import tempfile

    from dflash.dflash.objective import DFlashObjective
    from dflash.drafter import save_drafter
    from dflash.specs import DrafterSpec
    from dflash.training.config import TrainingSettings

    with tempfile.TemporaryDirectory() as directory:
        save_drafter(drafter, directory)
        return DFlashObjective(target, DrafterSpec(path=directory), TrainingSettings(num_anchors=num_anchors))


def training_step(target, objective, batch: dict, path: str, backward: bool) -> dict:
    """One training step's loss, gradient norms and drafter hidden states, as the trainer
    computes them (`objective.loss`: anchors, blocks, block mask, position-weighted loss), under
    attention `path`: "factored" (SDPA, the trainer's off CUDA), "flex" (flex_attention, the
    trainer's on CUDA) or "dense" (SDPA with a dense bool mask for the factored one: the reference)."""
    import contextlib
    from unittest import mock

    from dflash.training import forward
    from dflash.training.masks import dense_block_mask

    drafter = objective.drafter
    forward.set_attention_implementation(drafter, "flex_attention" if path == "flex" else "sdpa")
    drafter.zero_grad(set_to_none=True)
    states = forward.target_features(target, batch["input_ids"], objective.taps())
    generator = torch.Generator(device=target.device).manual_seed(0)
    hidden = []
    hook = drafter.register_forward_hook(lambda module, inputs, output: hidden.append(output.detach()))
    dense = mock.patch.object(forward, "factored_block_mask", dense_block_mask) if path == "dense" else contextlib.nullcontext()
    # the trainer's precision: float32 weights (the drafter spec's default) computing in the
    # target's dtype under autocast, as `trainer.precision=bf16-mixed` (conf/trainer/gpu.yaml) runs them
    mixed = torch.autocast(target.device.type, dtype=target.dtype, enabled=target.dtype != torch.float32)
    try:
        with torch.set_grad_enabled(backward), dense, mixed:
            loss = objective.loss(target, batch, states, generator, full_vocab=True).loss
    finally:
        hook.remove()
    grads = {}
    if backward:
        loss.backward()
        named = {"fc": drafter.fc.weight, "layer0.q_proj": drafter.layers[0].self_attn.q_proj.weight,
                 "last.down_proj": drafter.layers[-1].mlp.down_proj.weight}  # fmt: skip
        grads = {name: float(p.grad.float().norm()) for name, p in named.items()}
        grads["all"] = float(torch.linalg.vector_norm(torch.stack([p.grad.float().norm() for p in drafter.parameters()])))
    return {"loss": float(loss.detach()), "grads": grads, "hidden": hidden[0]}


def training_batch(sizes: Sizes, vocab: int, device: torch.device) -> dict:
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(0, vocab - 2, (1, sizes.seq_len), generator=generator).to(device)
    loss_mask = torch.zeros_like(input_ids, dtype=torch.bool)
    loss_mask[:, sizes.seq_len // 8 :] = True  # a prompt, then the response the anchors live in
    return {"input_ids": input_ids, "loss_mask": loss_mask, "attention_mask": torch.ones_like(loss_mask)}


def section_training(family: str, target, drafter, sizes: Sizes, device: torch.device, dtype: torch.dtype) -> list[str]:
    batch = training_batch(sizes, target.config.vocab_size, device)
    objective = training_objective(target, drafter, sizes.num_anchors)
    cuda = device.type == "cuda"
    precision = "float32 weights under bfloat16 autocast (the trainer's bf16-mixed)" if dtype == torch.bfloat16 else str(dtype)
    lines = [
        f"Sequence {sizes.seq_len}, {sizes.num_anchors} anchors x block {sizes.block_size}, batch 1, "
        f"drafter {sizes.drafter_layers} layers, {precision}; time = median of {sizes.repeats} steps after one warm-up "
        "(target forward + drafter forward + backward); peak = torch.cuda.max_memory_allocated during the step (in brackets: above the resident weights).",
        "",
        "| path | loss | grad norm (all) | step ms | peak GiB | vs reference |",
        "|---|---|---|---|---|---|",
    ]
    results, checks = {}, []
    for path in ("dense", "factored", "flex"):
        backward = cuda or path != "flex"  # flex_attention has no CPU backward
        try:
            training_step(target, objective, batch, path, backward)  # warm-up (and compile)
            times, peak, resident = [], 0.0, 0.0
            for _ in range(sizes.repeats):
                if cuda:
                    torch.cuda.reset_peak_memory_stats(device)
                    resident = torch.cuda.memory_allocated(device) / 2**30
                result, seconds = timed(
                    lambda path=path, backward=backward: training_step(target, objective, batch, path, backward), device
                )
                times.append(seconds)
                if cuda:
                    peak = max(peak, torch.cuda.max_memory_allocated(device) / 2**30)
            # The dense mask is the reference; should it fail (its (N*B)^2 scores at full size), the factored one.
            reference = next(iter(results), None)
            results[path] = result
            comparison = "reference"
            if reference is not None:
                ok, text = compare_training(results[reference], result, TOLERANCE[dtype])
                comparison = f"{verdict(ok)}: {text}"
                checks.append(f"- {path} vs {reference}: {comparison}")
            grad = f"{result['grads']['all']:.4g}" if result["grads"] else "forward only"
            peak_text = f"{peak:.2f} ({peak - resident:.2f})" if cuda else "n/a (CPU)"
            lines.append(
                f"| {path} | {result['loss']:.6g} | {grad} | {statistics.median(times) * 1e3:.1f} | {peak_text} | {comparison.split(':')[0]} |"
            )
        except Exception as error:  # one path failing must not lose the others
            lines.append(f"| {path} | FAILED: {one_line(error)} | | | | |")
        objective.drafter.zero_grad(set_to_none=True)
        free_memory()  # after the except block, which kept the failed step's tensors alive
    return lines + [""] + checks


# ---------------------------------------------------------------------------- b. decode efficiency


class ControlledAcceptanceProposer:
    """Proposer double with controlled acceptance: each draft slot is the target's greedy
    token with probability `p` (else a wrong one), independently per slot, so greedy
    verification accepts the leading run of right slots: E[tau] = 1 + sum_k p^k.

    It reads the greedy tokens from `reference`, the target's own greedy output of the
    prompt (`generate`, block 1). When the committed output parts from it (in bf16 a
    verify forward can break a near-tie the other way), it regenerates the reference from
    the committed tokens; `resync_seconds` is that time, for callers to subtract from the
    loop's. With `drafter_proposer` it first runs that real drafter on the block, so the
    drafting cost is real; `draft_seconds` sums it.
    """

    def __init__(self, target, reference: list[int], prompt_len: int, max_new_tokens: int, p: float,
                 drafter_proposer=None, seed: int = 0):  # fmt: skip
        self.target, self.reference, self.prompt_len, self.p = target, reference, prompt_len, p
        self.max_new_tokens = max_new_tokens
        self.vocab = target.lm_head.out_features
        self.drafter_proposer = drafter_proposer
        self.target_layer_ids = drafter_proposer.target_layer_ids if drafter_proposer is not None else None
        self.generator = torch.Generator().manual_seed(seed)
        self.draft_seconds = self.resync_seconds = 0.0
        self.calls = self.resyncs = 0

    def reset(self) -> None:
        if self.drafter_proposer is not None:
            self.drafter_proposer.reset()

    def draft(self, committed_ids, new_features, block_size, num_drafts, sampling, generator):
        from dflash.decoding.verify import propose_tokens

        return propose_tokens(self.propose(committed_ids, new_features, block_size, num_drafts), sampling, generator)

    def propose(self, committed_ids, new_features, block_size, num_drafts):
        from dflash.decoding import generate

        device = committed_ids.device
        if self.drafter_proposer is not None:
            _, seconds = timed(lambda: self.drafter_proposer.propose(committed_ids, new_features, block_size, num_drafts), device)
            self.draft_seconds += seconds
        self.calls += 1
        emitted = committed_ids[0, self.prompt_len :].tolist()
        if emitted != self.reference[: len(emitted)]:
            rest = self.max_new_tokens - len(emitted)
            continuation, seconds = timed(lambda: generate(self.target, committed_ids, max_new_tokens=rest).output_ids, device)
            self.reference = emitted + continuation
            self.resync_seconds += seconds
            self.resyncs += 1
        logits = torch.full((num_drafts, self.vocab), -1e4, device=device)
        for slot in range(num_drafts):
            index = len(emitted) + slot
            right = self.reference[index] if index < len(self.reference) else 0
            keep = index < len(self.reference) and float(torch.rand(1, generator=self.generator)) < self.p
            logits[slot, right if keep else (right + 1) % self.vocab] = 0.0
        return logits


def verify_forward_seconds(target, prompt: torch.Tensor, length: int, layer_ids, repeats: int) -> float:
    """Median seconds of one target forward of `length` new tokens after the prompt's cache,
    under the decode loop's attention kernels."""
    from dflash.target.cache import crop_cache, decode_attention

    device = target.device
    prompt_len = prompt.shape[1]
    cache = target.new_cache()
    target.forward(prompt, torch.arange(prompt_len, device=device).unsqueeze(0), cache, logits_to_keep=1)
    ids = prompt[:, -length:]
    positions = torch.arange(prompt_len, prompt_len + length, device=device).unsqueeze(0)
    times = []
    with decode_attention():
        for _ in range(repeats + 1):
            _, seconds = timed(lambda: target.forward(ids, positions, cache, layer_ids), device)
            crop_cache(cache, prompt_len)
            times.append(seconds)
    return statistics.median(times[1:])


def section_decoding(target, drafter, sizes: Sizes, p: float) -> list[str]:
    from dflash.decoding import generate
    from dflash.dflash.proposer import DFlashProposer
    from dflash.training.forward import set_attention_implementation

    set_attention_implementation(drafter, "sdpa")  # decoding: one block, unmasked
    device = target.device
    vocab = target.lm_head.out_features
    prompt = torch.randint(0, vocab - 2, (1, sizes.prompt_len), generator=torch.Generator().manual_seed(2)).to(device)
    generate(target, prompt, max_new_tokens=8)  # warm-up
    baseline = generate(target, prompt, max_new_tokens=sizes.new_tokens)
    per_token_ar = baseline.decode_time_s / max(1, len(baseline.output_ids) - 1)
    t1 = verify_forward_seconds(target, prompt, 1, None, 5)
    lines = [
        f"Prompt {sizes.prompt_len} random tokens, {sizes.new_tokens} new tokens, greedy, batch 1; draft slots right with "
        f"p = {p} each; the double runs the real {sizes.drafter_layers}-layer drafter for the cost. "
        "tau counts the bonus token. Speedup = autoregressive decode time per token / speculative one (prefill excluded). "
        "Bound = tau x t(1) / (t(B) + t_draft), t = median target forward (B tokens, features tapped) after the prompt. "
        "The double's own bookkeeping (a host sync, B small writes) counts in the measured time; a resync (the output "
        "parted from the double's reference at a bf16 near-tie; the reference is regenerated) does not.",
        "",
        f"Autoregressive: {per_token_ar * 1e3:.2f} ms/token; t(1) = {t1 * 1e3:.2f} ms.",
        "",
        "| B | expected tau | tau | t(B) ms | t_draft ms | bound | measured speedup | measured / bound | resyncs |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for block_size in BLOCK_SIZES:
        try:
            proposer = DFlashProposer(drafter, target.embed, target.logits)
            double = ControlledAcceptanceProposer(target, baseline.output_ids, sizes.prompt_len, 8, p, proposer)
            generate(target, prompt, max_new_tokens=8, block_size=block_size, proposer=double)  # warm-up
            double = ControlledAcceptanceProposer(target, baseline.output_ids, sizes.prompt_len, sizes.new_tokens, p, proposer)
            result = generate(target, prompt, max_new_tokens=sizes.new_tokens, block_size=block_size, proposer=double)
            t_block = verify_forward_seconds(target, prompt, block_size, double.target_layer_ids, 5)
            t_draft = double.draft_seconds / max(1, double.calls)
            expected = 1 + sum(p**k for k in range(1, block_size))
            bound = result.tau * t1 / (t_block + t_draft)
            decode_seconds = result.decode_time_s - double.resync_seconds
            speedup = per_token_ar / (decode_seconds / max(1, len(result.output_ids) - 1))
            lines.append(f"| {block_size} | {expected:.2f} | {result.tau:.2f} | {t_block * 1e3:.2f} | {t_draft * 1e3:.2f} | "
                         f"{bound:.2f}x | {speedup:.2f}x | {speedup / bound:.2f} | {double.resyncs} |")  # fmt: skip
        except Exception as error:
            lines.append(f"| {block_size} | FAILED: {one_line(error)} | | | | | | | |")
    return lines


# ---------------------------------------------------------------------------- c. losslessness


def section_lossless(sizes: Sizes, device: torch.device) -> list[str]:
    from dflash.decoding import generate
    from dflash.eval.divergence import diagnose, first_difference, hf_generate_logits, replay_logits
    from dflash.target import TargetModel
    from dflash.toy.tiny import build_tiny_target

    dtypes = [torch.float32, torch.bfloat16]
    # the default forward (HF's on CUDA, the fast engine on CPU), and on CUDA the graphs path too
    engines = ["auto", "graphs"] if device.type == "cuda" else ["auto"]
    lines = [
        f"Tiny random targets (dflash.toy.tiny, sharpened head), {sizes.lossless_prompts} random prompts x "
        f"{sizes.lossless_tokens} tokens, greedy. Candidates: the engine's autoregressive loop and speculative decoding "
        f"with the controlled double (p = 0.7) at B in {list(BLOCK_SIZES)}, each against HF generate() (on CUDA, on the "
        "default forward and again as CUDA graphs, `target.engine=graphs`). float32 must be "
        "exact; in bf16 a divergence is allowed only at a near-tie (dflash.eval.divergence.diagnose: 'numerical').",
        "",
    ]
    for arch in ("qwen3", "llama"):
        model, tokenizer = build_tiny_target(arch, seed=0)
        for dtype, engine in [(d, e) for d in dtypes for e in engines]:
            try:
                target = TargetModel(model.to(device=device, dtype=dtype), tokenizer, engine=engine)
                eos = tokenizer.eos_token_id
                options = dict(eos_token_id=eos, pad_token_id=tokenizer.pad_token_id, do_sample=False)
                kinds, runs, gaps = [], 0, []
                for index in range(sizes.lossless_prompts):
                    ids = torch.randint(0, 256, (1, 12), generator=torch.Generator().manual_seed(index)).to(device)
                    expected = target.model.generate(
                        ids, attention_mask=torch.ones_like(ids), max_new_tokens=sizes.lossless_tokens, **options
                    )
                    expected = expected[0, ids.shape[1] :].tolist()
                    baseline = generate(target, ids, max_new_tokens=sizes.lossless_tokens, stop_token_ids=[eos])
                    for block_size in (1,) + BLOCK_SIZES:
                        double = ControlledAcceptanceProposer(target, baseline.output_ids, ids.shape[1], sizes.lossless_tokens, 0.7)
                        run = baseline if block_size == 1 else generate(
                            target, ids, max_new_tokens=sizes.lossless_tokens, block_size=block_size, proposer=double,
                            stop_token_ids=[eos])  # fmt: skip
                        runs += 1
                        position = first_difference(expected, run.output_ids)
                        if position is None:
                            continue
                        inside = position < min(len(expected), len(run.output_ids))
                        hf_logits = hf_generate_logits(target, ids, position, options) if inside else None
                        our_logits = replay_logits(target, ids, run.steps, position) if inside else None
                        entry = diagnose(position, expected[position] if position < len(expected) else None,
                                         run.output_ids[position] if position < len(run.output_ids) else None,
                                         hf_logits, our_logits, dtype)  # fmt: skip
                        kinds.append(entry["kind"])
                        if entry["candidate"] is not None:
                            gaps.append(
                                f"B={block_size} pos {position}: gap {entry['candidate']['gap']:.3g} (tol {entry['tolerance']:.3g}, {entry['kind']})"
                            )
                ok = lossless_verdict(dtype, kinds)
                detail = "; ".join(gaps[:4]) if gaps else ""
                label = f"{arch} {str(dtype).removeprefix('torch.')}" + ("" if engine == "auto" else f" ({engine})")
                lines.append(f"- {label}: {verdict(ok)}: {runs} outputs, "
                             f"{len(kinds)} diverged ({kinds.count('numerical')} near-tie, {kinds.count('bug')} bug) {detail}".rstrip())  # fmt: skip
            except Exception as error:
                lines.append(f"- {arch} {dtype} ({engine}): FAILED: {one_line(error)}")
    return lines


# ---------------------------------------------------------------------------- d. kernels


def section_kernels(sizes: Sizes, device: torch.device, dtype: torch.dtype, compile_on_cpu: bool) -> list[str]:
    from dflash.drafter.attention import FactoredBlockMask, attend
    from dflash.drafter.attention import _compiled_flex as compiled_flex  # the kernel CUDA training uses
    from dflash.training.anchors import sample_anchors
    from dflash.training.masks import factored_block_mask, flex_block_mask

    heads, kv_heads, head_dim = (32, 8, 128) if device.type == "cuda" else (4, 2, 16)
    lines = []
    batch = training_batch(sizes, 1000, device)
    anchors = sample_anchors(
        batch["loss_mask"], sizes.block_size, sizes.num_anchors, "random", torch.Generator(device=device).manual_seed(0)
    )
    queries = anchors.positions.shape[1] * sizes.block_size
    generator = torch.Generator(device=device).manual_seed(3)

    def tensor(*shape):
        return torch.randn(*shape, device=device, dtype=dtype, generator=generator).requires_grad_()

    q = tensor(1, heads, queries, head_dim)
    k, v = tensor(1, kv_heads, sizes.seq_len + queries, head_dim), tensor(1, kv_heads, sizes.seq_len + queries, head_dim)
    try:
        if device.type != "cuda" and not compile_on_cpu:
            lines.append("- compiled flex_attention: skipped on CPU (pass --compile-on-cpu to try inductor's CPU backend)")
        else:
            factored: FactoredBlockMask = factored_block_mask(anchors.positions, batch["attention_mask"], sizes.block_size)
            block_mask = flex_block_mask(anchors.positions, batch["attention_mask"], sizes.block_size)
            kernel = compiled_flex()
            scale = head_dim**-0.5

            def run(fn):
                out = fn()
                out.float().square().mean().backward()
                return out.detach()

            ref = run(lambda: attend(q, k, v, factored, "sdpa"))
            _, compile_seconds = timed(
                lambda: run(lambda: kernel(q, k, v, block_mask=block_mask, scale=scale, enable_gqa=True)), device
            )
            out, flex_seconds = timed(
                lambda: run(lambda: kernel(q, k, v, block_mask=block_mask, scale=scale, enable_gqa=True)), device
            )
            _, sdpa_seconds = timed(lambda: run(lambda: attend(q, k, v, factored, "sdpa")), device)
            diff = float((out.float() - ref.float()).abs().max())
            tol = 2e-2 if dtype == torch.bfloat16 else 1e-4
            lines.append(f"- compiled flex_attention vs factored SDPA on the training mask ({heads} heads, {queries} queries, "
                         f"{sizes.seq_len} context; forward + backward): {verdict(diff <= tol)}: max abs diff {diff:.2e} (tol {tol:.0e}); "
                         f"first call (compile) {compile_seconds:.1f} s, then {flex_seconds * 1e3:.1f} ms vs SDPA {sdpa_seconds * 1e3:.1f} ms")  # fmt: skip
    except Exception as error:
        lines.append(f"- compiled flex_attention: FAILED: {one_line(error)}")
    try:
        if importlib.util.find_spec("flash_attn") is None:
            lines.append("- flash-attn: not installed")
        elif device.type != "cuda":
            lines.append("- flash-attn: installed, skipped without CUDA")
        else:
            with torch.no_grad():
                qd, kd, vd = q[:, :, : sizes.block_size].detach(), k.detach(), v.detach()
                ref = attend(qd, kd, vd, None, "sdpa")
                out, seconds = timed(lambda: attend(qd, kd, vd, None, "flash_attention_2"), device)
                out, seconds = timed(lambda: attend(qd, kd, vd, None, "flash_attention_2"), device)
                diff = float((out.float() - ref.float()).abs().max())
            lines.append(f"- flash-attn (decoding: one block of {sizes.block_size} over {kd.shape[2]} keys): "
                         f"{verdict(diff <= 2e-2)}: max abs diff vs SDPA {diff:.2e}; {seconds * 1e3:.2f} ms")  # fmt: skip
    except Exception as error:
        lines.append(f"- flash-attn: FAILED: {one_line(error)}")
    return lines


# ---------------------------------------------------------------------------- e. CUDA graphs


def kernel_ms(target, prompt: torch.Tensor, width: int, layer_ids, repeats: int = 3) -> float | None:
    """Milliseconds of GPU kernels (and copies) per target forward of `width` tokens after the
    prompt, summed from torch.profiler's device events; None without CUDA or events."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    from dflash.target.cache import crop_cache, decode_attention

    if target.device.type != "cuda":
        return None
    prompt_len = prompt.shape[1]
    cache = target.new_cache()
    target.forward(prompt, torch.arange(prompt_len, device=target.device).unsqueeze(0), cache, logits_to_keep=1)
    ids, positions = prompt[:, -width:], torch.arange(prompt_len, prompt_len + width, device=target.device).unsqueeze(0)
    with decode_attention():
        target.forward(ids, positions, cache, layer_ids)  # warm-up (a graph's capture)
        crop_cache(cache, prompt_len)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(repeats):
                target.forward(ids, positions, cache, layer_ids)
                crop_cache(cache, prompt_len)
            torch.cuda.synchronize()
    microseconds = sum(e.time_range.elapsed_us() for e in prof.events() if e.device_type == DeviceType.CUDA)
    return microseconds / repeats / 1000 if microseconds else None


def propose_ms(proposer, target, prompt: torch.Tensor, block_size: int, repeats: int = 10) -> float:
    """Median milliseconds of one propose of a block after one new context position, the
    prompt's other positions already in the drafter's cache (as a decode step proposes)."""
    from dflash.target.cache import decode_attention

    length = prompt.shape[1]
    positions = torch.arange(length, device=target.device).unsqueeze(0)
    features = target.forward(prompt, positions, target.new_cache(), proposer.target_layer_ids, logits_to_keep=1).features
    proposer.reset()
    times = []
    with decode_attention():
        proposer.propose(prompt, features[:, : length - 1], block_size, block_size - 1)
        for _ in range(repeats + 1):  # the first: the graph's capture
            proposer.cache.crop(length - 2)
            _, seconds = timed(
                lambda: proposer.propose(prompt, features[:, length - 2 : length - 1], block_size, block_size - 1), target.device
            )
            times.append(seconds)
    return 1000 * statistics.median(times[1:])


def decode_ms(target, prompt: torch.Tensor, tokens: int, proposer=None, block_size: int = 1) -> tuple[float, list[int]]:
    """(milliseconds per decode step, the output) of our loop, after a warm-up run."""
    from dflash.decoding import generate

    options = dict(max_new_tokens=tokens, block_size=block_size, proposer=proposer)
    generate(target, prompt, **options)
    result = generate(target, prompt, **options)
    return 1000 * result.decode_time_s / max(1, len(result.steps) - 1), result.output_ids


def section_graphs(sizes: Sizes, device: torch.device, dtype: torch.dtype) -> list[str]:
    import copy

    from dflash.dflash.proposer import DFlashProposer
    from dflash.engine import GraphedForward
    from dflash.target import TargetModel
    from dflash.training.forward import set_attention_implementation

    cuda = device.type == "cuda"
    lines = [
        f"Random targets, {dtype}, batch 1, after a {sizes.prompt_len}-token prompt. t(B): median wall time of one target "
        "forward of B tokens (features tapped for B > 1), synchronised, on HF's forward (DynamicCache), the fast forward "
        "(`target.engine=fast`: static cache, fused projections) and the same replayed as CUDA graphs "
        "(`target.engine=graphs`); kernels: the GPU kernels' own time per forward of the graphs path (torch.profiler's "
        "device events); floor: weight bytes / measured copy bandwidth. Decode: our loop per step, autoregressive and "
        f"with a random {sizes.drafter_layers}-layer DFlash drafter at B = 16 (tau about 1: a step's time is its cost; "
        "on the graphs path the drafter proposes through CUDA graphs too, `dflash.engine.drafter_graphs`). Same output: the graphs "
        "path's greedy tokens against the fast forward's (in bfloat16 a near-tie can part them: section c classifies).",
        "",
    ]
    from dflash.bench import read_bandwidth, weight_bytes

    if cuda:
        bandwidth = read_bandwidth(device)
        lines += [f"Measured copy bandwidth {bandwidth / 1e12:.2f} TB/s.", ""]
    for family, whole in GRAPH_TARGETS:
        layers = FAMILIES[family]["num_hidden_layers"] if whole and cuda else sizes.layers
        model = build_target(family, layers, device, dtype, tiny=not cuda).model
        base, fast = TargetModel(model, engine="eager"), TargetModel(model, engine="fast")
        graphed = copy.copy(fast)
        graphed.graphs = GraphedForward(fast.fast)  # uncaptured on CPU
        fast.new_cache()  # tunes (untimed)
        vocab = base.lm_head.out_features
        prompt = torch.randint(0, vocab - 2, (1, sizes.prompt_len), generator=torch.Generator().manual_seed(2)).to(device)
        taps = [round(i * (layers - 1) / 4) for i in range(5)]
        nbytes = weight_bytes(base)
        floor = f"{1000 * nbytes / bandwidth:.2f}" if cuda else "n/a"
        lines += [
            f"**{family}**, {layers} layers, {nbytes / 1e9:.2f} GB of weights; floor {floor} ms",
            "",
            "| B | HF t(B) ms | fast t(B) ms | graphs t(B) ms | kernels of fast ms | kernels of graphs ms | graphs / kernels | graphs / floor |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for width in GRAPH_WIDTHS:
            chosen = taps if width > 1 else None
            times = [verify_forward_seconds(t, prompt, width, chosen, 10) * 1000 for t in (base, fast, graphed)]
            kernels = [kernel_ms(t, prompt, width, chosen) for t in (fast, graphed)]
            shown = ["n/a" if k is None else f"{k:.2f}" for k in kernels]
            own = kernels[1] or kernels[0]  # a profiler that sees no kernels in a replay: the same kernels run eager
            ratio = f"{times[2] / own:.2f}" if own else "n/a"
            to_floor = f"{times[2] * bandwidth / (1000 * nbytes):.2f}" if cuda else "n/a"
            lines.append(f"| {width} | {times[0]:.2f} | {times[1]:.2f} | {times[2]:.2f} | {shown[0]} | {shown[1]} | {ratio} | {to_floor} |")  # fmt: skip
        drafter = build_drafter(fast, sizes.drafter_layers, 16, dtype)
        set_attention_implementation(drafter, "sdpa")  # decoding: one block, unmasked
        rows, outputs, proposes = [], {}, []
        for name, target in (("HF", base), ("fast", fast), ("graphs", graphed)):
            ar, outputs[(name, 1)] = decode_ms(target, prompt, sizes.new_tokens)
            proposer = DFlashProposer.for_target(drafter, target)
            step, outputs[(name, 16)] = decode_ms(target, prompt, sizes.new_tokens, proposer, 16)
            rows.append(f"{name} {ar:.2f} / {step:.2f}")
            if name != "HF":  # the drafter runs alike beside HF's forward and the fast one
                proposes.append(f"{'graphs' if name == 'graphs' else 'eager'} {propose_ms(proposer, target, prompt, 16):.2f} ms")
        same = [f"B = {b}: {'identical' if outputs[('graphs', b)] == outputs[('fast', b)] else 'DIFFERENT'}" for b in (1, 16)]
        lines += [
            "",
            f"Decode ms per step, autoregressive / DFlash B = 16: {'; '.join(rows)}. Same output: {', '.join(same)}. "
            f"The drafter's propose of 16 after one new position: {', '.join(proposes)}.",
            "",
        ]
        del model, base, fast, graphed, drafter
        free_memory()
    return lines


# ---------------------------------------------------------------------------- driver


def one_line(error: BaseException) -> str:
    message = str(error).strip().splitlines()[0] if str(error).strip() else ""
    return f"{type(error).__name__}: {message[:300]}"


def free_memory() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def progress(message: str) -> None:
    print(f"[gpu-check {time.strftime('%H:%M:%S')}] {message}", flush=True)


def machine_lines(device: torch.device) -> list[str]:
    import transformers

    gpu = (
        torch.cuda.get_device_name(device) if device.type == "cuda" else f"none (CPU: {platform.processor() or platform.machine()})"
    )
    return [
        f"- date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC}",
        f"- GPU: {gpu}",
        f"- torch {torch.__version__} (CUDA {torch.version.cuda}), transformers {transformers.__version__}, "
        f"Python {platform.python_version()}",
        f"- command: {' '.join(sys.argv)}",
    ]


def write_report(out: str, report: list[str]) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w") as handle:
        handle.write("\n".join(report) + "\n")


def run_section(report: list[str], out: str, title: str, body) -> None:
    """Append section `title` (its lines, or its failure as one line) and rewrite the report,
    so a run cut short by a time limit keeps every finished section."""
    progress(title)
    report += [f"### {title}", ""]
    start = time.perf_counter()
    try:
        report += body()
    except Exception as error:
        traceback.print_exc()
        report.append(f"FAILED: {one_line(error)}")
    free_memory()
    report += ["", f"_({time.perf_counter() - start:.1f} s)_", ""]
    write_report(out, report)


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", help="report path (default docs/results/gpu-check-<date>.md)")
    parser.add_argument("--quick", action="store_true", help="one timed repeat, fewer decoded tokens")
    parser.add_argument("--layers", type=int, help="target decoder layers kept (default 4 on CUDA, 2 on CPU)")
    parser.add_argument("--families", default=",".join(DEFAULT_FAMILIES), help=f"comma-separated, of {list(FAMILIES)}")
    parser.add_argument("--sections", default="abcde", help="which of a b c d e to run")
    parser.add_argument("--p", type=float, default=0.8, help="probability that a draft slot is right (section b)")
    parser.add_argument("--dtype", choices=["bfloat16", "float32"], help="default bfloat16 on CUDA, float32 on CPU")
    parser.add_argument("--compile-on-cpu", action="store_true", help="try torch.compile of flex_attention on CPU")
    args = parser.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = getattr(torch, args.dtype) if args.dtype else torch.bfloat16 if device.type == "cuda" else torch.float32
    if device.type == "cpu":
        # A smoke test with toy shapes: one thread avoids oversubscribing shared CI cores
        # (8x faster here at load 10), and eager flex's "not compiled" warning is expected.
        torch.set_num_threads(1)
        warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
    sizes = sizes_for(device, args.quick, args.layers)
    out = args.out or f"docs/results/gpu-check-{datetime.date.today():%Y-%m-%d}.md"
    report = ["# dflash GPU check", "", *machine_lines(device), ""]
    report.append(f"Targets: random {', '.join(args.families.split(','))} configs, {'full width' if device.type == 'cuda' else 'toy width'}, "
                  f"{sizes.layers} decoder layers, {dtype}. Re-run: `make gpu-check` or `python scripts/gpu_check.py`.")  # fmt: skip
    report.append("")
    write_report(out, report)
    start = time.perf_counter()
    for family in args.families.split(","):
        if not set(args.sections) & set("ab"):
            break
        report += [f"## {family}", ""]
        progress(f"building {family} ({sizes.layers} layers)")
        try:
            target = build_target(family, sizes.layers, device, dtype, tiny=device.type != "cuda")
            drafter = build_drafter(target, sizes.drafter_layers, sizes.block_size, dtype)
        except Exception as error:
            report += [f"FAILED to build: {one_line(error)}", ""]
            continue
        if "a" in args.sections:
            run_section(
                report,
                out,
                f"a. training step, {family}",
                lambda family=family, target=target, drafter=drafter: section_training(
                    family, target, drafter, sizes, device, dtype
                ),
            )
        if "b" in args.sections:
            run_section(
                report,
                out,
                f"b. decode-loop efficiency, {family}",
                lambda target=target, drafter=drafter: section_decoding(target, drafter, sizes, args.p),
            )
        del target, drafter
        free_memory()
    report += ["## Shared checks", ""]
    if "c" in args.sections:
        run_section(report, out, "c. greedy losslessness vs HF generate()", lambda: section_lossless(sizes, device))
    if "d" in args.sections:
        run_section(report, out, "d. kernels", lambda: section_kernels(sizes, device, dtype, args.compile_on_cpu))
    if "e" in args.sections:
        run_section(report, out, "e. CUDA graphs: step time against kernel time", lambda: section_graphs(sizes, device, dtype))
    report.append(f"Total {time.perf_counter() - start:.0f} s.")
    write_report(out, report)
    progress(f"report written to {out}")
    return out


if __name__ == "__main__":
    main()
