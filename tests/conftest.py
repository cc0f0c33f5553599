"""Shared fixtures: tiny random targets of two architectures and proposer doubles."""

from __future__ import annotations

import pytest
import torch

from dflash.target import TargetModel
from dflash.target.tiny import build_tiny_target

ARCHS = ["qwen3", "llama"]

# Tiny models at batch 1 gain nothing from intra-op threads, and on a loaded 2-core
# machine spinning threads make them 10-30x slower.
torch.set_num_threads(1)


@pytest.fixture(scope="session", params=ARCHS)
def tiny_target(request) -> TargetModel:
    """A random tiny target (Qwen3 and Llama architectures), byte tokenizer."""
    model, tokenizer = build_tiny_target(request.param, seed=0)
    return TargetModel(model, tokenizer)


@pytest.fixture(scope="session")
def qwen3_target() -> TargetModel:
    model, tokenizer = build_tiny_target("qwen3", seed=0)
    return TargetModel(model, tokenizer)


def hf_greedy(target: TargetModel, input_ids: torch.Tensor, max_new_tokens: int, eos=None) -> list[int]:
    """The target's own greedy continuation via HF `generate()` (new tokens only)."""
    out = target.model.generate(
        input_ids,
        attention_mask=torch.ones_like(input_ids),
        max_new_tokens=max_new_tokens,
        do_sample=False,
        eos_token_id=eos,
        pad_token_id=target.tokenizer.pad_token_id,
    )
    return out[0, input_ids.shape[1] :].tolist()


class OracleProposer:
    """Test double: drafts with the target itself.

    greedy_oracle=True returns one-hot logits of the target's own greedy continuation
    (so greedy decoding accepts every draft). Otherwise it returns the target's logits
    for each slot (conditioned on the greedy continuation before it) divided by
    `sharpen`, a distribution close to but different from the target's, for sampling
    tests where both acceptances and rejections must happen.
    """

    target_layer_ids = None

    def __init__(self, target: TargetModel, greedy_oracle: bool = True, sharpen: float = 1.0):
        self.target = target
        self.greedy_oracle = greedy_oracle
        self.sharpen = sharpen
        self.calls = 0

    def reset(self):
        pass

    @torch.no_grad()
    def propose(self, committed_ids, new_features, block_size, num_drafts):
        self.calls += 1
        ids = committed_ids
        rows = []
        for _ in range(num_drafts):
            logits = self.target.model(ids, attention_mask=torch.ones_like(ids)).logits[0, -1].float()
            rows.append(logits)
            ids = torch.cat([ids, logits.argmax().view(1, 1)], dim=1)
        logits = torch.stack(rows)
        if self.greedy_oracle:
            one_hot = torch.full_like(logits, -1e4)
            return one_hot.scatter(1, logits.argmax(-1, keepdim=True), 0.0)
        return logits / self.sharpen


class PartialOracleProposer(OracleProposer):
    """Test double: the target's greedy continuation with one wrong token per block.

    At every step it draws the slot to corrupt uniformly from 0..num_drafts (from its
    own seeded generator); slot == num_drafts corrupts nothing. The corrupted slot
    gets a token different from the target's argmax, so greedy verification accepts
    exactly `slot` drafts: over a request every accept length 0..B-1 occurs.
    `planned_accepts` records the accept length each step should produce, for tests to
    compare with what the engine reports.
    """

    def __init__(self, target: TargetModel, seed: int = 0):
        super().__init__(target, greedy_oracle=True)
        self.generator = torch.Generator().manual_seed(seed)
        self.planned_accepts: list[int] = []

    def reset(self):
        self.planned_accepts = []

    def propose(self, committed_ids, new_features, block_size, num_drafts):
        logits = super().propose(committed_ids, new_features, block_size, num_drafts)
        wrong_slot = int(torch.randint(0, num_drafts + 1, (1,), generator=self.generator))
        self.planned_accepts.append(wrong_slot)
        if wrong_slot < num_drafts:
            right = int(logits[wrong_slot].argmax())
            wrong = (right + 1) % logits.shape[-1]
            logits[wrong_slot] = -1e4
            logits[wrong_slot, wrong] = 0.0
        return logits
