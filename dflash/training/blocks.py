"""Training blocks: the drafter inputs and labels of every anchor of a batch.

Invariants (docs/design.md invariants 3 and 4): the block of anchor `a` has slot k at position
a + k; slot 0 holds the anchor token input_ids[a], slots 1..B-1 the mask token; slot k
is labelled with the token AT position a + k (same-position labels) and slot 0 is never
a target. A slot's label is valid iff k >= 1, a + k < S, loss_mask[a + k] and the block
is not padding. All blocks of a sequence are laid side by side: query index j*B + k is
slot k of block j.

On-policy labels (`on_policy_blocks`): slot k is labelled with the target's greedy token
g(a + k) (its argmax after the text up to a + k - 1) and kept only while the text agrees with
greedy decoding at slots 1..k-1: verification accepts such a label (docs/design.md invariant 26).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dflash.training.anchors import Anchors


@dataclass
class Blocks:
    """Drafter inputs and labels of N blocks per sequence, flattened to N*B queries.

    token_ids: (b, N*B) long: anchor token at slot 0, mask token elsewhere.
    positions: (b, N*B) long: anchor position + slot.
    labels: (b, N*B) long: input_ids at anchor + slot (clamped inside the sequence).
    label_valid: (b, N*B) bool: which slots are training targets.
    slots: (N*B,) long: the slot index k of each query.
    """

    token_ids: torch.Tensor
    positions: torch.Tensor
    labels: torch.Tensor
    label_valid: torch.Tensor
    slots: torch.Tensor


def build_blocks(input_ids: torch.Tensor, loss_mask: torch.Tensor, anchors: Anchors, block_size: int, mask_token_id: int) -> Blocks:
    """Lay out one block per anchor.

    Args:
        input_ids: (b, S) long.
        loss_mask: (b, S) bool, True on training targets.
        anchors: positions/valid of shape (b, N).
        block_size: B.
        mask_token_id: id filling slots 1..B-1.
    """
    batch, seq_len = input_ids.shape
    num_blocks = anchors.positions.shape[1]
    slot = torch.arange(block_size, device=input_ids.device)
    positions = anchors.positions.unsqueeze(-1) + slot  # (b, N, B)
    inside = positions < seq_len
    gather_at = positions.clamp(max=seq_len - 1).view(batch, -1)
    labels = input_ids.gather(1, gather_at).view(batch, num_blocks, block_size)
    label_valid = (
        inside
        & loss_mask.bool().gather(1, gather_at).view(batch, num_blocks, block_size)
        & anchors.valid.unsqueeze(-1)
        & (slot >= 1)
    )
    token_ids = torch.full_like(labels, mask_token_id)
    token_ids[:, :, 0] = input_ids.gather(1, anchors.positions)
    return Blocks(
        token_ids=token_ids.view(batch, -1),
        positions=positions.view(batch, -1),
        labels=labels.view(batch, -1),
        label_valid=label_valid.view(batch, -1),
        slots=slot.repeat(num_blocks),
    )


def on_policy_blocks(blocks: Blocks, greedy: torch.Tensor, block_size: int) -> Blocks:
    """The blocks relabelled with the target's greedy tokens, masked where they stop being on-policy.

    Args:
        greedy: (b, N*B) long: for each slot, the target's argmax at the position before
            it (the token greedy decoding puts at a + k after the text up to a + k - 1);
            read only where `label_valid`.
    Slot k stays valid iff it was valid and every slot 1..k-1 was valid with the text's
    token equal to `greedy` there (slot 1 needs nothing); its label becomes `greedy`.
    """
    batch = blocks.labels.shape[0]
    valid = blocks.label_valid.view(batch, -1, block_size)
    agree = valid & (greedy.view_as(valid) == blocks.labels.view_as(valid))
    agree[..., 0] = True  # the anchor is given, not drafted
    before = torch.cumprod(agree.long(), dim=-1).bool()
    prefix_agrees = torch.cat([torch.ones_like(before[..., :1]), before[..., :-1]], dim=-1)
    label_valid = (valid & prefix_agrees).view_as(blocks.label_valid)
    labels = torch.where(label_valid, greedy, blocks.labels)
    return Blocks(blocks.token_ids, blocks.positions, labels, label_valid, blocks.slots)


def previous_tokens(labels: torch.Tensor) -> torch.Tensor:
    """(b, N*B) the token before each slot's label: the label one slot to the left (for slot
    k >= 1 the same block's slot k - 1, slot 0's label being the anchor; slot 0's entry is
    never scored). The teacher-forced previous token of the heads that read it (DSpark's
    Markov head, DFlash2's selector)."""
    return torch.cat([labels[:, :1], labels[:, :-1]], dim=1)
