"""Peak memory and time of the block loss, dense against vocabulary-chunked (prints; not a test).

At the paper's shapes (vocabulary 151,936 as Qwen3's, 512 anchors x block 16, sequence
3072) with a narrow hidden size (256), each variant runs in a fresh subprocess, which
reports its peak resident memory (ru_maxrss) before and after the measured work:

- `loss`: `block_loss` forward + backward on random drafter hidden states, float32;
- `step`: one training step of `DrafterTrainingModule` (target forward, drafter forward,
  loss, backward) on a random 6-layer target of that vocabulary and width (2 taps).

    PYTHONPATH=$PWD python benchmarks/bench_memory.py                      # loss, dense and chunked
    PYTHONPATH=$PWD python benchmarks/bench_memory.py --what step --variants dense 256
    PYTHONPATH=$PWD python benchmarks/bench_memory.py --loss kl --variants 256 1024

Variants: `dense` (`training.loss_chunk_rows=null`) or a number of rows per chunk.
Numbers from a shared machine are noisy; compare variants of one run.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

VOCAB, HIDDEN, SEQ_LEN, ANCHORS, BLOCK = 151_936, 256, 3072, 512, 16


def peak_rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


def cpu_seconds() -> float:
    """User + system CPU time of this process: less sensitive than wall time to other jobs."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _blocks(seq_len: int, generator):
    """Blocks of `ANCHORS` random anchors of one sequence whose every token is a target."""
    import torch

    from dflash.training.anchors import sample_anchors
    from dflash.training.blocks import build_blocks

    input_ids = torch.randint(0, VOCAB, (1, seq_len), generator=generator)
    loss_mask = torch.ones(1, seq_len, dtype=torch.bool)
    loss_mask[:, :16] = False  # a short prompt
    anchors = sample_anchors(loss_mask, BLOCK, ANCHORS, "random", generator)
    return input_ids, loss_mask, build_blocks(input_ids, loss_mask, anchors, BLOCK, VOCAB - 1)


def run_loss(chunk_rows: int | None, objective: str, repeats: int) -> dict:
    import torch

    from dflash.training.loss import LossSettings, block_loss

    generator = torch.Generator().manual_seed(0)
    _, _, blocks = _blocks(SEQ_LEN, generator)
    head = torch.nn.Linear(HIDDEN, VOCAB, bias=False).requires_grad_(False)
    hidden = torch.randn(1, ANCHORS * BLOCK, HIDDEN, generator=generator, requires_grad=True)
    target_hidden = torch.randn(1, SEQ_LEN, HIDDEN, generator=generator)
    settings = LossSettings(block_size=BLOCK, objective=objective, gamma=7.0, chunk_rows=chunk_rows)
    before, seconds, cpu = peak_rss_gb(), [], []
    for _ in range(repeats):
        start, cpu_start = time.perf_counter(), cpu_seconds()
        result = block_loss(hidden, head, blocks, settings, target_hidden)
        result.loss.backward()
        seconds.append(time.perf_counter() - start)
        cpu.append(cpu_seconds() - cpu_start)
        hidden.grad = None
    return {"rows": int(blocks.label_valid.sum()), "rss_before_gb": before, "seconds": min(seconds), "cpu_seconds": min(cpu)}


def run_step(chunk_rows: int | None, objective: str, repeats: int) -> dict:
    import tempfile

    import torch

    from dflash.dflash.objective import DFlashObjective
    from dflash.specs import DrafterSpec, TargetSpec, load_target
    from dflash.toy.tiny import save_tiny_target
    from dflash.training import DrafterTrainingModule
    from dflash.training.config import TrainingSettings

    directory = tempfile.mkdtemp(prefix="bench_memory_target_")
    save_tiny_target(directory, "qwen3", vocab_size=VOCAB, hidden_size=HIDDEN, num_layers=6, max_positions=4096)
    training = TrainingSettings(num_anchors=ANCHORS, loss=objective, loss_chunk_rows=chunk_rows)
    drafter = DrafterSpec(num_layers=1, block_size=BLOCK, num_target_features=2)
    target = load_target(TargetSpec(path=directory, dtype="float32"))
    module = DrafterTrainingModule(target, DFlashObjective(target, drafter, training), training, {})
    generator = torch.Generator().manual_seed(0)
    input_ids, loss_mask, _ = _blocks(SEQ_LEN, generator)
    batch = {"input_ids": input_ids, "loss_mask": loss_mask, "attention_mask": torch.ones_like(loss_mask)}
    before, seconds, cpu = peak_rss_gb(), [], []
    for _ in range(repeats):
        start, cpu_start = time.perf_counter(), cpu_seconds()
        result = module.compute_loss(batch, torch.Generator().manual_seed(0))
        result.loss.backward()
        seconds.append(time.perf_counter() - start)
        cpu.append(cpu_seconds() - cpu_start)
        module.zero_grad()
    return {"rows": int(result.slots.numel()), "rss_before_gb": before, "seconds": min(seconds), "cpu_seconds": min(cpu)}


def child(args) -> None:
    import torch

    torch.set_num_threads(args.threads)
    chunk_rows = None if args.child == "dense" else int(args.child)
    measure = run_loss if args.what == "loss" else run_step
    out = measure(chunk_rows, args.loss, args.repeats)
    out["peak_rss_gb"] = peak_rss_gb()
    print(json.dumps(out))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--what", choices=("loss", "step"), default="loss")
    parser.add_argument("--loss", choices=("ce", "kl", "ce_target_argmax"), default="ce")
    parser.add_argument("--variants", nargs="+", default=["dense", "256"])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args)
    print(
        f"{args.what} forward+backward, loss={args.loss}: vocab {VOCAB}, hidden {HIDDEN}, sequence {SEQ_LEN}, "
        f"{ANCHORS} anchors x B={BLOCK}, float32, {args.threads} thread(s), best of {args.repeats}"
    )
    print(f"{'variant':>8} {'rows':>6} {'RSS before':>11} {'peak RSS':>9} {'added':>7} {'wall s':>7} {'CPU s':>6}")
    for variant in args.variants:
        command = [
            sys.executable,
            __file__,
            "--child",
            variant,
            "--what",
            args.what,
            "--loss",
            args.loss,
            "--threads",
            str(args.threads),
            "--repeats",
            str(args.repeats),
        ]
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            print(f"{variant:>8} failed: {done.stderr.strip().splitlines()[-1] if done.stderr.strip() else done.returncode}")
            continue
        out = json.loads(done.stdout.strip().splitlines()[-1])
        added = out["peak_rss_gb"] - out["rss_before_gb"]
        print(
            f"{variant:>8} {out['rows']:>6} {out['rss_before_gb']:>9.2f}GB {out['peak_rss_gb']:>7.2f}GB "
            f"{added:>5.2f}GB {out['seconds']:>7.1f} {out['cpu_seconds']:>6.1f}"
        )


if __name__ == "__main__":
    main()
