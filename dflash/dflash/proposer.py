"""DFlash drafting in the decoding loop: one drafter forward over [anchor, mask x (B-1)]
gives the logits of a whole block (`dflash.decoding.proposer.BlockProposer`)."""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch

from dflash.decoding.verify import propose_tokens
from dflash.drafter.model import DFlashDrafter, DrafterCache, decoding_mask
from dflash.engine import FastDrafter, GraphedDrafter

log = logging.getLogger(__name__)


class DFlashProposer:
    """Drafts with a DFlash drafter and the target's frozen embedding and LM head.

    Args:
        embed: token ids (1, q) -> (1, q, D) embeddings as the target's first layer sees
            them (`TargetModel.embed`).
        logits: hidden (..., D) -> (..., V) logits through the target's head transform
            (`TargetModel.draft_logits`).
        lean_dtype: run the drafter's lean decoding forward in this dtype
            (`dflash.engine.drafter`; `TargetModel.draft_dtype`), or None: the module itself.
        graphed: propose through CUDA graphs (`dflash.engine.drafter_graphs`), as a target on
            `engine=graphs` verifies (`TargetModel.graphs`); on a CPU it runs uncaptured.
    """

    def __init__(
        self,
        drafter: DFlashDrafter,
        embed: Callable[[torch.Tensor], torch.Tensor],
        logits: Callable[[torch.Tensor], torch.Tensor],
        lean_dtype: torch.dtype | None = None,
        graphed: bool = False,
    ):
        self.drafter = drafter.eval()
        if drafter.config.ungraphable and graphed:
            # The graphed forward knows neither DFlash2's convolutions (docs/frontier.md R5) nor a
            # window or a causal block (`GraphedDrafter` refuses them); the lean forward knows both.
            log.info("proposing without CUDA graphs: the graphed drafter forward has no convolutions and no mask")
            graphed = False
        if graphed:
            self.forward = GraphedDrafter(self.drafter)
        else:
            self.forward = self.drafter if lean_dtype is None else FastDrafter(self.drafter, lean_dtype)
        self.embed = embed
        self.logits = logits
        self.mask_token_id = drafter.config.mask_token_id
        # A drafter without target features reads the prefix's token embeddings instead.
        self.target_layer_ids = list(drafter.config.target_layer_ids) if drafter.config.use_target_features else None
        self.reset()

    @classmethod
    def for_target(cls, drafter: DFlashDrafter, target) -> DFlashProposer:
        """Drafting as decoding with `target` (a `TargetModel`) drafts: its embedding, its head
        over the drafter's vocabulary (`TargetModel.draft_logits_over`) in its draft dtype,
        through CUDA graphs where the target verifies on them."""
        logits = target.draft_logits_over(drafter.draft_vocab)
        return cls(drafter, target.embed, logits, target.draft_dtype, graphed=target.graphs is not None)

    def reset(self) -> None:
        graphed = isinstance(self.forward, GraphedDrafter)
        self.cache = self.forward.new_cache() if graphed else DrafterCache(self.drafter.config.num_hidden_layers)

    def draft(self, committed_ids, new_features, block_size, num_drafts, sampling, generator):
        return propose_tokens(self.propose(committed_ids, new_features, block_size, num_drafts), sampling, generator)

    @torch.inference_mode()
    def propose(self, committed_ids, new_features, block_size, num_drafts):
        return self.logits(self.block_hidden(committed_ids, new_features, block_size, num_drafts)).float()

    @torch.inference_mode()
    def block_hidden(self, committed_ids, new_features, block_size, num_drafts) -> torch.Tensor:
        """(num_drafts, D) final-normed hidden states of block slots 1..num_drafts (arguments as `draft`)."""
        device = committed_ids.device
        anchor_pos = committed_ids.shape[1] - 1
        context_start = self.cache.length
        if self.target_layer_ids is None:
            new_features = self.embed(committed_ids[:, context_start:anchor_pos])
        if new_features is None:
            raise RuntimeError("the drafter needs target features of the context; the target returned none")
        if context_start + new_features.shape[1] != anchor_pos:
            raise RuntimeError(
                f"drafter context covers {context_start + new_features.shape[1]} positions, "
                f"expected {anchor_pos} (all before the anchor)"
            )
        block_ids = torch.full((1, block_size), self.mask_token_id, dtype=torch.long, device=device)
        block_ids[0, 0] = committed_ids[0, -1]
        block_positions = torch.arange(anchor_pos, anchor_pos + block_size, device=device).unsqueeze(0)
        context_positions = torch.arange(context_start, anchor_pos, device=device).unsqueeze(0)
        config, cached = self.drafter.config, self.cache.length
        mask = decoding_mask(config, cached, context_positions, block_positions) if config.masked_decoding else None
        hidden = self.forward(self.embed(block_ids), block_positions, new_features, context_positions, mask=mask, cache=self.cache)
        self.cache.crop(anchor_pos)
        return hidden[0, 1 : 1 + num_drafts]
