"""Batched greedy generation on the fast engine, for regeneration (`dflash.data.generators`) and
the bench's generation row; `greedy_batch` states what holds (tests/engine/test_forward.py).
Greedy tokens come from `kernels.argmax`, index for index torch's."""

from __future__ import annotations

import os

import torch

from dflash.engine.forward import FastForward
from dflash.engine.kernels import argmax

PREFILL_ROWS = 8  # rows per prefill group of `greedy_batch`


@torch.inference_mode()
def greedy_batch(
    fast: FastForward, prompts: list[list[int]], max_new_tokens: int, stop_ids: set[int], pad_id: int
) -> list[list[int]]:
    """Greedy continuations of several prompts at once, through the stop token or
    max_new_tokens; new ids only, in the prompts' order.

    Prompts are left-padded into one static cache, longest first; each row keeps its own
    positions (0 at its first real token) and a key mask hides its padding. A padded query
    position may see itself, so no attention row is empty (an empty one would give NaN, and
    0 x NaN reaches the real rows' values). The prefill runs `PREFILL_ROWS` rows at a time,
    each group only over its own longest prompt's width (`StaticCache.row_view`), so short
    prompts do not pay for the longest one. The tokens every prompt starts with (a chat
    template's system turn) run once, as one row, and their keys and values are copied to each
    row's slots: they hold the same positions in every row, so they are the same values. A row
    that stops keeps running, unread, until half the batch has stopped; then the stopped rows
    leave it (one copy of the cache for several rows, not one per row), so the others' steps
    do not pay for them.
    """
    device = fast.final_norm[0].device
    order = sorted(range(len(prompts)), key=lambda row: -len(prompts[row]))  # longest first
    prompts = [prompts[row] for row in order]
    batch, width = len(prompts), len(prompts[0])
    pads = torch.tensor([width - len(p) for p in prompts], device=device)
    ids = torch.full((batch, width), pad_id, dtype=torch.long, device=device)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt) :] = torch.tensor(prompt, device=device)
    keys = torch.arange(width + max_new_tokens, device=device)
    key_valid = keys.unsqueeze(0) >= pads.unsqueeze(1)  # (batch, total)
    cache = fast.new_cache(batch=batch, capacity=len(keys))
    positions = (torch.arange(width, device=device).unsqueeze(0) - pads.unsqueeze(1)).clamp_min(0)
    shared = shared_prefix(prompts)
    if shared:
        prefix = fast.new_cache(batch=1, capacity=shared)
        fast.forward(ids[:1, :shared], positions[:1, :shared], prefix, None, logits_to_keep=1)  # row 0 has no padding
        for row, pad in enumerate(pads.tolist()):
            cache.keys[:, row, :, pad : pad + shared] = prefix.keys[:, 0, :, :shared]
            cache.values[:, row, :, pad : pad + shared] = prefix.values[:, 0, :, :shared]
    last = []
    for first in range(0, batch, PREFILL_ROWS):
        rows = slice(first, min(first + PREFILL_ROWS, batch))
        offset = width - len(prompts[first]) + shared  # the group's own width: its longest prompt's, after the shared part
        slots = keys[offset:width].unsqueeze(1)
        mask = (key_valid[rows, None, None, :width] & (keys[:width] <= slots)) | (keys[:width] == slots)
        view = cache.row_view(rows.start, rows.stop, offset)
        logits, _ = fast.forward(ids[rows, offset:], positions[rows, offset:], view, None, logits_to_keep=1, attention_mask=mask)
        last.append(logits[:, -1])
    cache.length = width
    stops = torch.tensor(sorted(stop_ids), device=device)
    token, position = argmax(torch.cat(last)), width - pads  # each row's next position
    outputs: list[list[int]] = [[] for _ in prompts]
    alive = list(range(batch))  # the rows in the cache, in its order
    stopped = torch.zeros(batch, dtype=torch.bool, device=device)  # of those rows
    for step in range(max_new_tokens):
        for row, new, done in zip(alive, token.tolist(), stopped.tolist()):
            if not done:
                outputs[row].append(new)
        stopped |= torch.isin(token, stops)
        if step == max_new_tokens - 1 or bool(stopped.all()):
            break
        if 2 * int(stopped.sum()) >= len(alive):
            kept = (~stopped).nonzero().squeeze(1)
            alive = [alive[i] for i in kept.tolist()]
            token, position, key_valid, stopped = token[kept], position[kept], key_valid[kept], stopped[kept]
            cache.keep_rows(kept)
        mask = key_valid[:, None, None, : cache.length + 1]
        logits, _ = fast.forward(token.unsqueeze(1), position.unsqueeze(1), cache, None, attention_mask=mask)
        token, position = argmax(logits[:, -1]), position + 1
    in_order: list[list[int]] = [[] for _ in prompts]
    for row, original in enumerate(order):
        in_order[original] = outputs[row]
    return in_order


def shared_prefix(prompts: list[list[int]]) -> int:
    """How many tokens every prompt starts with, short of the shortest one's last (whose
    logits begin its answer). `commonprefix` compares any sequences, token ids included."""
    return min(len(os.path.commonprefix(prompts)), min(map(len, prompts)) - 1)
