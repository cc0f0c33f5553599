"""What a person watching a run reads besides the loss, logged at every log interval with
the train metrics (`DrafterTrainingModule.on_before_optimizer_step`): the gradient norm,
tokens per second and peak memory. The learning rate comes from Lightning's
`LearningRateMonitor` (`dflash.training.run`).

- `train/grad_norm`: the L2 norm of the drafter's whole gradient at a logged step, after
  the global loss normalisation and before clipping (what `gradient_clip_val` compares
  against); under FSDP over all ranks' shards.
- `train/tokens_per_s`: real (non-padding) tokens of all ranks trained on since the
  previous log, over the wall-clock seconds since then (sum first, divide last).
- `train/peak_mem_gib`: this process's peak memory since the previous log: CUDA memory
  allocated by torch on a GPU, the resident set size's high-water mark on the CPU
  (which never goes down).
"""

from __future__ import annotations

import resource
import sys
import time

import torch

GIB = 2**30


class StepMonitor:
    """Counts tokens between logs and measures the values above at a log step."""

    def __init__(self):
        self.tokens = 0
        self.since = time.perf_counter()

    def count(self, batch: dict) -> None:
        self.tokens += int(batch["attention_mask"].sum())

    def measure(self, gradients: list[torch.Tensor], device: torch.device, sum_over_ranks, sharded: bool) -> dict[str, float]:
        """The metrics of this log step; restarts the token count and the memory peak.

        sum_over_ranks: sums a tensor over ranks (the identity on one process).
        sharded: each rank holds a shard of the gradient (FSDP), whose squares are summed over ranks.
        """
        squares = sum((g.detach().float().pow(2).sum() for g in gradients), torch.zeros((), device=device))
        if sharded:
            squares = sum_over_ranks(squares)
        tokens = sum_over_ranks(torch.tensor(float(self.tokens), device=device))
        now = time.perf_counter()
        metrics = {
            "train/grad_norm": float(squares.sqrt()),
            "train/tokens_per_s": float(tokens) / max(now - self.since, 1e-9),
            "train/peak_mem_gib": peak_memory_gib(device),
        }
        self.tokens, self.since = 0, now
        return metrics


def peak_memory_gib(device: torch.device) -> float:
    """Peak memory since the last call on a CUDA device (then reset), or the process's peak
    resident set size on the CPU."""
    if device.type == "cuda":
        peak = torch.cuda.max_memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        return peak / GIB
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / GIB if sys.platform == "darwin" else rss * 1024 / GIB  # bytes on macOS, KiB on Linux
