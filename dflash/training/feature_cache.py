"""An in-memory cache of the frozen target's states per training sequence.

The target is frozen and a sequence is the same every epoch, so the states a training step
reads are the same every time, up to the floating-point effect of the batch's padding width.
With `training.target_cache_gib > 0` the training module keeps them after a sequence's first
forward and builds later batches from memory.

Invariants:
- Keys are the batch's `row_index` (see `dflash.data.datamodule`): a sequence's index in
  the tokenised rows, the same on every rank and in every epoch.
- Only real positions are kept, (length, F) per sequence; the padding positions of a batch
  built from the cache are zero (the block mask hides padding keys, as it hides the
  garbage a forward computes there).
- The cache never holds more than its budget: once full, sequences not in it are computed
  every step (one log line says so); a batch with any sequence missing is computed whole.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch

log = logging.getLogger(__name__)


class TargetStateCache:
    """Target states per sequence, on the device they were computed on.

    Args:
        budget_bytes: most bytes of states to keep (> 0).
    """

    def __init__(self, budget_bytes: int):
        self.budget_bytes = int(budget_bytes)
        self.used_bytes = 0
        self.hits = 0  # batches built from the cache
        self.misses = 0  # batches computed
        self._states: dict[int, torch.Tensor] = {}
        self._warned_full = False
        self._warned_unkeyed = False

    def __len__(self) -> int:
        return len(self._states)

    def get(
        self, row_index: torch.Tensor | None, attention_mask: torch.Tensor, compute: Callable[[], torch.Tensor]
    ) -> torch.Tensor:
        """The batch's target states, from memory when every sequence is cached.

        Args:
            row_index: (b,) long, the batch's sequence keys; None (a batch from a loader
                other than DFlashDataModule) computes every time, with one warning.
            attention_mask: (b, S) bool, right-padded (True on real tokens).
            compute: runs the target on the batch; returns (b, S, F).
        Returns:
            (b, S, F): `compute()`'s result, or the cached rows with zeros on padding.
        """
        if row_index is None:
            if not self._warned_unkeyed:
                self._warned_unkeyed = True
                log.warning(
                    "training.target_cache_gib is set but the batches carry no row_index "
                    "(DFlashDataModule adds it): the target runs on every batch"
                )
            return compute()
        keys = row_index.tolist()
        lengths = attention_mask.sum(1).tolist()
        if keys and all(key in self._states for key in keys):
            self.hits += 1
            first = self._states[keys[0]]
            states = first.new_zeros((len(keys), attention_mask.shape[1], first.shape[-1]))
            for i, key in enumerate(keys):
                states[i, : lengths[i]] = self._states[key]
            return states
        self.misses += 1
        states = compute()
        for i, key in enumerate(keys):
            if key in self._states:
                continue
            row = states[i, : lengths[i]].detach().clone()
            size = row.numel() * row.element_size()
            if self.used_bytes + size > self.budget_bytes:
                if not self._warned_full:
                    self._warned_full = True
                    log.warning(
                        "target state cache full (%.2f GiB, %d sequences): the rest are computed every step; "
                        "raise training.target_cache_gib to keep them all",
                        self.used_bytes / 2**30,
                        len(self._states),
                    )
                continue
            self._states[key] = row
            self.used_bytes += size
        return states
