"""Training measurements on this machine (prints numbers; not a test).

1. `recipe`: the tiny CPU recipe (dflash/conf/experiment/tiny_cpu.yaml) trained through the real
   `run_training` path for `--steps` optimizer steps after `--warmup` untimed ones:
   training tokens/s (real sequence tokens; and drafted block slots, N anchors x B), and
   the share of the step time spent in the frozen target's forward (`target_features`).
   Step time is measured from `on_train_batch_start` to `on_train_batch_end`
   (forward, backward, clipping, optimizer step; not data loading).
2. `attention`: one drafter forward (1 layer) over many blocks of a sequence, with the
   training block mask as a dense bool mask + SDPA, as the factored mask that CPU
   training uses (forward, and forward + backward for both), against flex_attention
   with a BlockMask (eager; and torch.compile'd with --compile-flex). Mask construction
   is timed separately from the forward. Median of interleaved repeats.

    python benchmarks/bench_training.py                          # both parts, 1 thread
    python benchmarks/bench_training.py --part attention --threads 2 --compile-flex
    python benchmarks/bench_training.py --part recipe --data artifacts/data/tiny_cpu
    python benchmarks/bench_training.py --part recipe --data artifacts/data/tiny_cpu --precision bf16-mixed

The header prints the load average: on a shared CPU the numbers are noisy.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import torch

from dflash.timing import interleaved_ms


def bench_recipe(data_path: str | None, steps: int, warmup: int, precision: str = "32-true") -> dict:
    """Tokens/s and target-forward share of the tiny CPU recipe (see module docstring)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.hydra_config import HydraConfig
    from lightning.pytorch.callbacks import Callback
    from omegaconf import open_dict

    import dflash.training.module as training_module
    from dflash.cli.common import CONF_DIR
    from dflash.cli.train import job_from_config
    from dflash.training.run import run_training

    workdir = tempfile.mkdtemp(prefix="bench_training_")
    if data_path is None:
        data_path = os.path.join(workdir, "chats.jsonl")
        _write_synthetic_conversations(data_path, 64)
    overrides = [
        "experiment=tiny_cpu",
        f"data.path={os.path.abspath(data_path)}",
        f"paths.artifacts={os.path.join(workdir, 'artifacts')}",
        f"paths.output_dir={os.path.join(workdir, 'run')}",
        f"trainer.max_steps={warmup + steps}",
        f"trainer.precision={precision}",
        "trainer.limit_val_batches=0",
        "trainer.enable_progress_bar=false",
        "eval.after_train=false",
        "logger=none",
    ]
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("train", overrides=overrides, return_hydra_config=True)
    HydraConfig.instance().set_config(cfg)
    with open_dict(cfg):
        del cfg["hydra"]
    job = job_from_config(cfg)

    target_seconds = [0.0]
    original = training_module.target_features

    def timed_target_features(*args, **kwargs):
        start = time.perf_counter()
        out = original(*args, **kwargs)
        target_seconds[0] += time.perf_counter() - start
        return out

    class StepTimer(Callback):
        def __init__(self):
            self.step_seconds, self.target_seconds, self.tokens, self.slots = 0.0, 0.0, 0, 0

        def on_train_batch_start(self, trainer, module, batch, batch_idx):
            self.start, self.target_start = time.perf_counter(), target_seconds[0]

        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            if trainer.global_step <= warmup:
                return
            self.step_seconds += time.perf_counter() - self.start
            self.target_seconds += target_seconds[0] - self.target_start
            self.tokens += int(batch["attention_mask"].sum())
            self.slots += batch["input_ids"].shape[0] * job.training.num_anchors * job.drafter.block_size

    timer = StepTimer()
    training_module.target_features = timed_target_features
    try:
        run_training(job, callbacks=[timer])
    finally:
        training_module.target_features = original
    return {
        "steps": steps,
        "batch_size": job.data.batch_size,
        "tokens_per_s": timer.tokens / timer.step_seconds,
        "block_slots_per_s": timer.slots / timer.step_seconds,
        "ms_per_step": 1000 * timer.step_seconds / steps,
        "target_forward_share": timer.target_seconds / timer.step_seconds,
    }


def _write_synthetic_conversations(path: str, count: int) -> None:
    import json

    with open(path, "w") as f:
        for i in range(count):
            answer = " ".join(f"w{(i * 7 + j) % 23}" for j in range(120))
            f.write(
                json.dumps({"messages": [{"role": "user", "content": f"question {i}?"}, {"role": "assistant", "content": answer}]})
                + "\n"
            )


