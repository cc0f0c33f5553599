"""Anchor positions: where training blocks open.

Invariants (docs/design.md invariant 9): an anchor `a` is valid iff the loss mask is on at `a`
(it is an assistant token, so a block would open there at inference) and at least one
of positions a+1 .. a+B-1 inside the sequence is a training target. Sequences with
fewer valid positions than requested get all of them; a sequence with none gets only
masked-out padding blocks (`block_valid` False) and contributes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class Anchors:
    """Anchor positions of a batch, sorted ascending per sequence.

    positions: (b, N) long; padding entries hold 0.
    valid: (b, N) bool; False marks padding blocks.
    """

    positions: torch.Tensor
    valid: torch.Tensor


def valid_anchor_mask(loss_mask: torch.Tensor, block_size: int) -> torch.Tensor:
    """Which positions may open a block.

    Args:
        loss_mask: (b, S) bool, True on training targets.
        block_size: B >= 2.
    Returns:
        (b, S) bool: loss_mask[a] and any(loss_mask[a+1 : a+B]).
    """
    loss_mask = loss_mask.bool()
    seq_len = loss_mask.shape[1]
    # targets_ahead[a] counts targets in a+1 .. a+B-1 (cumulative sums over a zero-padded mask).
    padded = F.pad(loss_mask.long(), (0, block_size))
    cumsum = F.pad(padded.cumsum(dim=1), (1, 0))
    starts = torch.arange(seq_len, device=loss_mask.device) + 1
    targets_ahead = cumsum[:, starts + block_size - 1] - cumsum[:, starts]
    return loss_mask & (targets_ahead > 0)


def sample_anchors(
    loss_mask: torch.Tensor,
    block_size: int,
    num_anchors: int,
    mode: str = "random",
    generator: torch.Generator | None = None,
) -> Anchors:
    """Choose up to `num_anchors` anchors per sequence among the valid positions.

    "random": uniformly without replacement. "stride": every B-th valid position
    (counting valid positions) starting at the first, the first `num_anchors` of them.
    N, the width of the result, is the largest per-sequence count in the batch (at
    least 1, so a batch without any anchor still runs one masked-out block).

    Args:
        loss_mask: (b, S) bool.
        generator: RNG for "random" (on loss_mask's device); None uses the global one.
    Returns:
        Anchors with positions/valid of shape (b, N).
    """
    valid = valid_anchor_mask(loss_mask, block_size)
    batch, seq_len = valid.shape
    if mode == "random":
        scores = torch.rand(batch, seq_len, generator=generator, device=valid.device)
    elif mode == "stride":
        rank = valid.long().cumsum(dim=1) - 1
        valid = valid & (rank % block_size == 0)
        scores = torch.arange(seq_len, device=valid.device, dtype=torch.float).expand(batch, seq_len)
    else:
        raise ValueError(f"unknown anchor sampling mode {mode!r}")
    # Invalid positions sort last; the k best scores among valid positions win.
    scores = scores.masked_fill(~valid, float("inf"))
    counts = valid.sum(dim=1).clamp(max=num_anchors)
    width = max(int(counts.max()), 1)
    chosen = scores.topk(min(width, seq_len), dim=1, largest=False).indices
    chosen_valid = torch.arange(chosen.shape[1], device=valid.device) < counts.unsqueeze(1)
    # Sort ascending with padding (sentinel seq_len) at the end.
    positions = chosen.masked_fill(~chosen_valid, seq_len).sort(dim=1).values
    block_valid = positions < seq_len
    positions = positions.masked_fill(~block_valid, 0)
    return Anchors(positions=positions, valid=block_valid)
