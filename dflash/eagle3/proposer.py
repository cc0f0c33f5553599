"""EAGLE-3 chain drafting for the speculative decoding loop.

Invariants (the loop's contract of `dflash.decoding.proposer.Proposer`):
- Committed tokens occupy [0, L); the anchor is at L-1; target features of [0, L-1) have
  been delivered exactly once. Context pair t = (features of t, token t+1) for t < L-1:
  the drafter's cache holds the pairs [0, L-1) between calls.
- Drafting k tokens: the new pairs [cache length, L-1) go through the layer in one
  forward; its output at L-2 gives draft 1; draft j+1 comes from the pair (own output,
  draft j) at position L-2+j (k forwards in all). The cache is then cropped back to
  L-1 pairs, so rejected drafts leave nothing behind; the next call brings the target
  features of the newly committed positions.
"""

from __future__ import annotations

import torch

from dflash.decoding.sampling import SamplingConfig, probabilities, sample
from dflash.decoding.verify import Drafts
from dflash.drafter.model import DrafterCache
from dflash.eagle3.model import Eagle3Drafter
from dflash.engine import argmax, lean_linears
from dflash.errors import require

GREEDY = SamplingConfig()


class Eagle3Proposer:
    """Drafts chains with an `Eagle3Drafter` and the target's frozen embedding.

    Args:
        embed: token ids (1, q) -> (1, q, H) (`TargetModel.embed`).
        lean_dtype: run the drafter's linears on the engine's tuned kernels with their weights in
            this dtype (`dflash.engine.lean_linears`; `TargetModel.draft_dtype`), or None: as they are.
    The chain length is the loop's: `num_drafts` of each `draft` call (block_size unused).
    """

    def __init__(self, drafter: Eagle3Drafter, embed, lean_dtype: torch.dtype | None = None):
        self.drafter = drafter.eval() if lean_dtype is None else lean_linears(drafter, lean_dtype)
        self.embed = embed
        self.target_layer_ids = list(drafter.config.target_layer_ids)
        self.cache = DrafterCache(1)

    def reset(self) -> None:
        self.cache = DrafterCache(1)

    @torch.inference_mode()
    def draft(
        self,
        committed_ids: torch.Tensor,
        new_features: torch.Tensor | None,
        block_size: int,
        num_drafts: int,
        sampling: SamplingConfig = GREEDY,
        generator: torch.Generator | None = None,
    ) -> Drafts:
        """Draft `num_drafts` tokens after committed_ids (1, L), given the target features
        (1, n, 3*H) of positions [L-1-n, L-1). Returns tokens (k,) and, when sampling, the
        (k, vocab) distributions they were drawn from."""
        device = committed_ids.device
        context_end = committed_ids.shape[1] - 1
        start = self.cache.length
        require(new_features is not None, "eagle3", "the drafter needs target features; the target returned none")
        require(
            start + new_features.shape[1] == context_end and new_features.shape[1] >= 1,
            "eagle3",
            f"drafter context covers {start + new_features.shape[1]} positions, expected {context_end} (all before the anchor)",
        )
        drafter = self.drafter
        hidden = drafter.fc(new_features.to(drafter.norm.weight.dtype))  # the module's dtype
        tokens = committed_ids[:, start + 1 : context_end + 1]
        positions = torch.arange(start, context_end, device=device).unsqueeze(0)
        out = drafter.forward_cached(self.embed(tokens).to(hidden.dtype), hidden, positions, self.cache)[:, -1:]
        drafted, distributions = [], []
        for j in range(num_drafts):
            if j > 0:
                position = torch.tensor([[context_end - 1 + j]], device=device)
                token = torch.tensor([[drafted[-1]]], device=device)
                out = drafter.forward_cached(self.embed(token).to(out.dtype), out, position, self.cache)
            logits = drafter.target_logits(out[0, -1:])[0]
            if sampling.greedy:
                drafted.append(int(argmax(logits)))
            else:
                probs = probabilities(logits.unsqueeze(0), sampling)[0]
                drafted.append(int(sample(probs.unsqueeze(0), generator)[0]))
                distributions.append(probs)
        self.cache.crop(context_end)
        tokens = torch.tensor(drafted, dtype=torch.long, device=device)
        return Drafts(tokens=tokens, probs=torch.stack(distributions) if distributions else None)
