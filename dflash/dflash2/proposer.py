"""DFlash2 drafting in the decoding loop: one drafter forward (its layers convolve the block)
gives the hidden states of block slots 1..k and their unary logits; each slot's top-K candidates
are scored by the selector after the token chosen before it (the anchor for slot 1), and the
walk takes the best-scored candidate slot by slot, as llama.cpp's draft-dflash does for a
DFlash2 draft (common/speculative.cpp:1296-1324; src/models/dflash.cpp:476-565).

Invariants (docs/design.md invariant 12; docs/frontier.md 1.2, 5.5):
- A greedy walk, not a search: slot i takes argmax_k score_i(x_{i-1}, cand_i[k]) (the first
  maximum on ties), x_0 the anchor. Drafts are deterministic tokens: greedy verification keeps the
  output the target's own.
- With `p_min` > 0 the draft stops before slot i when the chosen candidate's softmax over the K
  scores is below it, decided from the scores after x_{i-1} (llama.cpp's --spec-draft-p-min).
- Deterministic drafts under sampling too: the walk is the same at any temperature and the
  drafts carry no distribution (`Drafts.probs` None, one-hot), which both verification rules take
  exactly (docs/design.md invariant 12), as llama.cpp drafts greedily for a sampling target.
- Chain verification only: a slot's scores depend on the path chosen before it.
- Full vocabulary: the candidates are token ids of the target's whole head, as llama.cpp's are.
"""

from __future__ import annotations

import torch

from dflash.decoding.verify import Drafts
from dflash.dflash.proposer import DFlashProposer
from dflash.drafter.model import DFlashDrafter


class DFlash2Proposer(DFlashProposer):
    """Drafts with a DFlash2 drafter (convolutions and a candidate selector).

    Args (besides `DFlashProposer`'s):
        p_min: in [0, 1); > 0 stops a draft before the first slot whose chosen candidate's
            softmax over the K scores is below it; 0 never stops.
    """

    def __init__(self, drafter: DFlashDrafter, embed, logits, lean_dtype=None, graphed=False, p_min: float = 0.0):
        if drafter.candidate_selector is None:
            raise ValueError("a DFlash2 proposer needs a drafter with a candidate selector (selector_rank >= 1)")
        if drafter.draft_vocab is not None:
            raise ValueError("a DFlash2 drafter drafts over the whole vocabulary; this one has a draft vocabulary")
        super().__init__(drafter, embed, logits, lean_dtype, graphed)
        self.p_min = p_min
        self.top_k = drafter.config.selector_top_k

    @classmethod
    def for_target(cls, drafter: DFlashDrafter, target, p_min: float = 0.0) -> DFlash2Proposer:
        """As `DFlashProposer.for_target` (the lean forward where the engine runs), with the p_min stop."""
        logits = target.draft_logits_over(drafter.draft_vocab)
        return cls(drafter, target.embed, logits, target.draft_dtype, target.graphs is not None, p_min)

    @torch.inference_mode()
    def draft(self, committed_ids, new_features, block_size, num_drafts, sampling, generator) -> Drafts:
        hidden = self.block_hidden(committed_ids, new_features, block_size, num_drafts)
        unary, candidates = self.logits(hidden).float().topk(self.top_k, dim=-1)
        selector = self.drafter.candidate_selector
        prev = committed_ids[0, -1:]
        tokens = []
        for slot in range(hidden.shape[0]):
            scores = selector.scores(candidates[slot], unary[slot], hidden[slot], prev)[0]  # (K,)
            best = int(torch.argmax(scores))
            if self.p_min > 0 and 1.0 / float(torch.exp(scores - scores[best]).sum()) < self.p_min:
                break
            prev = candidates[slot, best : best + 1]
            tokens.append(prev)
        return Drafts(tokens=torch.cat(tokens) if tokens else committed_ids.new_zeros(0))
