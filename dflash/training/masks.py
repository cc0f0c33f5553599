"""The sparse attention mask of training: many blocks of a sequence in one forward.

Keys are the S context positions of the sequence (target features) followed by the
N*B block queries' own keys. One rule, `block_attention_rule`, decides every entry and
feeds every builder: a flex_attention `BlockMask` (CUDA), a `FactoredBlockMask` (CPU
training; flex_attention has no CPU backward) and a dense bool mask for SDPA (the
reference the other two are tested against).

Invariant (docs/design.md invariant 5): a query of block j sees context position p iff
p < anchor_j (STRICTLY before the anchor: at inference the target has not yet run on
the anchor) and p is a real token; it sees every key of its own block
(bidirectional) and nothing of other blocks.

A drafter with a window W or a causal block (`DrafterConfig.attention_window`,
`block_causal`) narrows this by llama.cpp's rule over positions, the one decoding applies
(`dflash.drafter.attention.sees_by_position`; docs/design.md invariant 6): query slot s of
block j is at position anchor_j + s (invariant 3), a context key at its own position p, key
slot t of its own block at anchor_j + t. So the window hides context p when
anchor_j + s - p >= W and key slot t when s - t >= W; causal hides key slots t > s. Every
query still sees its own slot, so no row is empty (padding blocks included).
"""

from __future__ import annotations

import torch

from dflash.drafter.attention import FactoredBlockMask, sees_by_position


def block_attention_rule(
    batch: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    anchor_positions: torch.Tensor,
    key_is_real: torch.Tensor,
    block_size: int,
    window: int | None = None,
    causal: bool = False,
) -> torch.Tensor:
    """May `query` attend to `key`? Elementwise over broadcastable index tensors.

    Args:
        batch, query, key: integer index tensors (any broadcastable shapes, or 0-d as
            flex_attention's mask_mod passes them); query in [0, N*B), key in [0, S+N*B).
        anchor_positions: (b, N) anchor position of each block.
        key_is_real: (b, S) bool, True on real (non-padding) context tokens.
        block_size: B.
        window, causal: the drafter's `attention_window` and `block_causal`.
    Returns:
        bool tensor of the broadcast shape.
    """
    seq_len = key_is_real.shape[1]
    block = query // block_size
    anchor = anchor_positions[batch, block]
    is_context = key < seq_len
    real = key_is_real[batch, key.clamp(max=seq_len - 1)]
    sees_context = is_context & (key < anchor) & real
    sees_own_block = ~is_context & ((key - seq_len) // block_size == block)
    sees = sees_context | sees_own_block
    if window is None and not causal:
        return sees
    key_position = torch.where(is_context, key, anchor + (key - seq_len) % block_size)
    return sees & sees_by_position(anchor + query % block_size, key_position, window, causal)


def dense_block_mask(
    anchor_positions: torch.Tensor, key_is_real: torch.Tensor, block_size: int, window: int | None = None, causal: bool = False
) -> torch.Tensor:
    """The rule as a dense bool mask for SDPA.

    Args:
        anchor_positions: (b, N); key_is_real: (b, S); window, causal: as `block_attention_rule`.
    Returns:
        (b, 1, N*B, S + N*B) bool, True = may attend.
    """
    num_keys = key_is_real.shape[1] + anchor_positions.shape[1] * block_size
    return _rule_grid(anchor_positions, key_is_real, block_size, num_keys, window, causal)


def factored_block_mask(
    anchor_positions: torch.Tensor, key_is_real: torch.Tensor, block_size: int, window: int | None = None, causal: bool = False
) -> FactoredBlockMask:
    """The rule as a `FactoredBlockMask`: the dense mask's first S key columns, and its block
    columns as the (B, B) table of slots every block shares (None without window or causality).

    Args:
        anchor_positions: (b, N); key_is_real: (b, S); window, causal: as `block_attention_rule`.
    """
    seq_len = key_is_real.shape[1]
    sees_context = _rule_grid(anchor_positions, key_is_real, block_size, seq_len, window, causal)
    if window is None and not causal:
        return FactoredBlockMask(sees_context, block_size)
    slots = torch.arange(block_size, device=anchor_positions.device)  # block 0's queries and keys
    first = torch.zeros((), dtype=torch.long, device=slots.device)
    sees_block = block_attention_rule(
        first, slots.view(-1, 1), seq_len + slots.view(1, -1), anchor_positions, key_is_real, block_size, window, causal
    )
    return FactoredBlockMask(sees_context, block_size, sees_block)


def _rule_grid(
    anchor_positions: torch.Tensor, key_is_real: torch.Tensor, block_size: int, num_keys: int, window: int | None, causal: bool
) -> torch.Tensor:
    """The rule over queries [0, N*B) x keys [0, num_keys): (b, 1, N*B, num_keys) bool."""
    batch, num_blocks = anchor_positions.shape
    num_queries = num_blocks * block_size
    device = anchor_positions.device
    batch_index = torch.arange(batch, device=device).view(batch, 1, 1)
    query = torch.arange(num_queries, device=device).view(1, num_queries, 1)
    key = torch.arange(num_keys, device=device).view(1, 1, -1)
    return block_attention_rule(batch_index, query, key, anchor_positions, key_is_real, block_size, window, causal).unsqueeze(1)


def flex_block_mask(
    anchor_positions: torch.Tensor, key_is_real: torch.Tensor, block_size: int, window: int | None = None, causal: bool = False
):
    """The rule as a flex_attention `BlockMask` over (b, N*B, S + N*B), shared by all heads."""
    from torch.nn.attention.flex_attention import create_block_mask

    batch, num_blocks = anchor_positions.shape
    num_queries = num_blocks * block_size

    def mask_mod(b, h, q_idx, kv_idx):
        return block_attention_rule(b, q_idx, kv_idx, anchor_positions, key_is_real, block_size, window, causal)

    return create_block_mask(
        mask_mod,
        B=batch,
        H=None,
        Q_LEN=num_queries,
        KV_LEN=key_is_real.shape[1] + num_queries,
        device=anchor_positions.device,
    )