def bench_attention(
    seq_len: int, num_anchors: int, block_size: int, hidden: int, heads: int, kv_heads: int, repeats: int, compile_flex: bool
) -> dict:
    """Milliseconds for mask construction and one 1-layer drafter forward, per kernel."""
    from torch.nn.attention.flex_attention import flex_attention

    from dflash.drafter import DFlashDrafter, DrafterConfig
    from dflash.drafter import attention as attention_module
    from dflash.toy.tiny import tiny_config
    from dflash.training.anchors import sample_anchors
    from dflash.training.forward import set_attention_implementation
    from dflash.training.masks import dense_block_mask, factored_block_mask, flex_block_mask

    config = tiny_config(
        "qwen3", hidden_size=hidden, num_heads=heads, num_kv_heads=kv_heads, intermediate_size=2 * hidden, max_positions=2 * seq_len
    )
    drafter = DFlashDrafter(
        DrafterConfig.from_target(config, num_layers=1, block_size=block_size, mask_token_id=258, num_target_features=2)
    ).eval()
    generator = torch.Generator().manual_seed(0)
    loss_mask = torch.zeros(1, seq_len, dtype=torch.bool)
    loss_mask[:, seq_len // 8 :] = True  # a prompt, then the response where anchors live
    key_is_real = torch.ones(1, seq_len, dtype=torch.bool)
    anchors = sample_anchors(loss_mask, block_size, num_anchors, "random", generator).positions
    num_queries = anchors.shape[1] * block_size
    block_embeds = torch.randn(1, num_queries, hidden, generator=generator)
    block_positions = (anchors.unsqueeze(-1) + torch.arange(block_size)).reshape(1, -1)
    features = torch.randn(1, seq_len, 2 * hidden, generator=generator)
    context_positions = torch.arange(seq_len).unsqueeze(0)

    def forward(implementation: str, mask) -> torch.Tensor:
        set_attention_implementation(drafter, implementation)
        with torch.no_grad():
            return drafter(block_embeds, block_positions, features, context_positions, mask=mask)

    def forward_backward(mask) -> None:
        set_attention_implementation(drafter, "sdpa")
        drafter.zero_grad(set_to_none=True)
        drafter(block_embeds, block_positions, features, context_positions, mask=mask).square().mean().backward()

    dense = dense_block_mask(anchors, key_is_real, block_size)
    factored = factored_block_mask(anchors, key_is_real, block_size)
    block_mask = flex_block_mask(anchors, key_is_real, block_size)
    steps = {
        "dense_mask_build": lambda: dense_block_mask(anchors, key_is_real, block_size),
        "factored_mask_build": lambda: factored_block_mask(anchors, key_is_real, block_size),
        "flex_block_mask_build": lambda: flex_block_mask(anchors, key_is_real, block_size),
        "sdpa_dense_forward": lambda: forward("sdpa", dense),
        "sdpa_factored_forward": lambda: forward("sdpa", factored),
        "flex_eager_forward": lambda: forward("flex_attention", block_mask),
        "sdpa_dense_forward_backward": lambda: forward_backward(dense),
        "sdpa_factored_forward_backward": lambda: forward_backward(factored),
    }
    compile_seconds = None
    if compile_flex:
        compiled = torch.compile(flex_attention, dynamic=False)
        eager = attention_module._flex

        def compiled_forward() -> torch.Tensor:
            attention_module._flex = lambda q, k, v, mask, scale: compiled(q, k, v, block_mask=mask, scale=scale, enable_gqa=True)
            try:
                return forward("flex_attention", block_mask)
            finally:
                attention_module._flex = eager

        start = time.perf_counter()
        compiled_forward()
        compile_seconds = time.perf_counter() - start
        steps["flex_compiled_forward"] = compiled_forward
    reference = forward("sdpa", dense)
    max_abs_diff = {
        "sdpa_factored": float((forward("sdpa", factored) - reference).abs().max()),
        "flex_eager": float((forward("flex_attention", block_mask) - reference).abs().max()),
    }
    if compile_flex:
        max_abs_diff["flex_compiled"] = float((compiled_forward() - reference).abs().max())
    times = interleaved_ms(steps, repeats, warmup=1)
    kv_len = seq_len + num_queries
    density = float(dense.float().mean())
    return {
        "queries": num_queries,
        "keys": kv_len,
        "mask_density": density,
        "dense_mask_mib": dense.numel() / 2**20,
        "compile_seconds": compile_seconds,
        "max_abs_diff_vs_sdpa": max_abs_diff,
        **{f"{name}_ms": value for name, value in times.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=["all", "recipe", "attention"], default="all")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--data", default=None, help="conversations for the recipe (default: synthetic)")
    parser.add_argument("--precision", default="32-true", help="trainer precision for the recipe (e.g. bf16-mixed)")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--anchors", type=int, default=256)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--compile-flex", action="store_true", help="also time torch.compile'd flex_attention")
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {args.threads} thread(s), {os.cpu_count()} CPUs, load average {os.getloadavg()}")
    if args.part in ("all", "recipe"):
        result = bench_recipe(args.data, args.steps, args.warmup, args.precision)
        print(
            f"tiny recipe ({args.precision}): {result['tokens_per_s']:.0f} tokens/s ({result['block_slots_per_s']:.0f} block slots/s), "
            f"{result['ms_per_step']:.1f} ms/step at batch {result['batch_size']}, "
            f"target forward {100 * result['target_forward_share']:.1f}% of the step ({result['steps']} steps)"
        )
    if args.part in ("all", "attention"):
        result = bench_attention(
            args.seq_len, args.anchors, args.block_size, args.hidden, args.heads, args.kv_heads, args.repeats, args.compile_flex
        )
        print(
            f"drafter forward, S={args.seq_len}, {args.anchors} anchors x B={args.block_size}: "
            f"{result['queries']} queries x {result['keys']} keys, mask density {result['mask_density']:.3f}, "
            f"dense mask {result['dense_mask_mib']:.0f} MiB (bool); hidden {args.hidden}, {args.heads} heads, 1 layer"
        )
        for name, value in result.items():
            if name.endswith("_ms"):
                print(f"  {name[:-3]:<24} {value:9.1f} ms")
        print(f"  max |output - sdpa output|: {result['max_abs_diff_vs_sdpa']}")
        if result["compile_seconds"] is not None:
            print(f"  flex compile (first call)  {result['compile_seconds']:.1f} s")


if __name__ == "__main__":
    main()
