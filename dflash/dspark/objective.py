"""DSpark's objective (DeepSpec's loss, docs/frontier.md 2.1, on our bonus-anchor blocks): the
DFlash objective's anchors, blocks and drafter forward, then per valid slot the Markov-biased
logits with the teacher-forced previous token, and
    alpha_ce CE(biased, data) + alpha_tv |p_d - p_t|_1 + alpha_conf BCE(conf, 1 - TV(p_d, p_t)),
p_d the biased draft distribution, p_t the target's at the same position, TV = |p_d - p_t|_1 / 2
detached, weighted per slot as DFlash's loss (`training.position_weights`).

Invariants:
- Teacher forcing: the previous token of slot k is the block's label at slot k - 1 (slot 0's
  label is the anchor itself, docs/design.md invariants 3-4), the token the proposer keys on
  when every draft before slot k equals the data (training equals decoding, invariant 6;
  tests/dspark/test_objective.py).
- The metrics (acc_k, tau_sim) read the biased argmax: what the proposer drafts.
- Memory: logits exist for `training.loss_chunk_rows` rows at a time, recomputed in backward
  (activation checkpointing); the heads train, so the fused row-gradient trick of
  `dflash.training.loss` does not apply.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from dflash.dflash.objective import DFlashObjective
from dflash.drafter.io import init_drafter_from
from dflash.errors import require
from dflash.specs import DrafterSpec
from dflash.structured import config_key
from dflash.target import TargetModel
from dflash.training.blocks import previous_tokens
from dflash.training.config import TrainingSettings
from dflash.training.loss import BlockLoss, dpace_weights


def biased_logits(drafter, to_logits, rows: torch.Tensor, prev: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(n, V) float32 logits of hidden rows (n, D) plus the Markov bias of their previous tokens
    (n,), and (n, R) those tokens' Markov embeddings."""
    embedded = drafter.markov_head.embed(prev)
    return to_logits(rows).float() + drafter.markov_head.bias(embedded), embedded


class DSparkObjective(DFlashObjective):
    """DFlash's blocks, scored through DSpark's heads (module docstring)."""

    def __init__(self, target: TargetModel, drafter: DrafterSpec, training: TrainingSettings, settings):
        # the heads first, then `drafter.init_from`'s weights (a DSpark directory's heads too);
        # with drafter.path set, build_drafter refuses init_from itself
        spec = drafter if drafter.path is not None else dataclasses.replace(drafter, init_from=None)
        super().__init__(target, spec, training)
        self.settings = settings
        with config_key("method"):
            existing = self.drafter.config.markov_rank
            require(existing in (0, settings.markov_rank), "markov_rank", f"drafter.path has rank {existing}")
        if self.drafter.markov_head is None:
            self.drafter.add_dspark_heads(settings.markov_rank, settings.confidence_head)
        if spec.init_from is None and drafter.init_from is not None:
            with config_key("drafter"):
                init_drafter_from(self.drafter, drafter.init_from)
        self.reads_target = settings.tv_alpha > 0 or self.drafter.confidence_head is not None

    def loss(self, target: TargetModel, batch: dict, states: torch.Tensor | None, generator, full_vocab: bool) -> BlockLoss:
        blocks, hidden, final_hidden = self.drafted_blocks(target, batch, states, generator)
        valid = blocks.label_valid
        rows, labels = hidden[valid], blocks.labels[valid]
        prev = previous_tokens(blocks.labels)[valid]
        slots = blocks.slots.expand_as(valid)[valid]
        target_rows = None
        if self.reads_target:
            batch_index = torch.arange(valid.shape[0], device=valid.device)[:, None].expand_as(valid)[valid]
            target_rows = final_hidden[batch_index, blocks.positions[valid] - 1]  # predicts the slot's token
        size = self.training.loss_chunk_rows or max(rows.shape[0], 1)
        chunks = [slice(start, start + size) for start in range(0, rows.shape[0], size)]
        parts = [
            self._row_terms(target, rows[c], prev[c], labels[c], None if target_rows is None else target_rows[c]) for c in chunks
        ]
        if parts:
            losses, cross_entropy, correct = (torch.cat(column) for column in zip(*parts))
        else:  # no valid slot: an empty loss, still in the graph
            losses = rows.sum(-1).float()
            cross_entropy, correct = losses.detach(), torch.zeros(0, dtype=torch.bool, device=rows.device)
        static = self.loss_settings.static_weights()
        if static is None:
            flat_index = valid.view(-1).nonzero().squeeze(1)
            num_blocks = valid.numel() // self.slots
            weights = dpace_weights(cross_entropy, flat_index, num_blocks, self.slots, self.loss_settings.dpace_alpha)
        else:
            weights = static.to(hidden.device)[slots]
        return BlockLoss((weights * losses).sum(), slots, correct, cross_entropy, weights)

    def _row_terms(self, target, rows, prev, labels, target_rows):
        """Per-row (loss, data cross-entropy, biased argmax == label) of one chunk of rows; the
        target's final hidden states `target_rows` (None: its distribution is not read)."""

        def terms(rows):
            logits, embedded = biased_logits(self.drafter, target.logits, rows, prev)
            log_q = logits.log_softmax(-1)
            cross_entropy = -log_q.gather(1, labels[:, None]).squeeze(1)
            loss = self.settings.ce_alpha * cross_entropy
            if target_rows is not None:
                with torch.no_grad():
                    p_target = target.logits(target_rows).float().softmax(-1)
                l1 = (log_q.exp() - p_target).abs().sum(-1)
                loss = loss + self.settings.tv_alpha * l1
                head = self.drafter.confidence_head
                if head is not None:
                    agreement = 1 - l1.detach() / 2  # 1 - TV: the chance a sampled draft is accepted
                    bce = F.binary_cross_entropy_with_logits(head(rows, embedded), agreement, reduction="none")
                    loss = loss + self.settings.confidence_alpha * bce
            return loss, cross_entropy.detach(), (logits.detach().argmax(-1) == labels)

        if torch.is_grad_enabled() and self.training.loss_chunk_rows is not None:
            return checkpoint(terms, rows, use_reentrant=False)
        return terms(rows)
