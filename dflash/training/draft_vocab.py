"""A training vocabulary (`training.draft_vocab_size`): each training step scores the drafter
over the K most frequent response tokens of the training rows instead of the whole vocabulary.

Why: on a small target the frozen head dominates a training step, while its answers use a few thousand
distinct tokens (docs/design.md, "Measured figures"). The drafter's weights are unchanged; the vocabulary
travels beside them (`DFlashDrafter.draft_vocab`, draft_vocab.json) and decoding drafts over it
(`TargetModel.draft_logits_over`).

Invariants:
- Validation scores the whole vocabulary, out-of-vocabulary tokens included: `val/tau_sim`
  is the figure of decoding over the whole vocabulary (`drafter.draft_vocab=false`).
- A slot whose label is outside the vocabulary is not supervised in that step and is not
  counted in the `train/*` metrics. With `training.loss=kl` the target's distribution is
  taken over the same K tokens (renormalised), like the drafter's.
- The vocabulary is counted on the training rows' response tokens only (never on held-out
  rows); ties go to the lower id, so every rank and every rerun picks the same one.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


def frequent_response_tokens(
    input_ids: np.ndarray, loss_mask: np.ndarray, offsets: np.ndarray, rows: np.ndarray, size: int, vocab_rows: int
) -> torch.Tensor:
    """The `size` most frequent response tokens of `rows`, as sorted ids.

    Args:
        input_ids / loss_mask: (total_tokens,) of every tokenised row, concatenated.
        offsets: (num_rows + 1,) where each row starts.
        rows: indices of the rows to count (the training split).
        size: K <= vocab_rows; when fewer than K distinct tokens occur, the rest are the
            lowest unused ids (never a label: they only pad the vocabulary).
    Returns:
        (K,) long, ascending.
    """
    in_rows = np.zeros(len(offsets) - 1, dtype=bool)
    in_rows[rows] = True
    counted = np.repeat(in_rows, np.diff(offsets)) & (loss_mask.astype(bool))
    counts = np.bincount(input_ids[counted].astype(np.int64), minlength=vocab_rows)[:vocab_rows]
    order = np.lexsort((np.arange(vocab_rows), -counts))  # by count descending, then by id
    return torch.from_numpy(np.sort(order[:size])).long()


@dataclass
class DraftVocab:
    """ids: (K,) token ids; lookup: (V,) position of each id in `ids`, -1 outside;
    head_rows: (K, D) the head's weight rows of `ids`."""

    ids: torch.Tensor
    lookup: torch.Tensor
    head_rows: torch.Tensor

    @classmethod
    def build(cls, ids: torch.Tensor, head_rows: torch.Tensor, vocab_rows: int) -> DraftVocab:
        lookup = torch.full((vocab_rows,), -1, dtype=torch.long, device=ids.device)
        lookup[ids] = torch.arange(ids.numel(), device=ids.device)
        return cls(ids=ids, lookup=lookup, head_rows=head_rows)

    def to(self, device: torch.device) -> DraftVocab:
        return DraftVocab(self.ids.to(device), self.lookup.to(device), self.head_rows.to(device))
