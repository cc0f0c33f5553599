"""The engine: our lean decode forwards of targets and drafters, on CPU and CUDA, and their kernels.

Every line of engine code lives in this package, and the rest of the house calls it through
the names below alone (docs/design.md invariant 25; tests/core/test_engine_seam.py):
- `FastForward` (`forward`): a target's forward over a `StaticCache`, every weight matmul on
  the kernel measured fastest here, our attention and layer ops where they apply;
  `GraphedForward` (`graphs`): its decode steps replayed from CUDA graphs. Both follow
  `Forward`, the protocol `TargetModel` decodes through; `fast_engine_refusal` says why a
  model cannot run on it, `HOST_ROPE_TYPES` the rotaries graphs cannot capture.
- `greedy_batch` (`batched`): batched greedy generation (regeneration's path).
- `FastDrafter` (`drafter`), `GraphedDrafter` (`drafter_graphs`): the drafter's propose on
  the same kernels, and as CUDA graphs; `lean_linears` (`drafter`): any drafting module's
  linears on those kernels (DSpark's Markov head, EAGLE-3).
- `argmax`: `Tensor.argmax(-1)`, index for index, on our kernel where it is loaded;
  `apply_rope`: HF's rotary, as the drafter module and its graphs compute it.
- `kernels`: the kernel choice per row count; `native`: our C++ kernels (`csrc/`, one source
  per kernel over `csrc/vec.h`, built per instruction set: AVX-512, AVX2, NEON).
"""

from __future__ import annotations

from typing import Protocol

import torch

from dflash.engine import kernels, native
from dflash.engine.batched import greedy_batch
from dflash.engine.drafter import FastDrafter, lean_linears
from dflash.engine.drafter_graphs import GraphedDrafter
from dflash.engine.forward import FastForward, StaticCache, apply_rope, fast_engine_refusal
from dflash.engine.graphs import HOST_ROPE_TYPES, GraphedForward
from dflash.engine.kernels import argmax


class Forward(Protocol):
    """A target's decode forward (`FastForward`, `GraphedForward`)."""

    def forward(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        cache: StaticCache,
        layer_ids: list[int] | None = None,
        logits_to_keep: int = 0,
        attention_mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(logits (b, kept, V) float32, features (b, q, taps * D) or None), writing the q new
        positions into `cache` at [cache.length, cache.length + q)."""

    def kernel_path(self) -> str:
        """The kernels it runs, for the run's record."""


__all__ = [
    "HOST_ROPE_TYPES",
    "FastDrafter",
    "FastForward",
    "Forward",
    "GraphedDrafter",
    "GraphedForward",
    "StaticCache",
    "apply_rope",
    "argmax",
    "fast_engine_refusal",
    "greedy_batch",
    "kernels",
    "lean_linears",
    "native",
]
