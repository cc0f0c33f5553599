"""Prompt lookup (n-gram) drafting: propose what followed the last n tokens earlier in the context.

Training-free, no model: the baseline a trained drafter has to beat.

Rule: for n = max_ngram down to min_ngram, take the last n committed tokens (prompt and
output so far) and look for their most recent earlier occurrence; the first n that has
one proposes the tokens that followed it, at most `num_drafts` of them (fewer when the
match is close to the end, none when no n matches). Most recent, because in generated
code and text the nearest repetition is the likeliest to continue the same way.

Sources: HF transformers' `PromptLookupCandidateGenerator` (`prompt_lookup_num_tokens`)
tries n from the largest down the same way but takes the earliest occurrence; vLLM's
`NgramProposer` (`prompt_lookup_min` / `prompt_lookup_max`) matches n-grams within
[min, max] likewise. Our defaults are HF's: max_ngram 2, min_ngram 1, 10 draft tokens.

`LookupFirst` puts the lookup in front of a drafter: where the context repeats itself it
drafts by lookup and the drafter does not run (method `dflash_lookup`).

The proposal is deterministic (one-hot, `Drafts.probs` None), which every verify rule
handles losslessly (`dflash.decoding.verify.Drafts`).
"""

from __future__ import annotations

import torch

from dflash.decoding.sampling import SamplingConfig
from dflash.decoding.verify import Drafts


def lookup_continuation(ids: list[int], max_ngram: int, min_ngram: int, num_tokens: int) -> list[int]:
    """The tokens that followed the most recent earlier occurrence of the last n `ids`, for
    the longest n in [min_ngram, max_ngram] that occurs; at most `num_tokens`; [] if none."""
    length = len(ids)
    for n in range(min(max_ngram, length - 1), min_ngram - 1, -1):
        suffix = ids[length - n :]
        # an earlier occurrence ends before the last token, so at least one token follows it
        for start in range(length - n - 1, -1, -1):
            if ids[start : start + n] == suffix:
                return ids[start + n : start + n + num_tokens]
    return []


class NgramProposer:
    """A `Proposer` that drafts by prompt lookup (module docstring); needs no target features."""

    target_layer_ids = None

    def __init__(self, settings):
        """settings: max_ngram, min_ngram, num_draft_tokens (`dflash.methods.ngram.NgramSettings`)."""
        self.settings = settings

    def reset(self) -> None:
        """Nothing to forget: every lookup reads the committed ids afresh."""

    def draft(
        self,
        committed_ids: torch.Tensor,
        new_features: torch.Tensor | None,
        block_size: int,
        num_drafts: int,
        sampling: SamplingConfig,
        generator: torch.Generator | None,
    ) -> Drafts:
        """Up to min(num_drafts, num_draft_tokens) looked-up tokens (k,), probs None (one-hot)."""
        settings = self.settings
        tokens = lookup_continuation(
            committed_ids[0].tolist(), settings.max_ngram, settings.min_ngram, min(num_drafts, settings.num_draft_tokens)
        )
        return Drafts(tokens=torch.tensor(tokens, dtype=torch.long, device=committed_ids.device))


class LookupFirst:
    """A `Proposer` that drafts by prompt lookup where the context repeats itself and by
    `inner` (a drafter of block `inner_block`) elsewhere: when the context's last `ngram`
    tokens occurred earlier with at least as many tokens after them as `inner` would draft,
    the step drafts those, up to the loop's `num_drafts` (one-hot, as `NgramProposer`), and
    `inner` does not run; otherwise `inner` drafts its block. The loop's block may be wider
    than `inner_block`, so a lookup step can draft more than the drafter's B - 1 tokens
    (a wide verify costs little more than a narrow one where the weights' read dominates it).
    `inner` still sees every context position exactly once (the `Proposer` contract): the
    features of lookup steps wait here and reach `inner` with its next call's, contiguous.
    Lossless as each proposer alone: a step verifies one proposer's drafts, by the same rules.
    """

    def __init__(self, inner, ngram: int, inner_block: int | None = None):
        """inner_block: the block `inner` drafts (None: the loop's)."""
        self.inner = inner
        self.ngram = ngram
        self.inner_block = inner_block
        self.target_layer_ids = inner.target_layer_ids
        self.pending: list[torch.Tensor] = []

    def reset(self) -> None:
        self.inner.reset()
        self.pending = []

    def _inner_shape(self, block_size: int, num_drafts: int) -> tuple[int, int]:
        """(block, drafts) of `inner` on a loop step of `block_size` and `num_drafts`."""
        block = self.inner_block or block_size
        return block, min(num_drafts, block - 1)

    def lookup(self, committed_ids, new_features, block_size: int, num_drafts: int) -> torch.Tensor | None:
        """The looked-up tokens (k,) of a lookup step, whose features then wait here; None where
        `inner` drafts this step (arguments as `Proposer.draft`)."""
        _, inner_drafts = self._inner_shape(block_size, num_drafts)
        tokens = lookup_continuation(committed_ids[0].tolist(), self.ngram, self.ngram, num_drafts)
        if len(tokens) < inner_drafts:
            return None
        if new_features is not None:
            self.pending.append(new_features)
        return torch.tensor(tokens, dtype=torch.long, device=committed_ids.device)

    def inner_request(self, new_features, block_size: int, num_drafts: int) -> tuple[torch.Tensor | None, int, int]:
        """(new features, block, drafts) for `inner` on a step it drafts: the features of the lookup
        steps since its last call, then `new_features`; its block and how many it drafts."""
        if self.pending and new_features is not None:
            new_features = torch.cat([*self.pending, new_features], dim=1)
        self.pending = []
        return (new_features, *self._inner_shape(block_size, num_drafts))

    def draft(self, committed_ids, new_features, block_size, num_drafts, sampling, generator) -> Drafts:
        tokens = self.lookup(committed_ids, new_features, block_size, num_drafts)
        if tokens is not None:
            return Drafts(tokens=tokens)
        return self.inner.draft(committed_ids, *self.inner_request(new_features, block_size, num_drafts), sampling, generator)
