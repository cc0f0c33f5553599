"""One KV-cache crop helper for every transformers version.

transformers 4.x: `DynamicCache.crop(max_length)`; a negative value removes that many
tokens, and `crop(0)` empties the cache. transformers 5.x: `crop(tokens_to_remove)`
accepts only negative counts. A negative count means the same thing in both, so that
is what we pass, and a zero-length crop is skipped (it would empty a v4 cache).

Only full-history layers can be cropped back: a sliding-window layer has dropped what
lies before its window (v4 refuses the crop, v5 raises unless it records the past).
`TargetModel.new_cache` therefore builds full layers everywhere.

Tree verification also compacts the cache: `keep_cache_positions` moves the accepted
path's entries behind the anchor before the crop.

Forwards over a growing cache run under `decode_attention()`: every SDPA kernel but cuDNN's,
which builds an execution graph for each new key length (docs/design.md, "Measured figures").
"""

from __future__ import annotations

from contextlib import AbstractContextManager

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from dflash.engine import StaticCache

#: SDPA kernels allowed while decoding: all but cuDNN's (module docstring). CPU kernels are unaffected.
DECODE_SDPA_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def decode_attention() -> AbstractContextManager:
    """Restrict SDPA to `DECODE_SDPA_BACKENDS` in a `with` block or as a decorator (the
    decode loop runs under it: time a forward under it to compare with the loop)."""
    return sdpa_kernel(DECODE_SDPA_BACKENDS)


def cache_length(cache) -> int:
    """Number of positions held by an HF cache (0 for None)."""
    return 0 if cache is None else int(cache.get_seq_length())


def crop_cache(cache, keep_length: int) -> None:
    """Drop every cached position at index >= `keep_length`, in place.

    Args:
        cache: an HF `Cache` (e.g. `DynamicCache`) or any object with
            `get_seq_length()` and a `crop(n)` that removes `-n` tokens when `n < 0`.
        keep_length: number of leading positions to keep; >= 0.
    """
    if keep_length < 0:
        raise ValueError(f"keep_length must be >= 0, got {keep_length}")
    remove = cache_length(cache) - keep_length
    if remove > 0:
        cache.crop(-remove)


def keep_cache_positions(cache, start: int, source_positions: list[int]) -> None:
    """Move the cached entries at `source_positions` to [start, start + n) and drop the rest.

    After a tree verify forward the cache holds the anchor and every draft node; only the
    accepted path may stay. Entries before `start` are untouched.

    Args:
        cache: an HF cache with `layers`, each holding `keys` / `values` of shape
            (batch, heads, positions, head_dim) (transformers >= 4.56 `DynamicCache`), or the
            engine's `StaticCache` (all layers in one buffer: one gather for every layer).
        start: first position to overwrite; every source position is >= `start`.
        source_positions: n cache positions, in the order they must end up.
    """
    if source_positions != list(range(start, start + len(source_positions))):
        index = torch.tensor(source_positions, dtype=torch.long, device=cache.layers[0].keys.device)
        end = start + len(source_positions)
        if isinstance(cache, StaticCache):  # every layer in one buffer, positions on dim 3: one gather each
            for buffer in (cache.keys, cache.values):
                buffer[:, :, :, start:end] = buffer.index_select(3, index)
        else:
            for layer in cache.layers:
                layer.keys[:, :, start:end] = layer.keys.index_select(2, index)
                layer.values[:, :, start:end] = layer.values.index_select(2, index)
    crop_cache(cache, start + len(source_positions))
