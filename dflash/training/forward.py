"""The training forward: target features of whole sequences, then every block of a
sequence through the drafter in one pass under the sparse block mask.

The decoding path (`dflash.dflash.proposer.DFlashProposer`) computes the same logits for a
block one block at a time with a drafter KV cache (docs/design.md invariant 6).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from dflash.drafter.model import DFlashDrafter, DrafterAttention
from dflash.target import TargetModel
from dflash.training.anchors import Anchors
from dflash.training.blocks import Blocks
from dflash.training.masks import factored_block_mask, flex_block_mask


def target_features(target: TargetModel, input_ids: torch.Tensor, layer_ids: list[int]) -> torch.Tensor:
    """Tapped target features of every position of right-padded sequences.

    Right padding needs no attention mask: causal attention keeps real positions from
    seeing the padding after them, and positions count from 0. Features at padding
    positions are garbage; the block mask hides them (`key_is_real`).

    Args:
        input_ids: (b, S) long.
    Returns:
        (b, S, len(layer_ids) * D) in the target's dtype.
    """
    positions = torch.arange(input_ids.shape[1], device=input_ids.device).expand_as(input_ids)
    # logits_to_keep=1: the logits are not needed, and all of them would be (b, S, vocab).
    return target.forward(input_ids, positions, cache=None, layer_ids=layer_ids, logits_to_keep=1).features


def training_attention_implementation(choice: str, device: torch.device) -> str:
    """The kernel that trains the drafter on `device` for `training.attention` = `choice`:
    flex_attention on CUDA unless "sdpa" is asked for, SDPA with the factored block mask
    otherwise (flex_attention has no CPU backward)."""
    return "flex_attention" if device.type == "cuda" and choice != "sdpa" else "sdpa"


def set_attention_implementation(drafter: DFlashDrafter, implementation: str) -> None:
    """Switch every drafter layer (and the config) to `implementation` in place."""
    drafter.config.attn_implementation = implementation
    for module in drafter.modules():
        if isinstance(module, DrafterAttention):
            module.attn_implementation = implementation


def draft_blocks(
    drafter: DFlashDrafter,
    embed: Callable[[torch.Tensor], torch.Tensor],
    context_features: torch.Tensor,
    key_is_real: torch.Tensor,
    anchors: Anchors,
    blocks: Blocks,
) -> torch.Tensor:
    """Drafter hidden states of all blocks, one forward per batch.

    The mask kind follows the drafter's current attention implementation (a
    `FactoredBlockMask` for sdpa, a BlockMask for flex_attention).

    Args:
        embed: token ids -> embeddings as the target's first layer sees them (`TargetModel.embed`).
        context_features: (b, S, n_taps * D) target features of every position.
        key_is_real: (b, S) bool, True on real tokens.
        anchors: (b, N) positions of the blocks' anchors.
        blocks: token_ids/positions of shape (b, N*B).
    Returns:
        (b, N*B, D) hidden states; logits = `TargetModel.logits(hidden)`.
    """
    block_size, config = drafter.block_size, drafter.config
    build = flex_block_mask if config.attn_implementation == "flex_attention" else factored_block_mask
    mask = build(anchors.positions, key_is_real, block_size, config.attention_window, config.block_causal)
    batch, seq_len = key_is_real.shape
    context_positions = torch.arange(seq_len, device=key_is_real.device).expand(batch, seq_len)
    return drafter(embed(blocks.token_ids), blocks.positions, context_features, context_positions, mask=mask)
