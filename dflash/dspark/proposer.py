"""DSpark drafting in the decoding loop: one DFlash drafter forward gives the hidden states of
block slots 1..k, then the slots are chosen in order, each slot's logits biased by the Markov
head keyed on the token before it (the anchor for slot 1), as llama.cpp's draft-dspark does
(src/models/dflash.cpp:296-407, common/speculative.cpp:1326-1353).

Invariants (docs/design.md invariant 12; docs/frontier.md 5.5):
- The draft of slot i is drawn from (greedy: the argmax of) base_i + w2 · w1[x_{i-1}], the
  distribution recorded in `Drafts.probs[i]` when sampling: it depends on the tokens before
  slot i, never on x_i.
- The draft stops BEFORE slot i when sigmoid(confidence(h_i, w1[x_{i-1}])) < the threshold:
  decided before x_i is drawn, from what precedes it, so a cut never depends on the token it
  would cut (a step may verify no draft). Both keep verification lossless.
- Chain verification only: slot i's logits depend on the path chosen before it, so the logits
  of a whole block at once (`BlockProposer.propose`, which tree verification expands) do not
  describe what this proposer drafts.
"""

from __future__ import annotations

import torch

from dflash.decoding.sampling import probabilities, sample
from dflash.decoding.verify import Drafts
from dflash.dflash.proposer import DFlashProposer
from dflash.drafter.model import DFlashDrafter
from dflash.engine import argmax, lean_linears


class DSparkProposer(DFlashProposer):
    """Drafts with a DSpark drafter (a DFlash drafter with a Markov head).

    Args (besides `DFlashProposer`'s):
        confidence_threshold: in [0, 1); > 0 stops a draft before the first slot whose
            confidence is below it (the drafter needs a confidence head), 0 never stops.
    """

    def __init__(self, drafter: DFlashDrafter, embed, logits, lean_dtype=None, graphed=False, confidence_threshold=0.0):
        if drafter.markov_head is None:
            raise ValueError("a DSpark proposer needs a drafter with a Markov head (markov_rank >= 1)")
        if confidence_threshold > 0 and drafter.confidence_head is None:
            raise ValueError("a confidence threshold needs a drafter with a confidence head")
        super().__init__(drafter, embed, logits, lean_dtype, graphed)
        self.confidence_threshold = confidence_threshold
        # the Markov head's (V, R) matrix is read once per drafted slot: on the engine's kernels
        # in the lean dtype where the lean forward decodes
        self.markov = drafter.markov_head if lean_dtype is None else lean_linears(drafter.markov_head, lean_dtype)

    @classmethod
    def for_target(cls, drafter: DFlashDrafter, target, confidence_threshold: float = 0.0) -> DSparkProposer:
        """As `DFlashProposer.for_target`, with the confidence cut."""
        logits = target.draft_logits_over(drafter.draft_vocab)
        graphed = target.graphs is not None
        return cls(drafter, target.embed, logits, target.draft_dtype, graphed, confidence_threshold)

    @torch.inference_mode()
    def draft(self, committed_ids, new_features, block_size, num_drafts, sampling, generator) -> Drafts:
        hidden = self.block_hidden(committed_ids, new_features, block_size, num_drafts)
        base = self.logits(hidden).float()
        markov, confidence = self.markov, self.drafter.confidence_head
        cuts = confidence is not None and self.confidence_threshold > 0
        prev = committed_ids[0, -1]
        tokens, probs = [], []
        for slot in range(base.shape[0]):
            embedded = markov.embed(prev)
            if cuts and torch.sigmoid(confidence(hidden[slot], embedded)) < self.confidence_threshold:
                break
            logits = base[slot] + markov.bias(embedded)
            if sampling.greedy:
                prev = argmax(logits[None])[0]
            else:
                probs.append(probabilities(logits, sampling))
                prev = sample(probs[-1], generator)
            tokens.append(prev)
        drafted = torch.stack(tokens) if tokens else committed_ids.new_zeros(0)
        if sampling.greedy:
            return Drafts(tokens=drafted)
        return Drafts(tokens=drafted, probs=torch.stack(probs) if probs else base.new_zeros(0, base.shape[-1]))
