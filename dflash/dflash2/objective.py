"""DFlash2's objective: the DFlash objective's anchors, blocks and drafter forward (the layers
convolve each block) and its loss on the unary logits, plus the selector's loss
    selector_alpha · mean over valid slots of CE(scores over the K candidates, the data token),
with the teacher-forced predecessor.

Our choice where the reference training code could not be read (docs/frontier.md 2.2, 5.4; R6):
- Candidates: the slot's top-K unary logits; when the data token is not among them it replaces
  the lowest-scored (K-th) candidate, for the loss only (SpecForge #772, speculators #1006 insert
  the gold; which candidate it displaces is not stated upstream).
- Predecessor: the data token at the slot before (the anchor for slot 1), as the proposer keys
  on when every draft before the slot equals the data (training equals decoding, invariant 6;
  tests/dflash2/test_objective.py). ModelOpt #2216's rule.
- Weights: uniform over valid slots (ModelOpt #2216), not the position weights of the unary loss;
  the term is scaled by the unary loss's weight sum so that `BlockLoss.loss` is
  unary + selector_alpha · mean selector CE.
- The head is read once, by the unary loss, which hands over each row's top-K logits
  (`block_loss(top_k=)`); the selector's gradient goes through the K candidates' head rows alone
  (`TargetModel.logits_of`), so no chunk keeps (n, V) logits for it.
- Gradients reach the unary logits and the hidden states (SpecForge's default; #793's stop-gradient
  is not offered).
- Metrics (acc_k, tau_sim) read the selector's teacher-forced choice without the gold inserted:
  what the proposer drafts.
- Full vocabulary only (training.draft_vocab_size null): llama.cpp's candidates are ids of the
  whole head.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F

from dflash.dflash.objective import DFlashObjective
from dflash.drafter.config_json import DFLASH2_KEYS
from dflash.drafter.io import init_drafter_from
from dflash.errors import require
from dflash.specs import DrafterSpec
from dflash.structured import config_key
from dflash.target import TargetModel
from dflash.training.blocks import previous_tokens
from dflash.training.config import TrainingSettings
from dflash.training.loss import BlockLoss, block_loss


def selector_terms(selector, candidates, candidate_logits, rows, prev, labels, unary_of):
    """Per-row (selector CE with the gold inserted, teacher-forced choice == label) of rows whose
    top-K unary logits `candidate_logits` (n, K, detached) are those of token ids `candidates`
    (n, K, best first), hidden `rows` (n, D), predecessors `prev` (n,) and data tokens `labels` (n,).
    unary_of: (rows, token ids (n, K)) -> their unary logits (n, K) with gradient
        (`TargetModel.logits_of`: the K candidates' head rows alone)."""
    with torch.no_grad():  # the proposer's choice: the walk's, the data before the slot
        best = selector.scores(candidates, candidate_logits, rows, prev[:, None])[:, 0].argmax(-1, keepdim=True)
        choice = candidates.gather(1, best)
    missing = ~(candidates == labels[:, None]).any(-1)
    candidates = candidates.clone()
    candidates[missing, -1] = labels[missing]  # the gold replaces the lowest-scored candidate
    scores = selector.scores(candidates, unary_of(rows, candidates), rows, prev[:, None])[:, 0]  # (n, K)
    gold = (candidates == labels[:, None]).float().argmax(-1)
    return F.cross_entropy(scores, gold, reduction="none"), choice.squeeze(1) == labels


class DFlash2Objective(DFlashObjective):
    """DFlash's blocks and loss, plus the selector's (module docstring)."""

    def __init__(self, target: TargetModel, drafter: DrafterSpec, training: TrainingSettings, settings):
        # the parts first, then `drafter.init_from`'s weights (a DFlash2 directory's parts too);
        # with drafter.path set, build_drafter refuses init_from itself
        spec = drafter if drafter.path is not None else dataclasses.replace(drafter, init_from=None)
        super().__init__(target, spec, training)
        self.settings = settings
        wanted = tuple(getattr(settings, key) for key in DFLASH2_KEYS)
        with config_key("method"):
            if self.drafter.candidate_selector is None:
                self.drafter.add_dflash2_parts(*wanted)
            existing = tuple(getattr(self.drafter.config, key) for key in DFLASH2_KEYS)
            require(existing == wanted, "selector_rank", f"drafter.path has {dict(zip(DFLASH2_KEYS, existing))}; set them alike")
        if spec.init_from is None and drafter.init_from is not None:
            with config_key("drafter"):
                init_drafter_from(self.drafter, drafter.init_from)

    def loss(self, target: TargetModel, batch: dict, states: torch.Tensor | None, generator, full_vocab: bool) -> BlockLoss:
        blocks, hidden, final_hidden = self.drafted_blocks(target, batch, states, generator)
        top_k = self.drafter.config.selector_top_k  # the candidates come from the unary loss's pass over the head
        unary = block_loss(hidden, target.logits, blocks, self.loss_settings, final_hidden, top_k=top_k)
        valid = blocks.label_valid
        rows, labels = hidden[valid], blocks.labels[valid]
        if rows.shape[0] == 0:
            return unary
        prev = previous_tokens(blocks.labels)[valid]
        size = self.training.loss_chunk_rows or rows.shape[0]
        selector, parts = self.drafter.candidate_selector, []
        for c in (slice(start, start + size) for start in range(0, rows.shape[0], size)):
            candidates = (unary.top_ids[c], unary.top_logits[c])
            parts.append(selector_terms(selector, *candidates, rows[c], prev[c], labels[c], target.logits_of))
        cross_entropy, correct = (torch.cat(column) for column in zip(*parts))
        term = self.settings.selector_alpha * unary.weights.sum().detach() * cross_entropy.mean()
        return dataclasses.replace(unary, weighted_sum=unary.weighted_sum + term, correct=correct)
