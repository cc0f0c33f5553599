"""Verification rules on synthetic blocks: many trials, exact answers.

A block of k drafts and k + 1 target rows with a small vocabulary, fixed logits and
drafts sampled from the drafter's distribution, verified thousands of times. Lossless
means: at every block position j, among the trials that emit a token there, the token
follows the target's row j (computed in the test, not by the library), whatever the
drafter proposed. The same check must reject each known way of getting it wrong
(`helpers.decoding.flawed_verify`), so its power is tested too.
"""

import pytest
import torch

from dflash.decoding import SamplingConfig
from dflash.decoding.verify import Drafts, verify
from helpers.decoding import VERIFY_FLAWS, flawed_verify
from helpers.stats import chi_square_p_value, reference_probabilities

VOCAB = 8
NUM_DRAFTS = 3
TRIALS = 3000
ALPHA = 1e-3
SETTINGS = {
    "T0.7-top_p0.8": SamplingConfig(temperature=0.7, top_p=0.8),
    "T1.3-top_k5": SamplingConfig(temperature=1.3, top_k=5),
}


def synthetic_block(seed: int):
    """(k + 1, V) target logits and (k, V) drafter logits close to them, not equal.
    (With seed 1, under both settings every target row keeps 3-5 tokens and each draft
    is accepted 55-76% of the time: every accept length is common.)"""
    generator = torch.Generator().manual_seed(seed)
    target_logits = torch.randn(NUM_DRAFTS + 1, VOCAB, generator=generator)
    draft_logits = target_logits[:NUM_DRAFTS] + torch.randn(NUM_DRAFTS, VOCAB, generator=generator)
    return target_logits, draft_logits


def check_verify_is_lossless(verify_fn, sampling: SamplingConfig, seed: int = 1) -> list[int]:
    """Assert the emitted tokens at every block position follow the target's row there
    (Bonferroni over positions); return how often each accept length 0..k occurred."""
    target_logits, draft_logits = synthetic_block(seed)
    filters = dict(temperature=sampling.temperature, top_k=sampling.top_k, top_p=sampling.top_p)
    target_rows = [reference_probabilities(row, **filters) for row in target_logits]
    draft_probs = torch.stack([reference_probabilities(row, **filters) for row in draft_logits]).float()
    generator = torch.Generator().manual_seed(seed)
    emitted_at = [[] for _ in range(NUM_DRAFTS + 1)]
    accept_counts = [0] * (NUM_DRAFTS + 1)
    for _ in range(TRIALS):
        tokens = torch.multinomial(draft_probs, 1, generator=generator).flatten()
        accepted, next_token = verify_fn(target_logits, Drafts(tokens=tokens, probs=draft_probs), sampling, generator)
        accept_counts[accepted] += 1
        for position, token in enumerate(tokens[:accepted].tolist() + [next_token]):
            emitted_at[position].append(token)
    for position, (samples, row) in enumerate(zip(emitted_at, target_rows)):
        support = {token: float(row[token]) for token in row.nonzero().flatten().tolist()}
        p_value = chi_square_p_value(samples, support) * len(target_rows)
        assert p_value > ALPHA, f"position {position}: emitted tokens do not follow the target (p={p_value:.2g})"
    return accept_counts


@pytest.mark.parametrize("setting", SETTINGS)
@pytest.mark.parametrize("rule", ["rejection", "match"])
def test_verify_emits_the_targets_distribution_at_every_position(rule, setting):
    sampling = SamplingConfig(**{**SETTINGS[setting].__dict__, "verify_rule": rule})
    accept_counts = check_verify_is_lossless(verify, sampling)
    # every accept length occurs often, so the deeper positions have samples to test
    assert min(accept_counts) >= TRIALS // 150, accept_counts


@pytest.mark.parametrize("flaw", VERIFY_FLAWS)
def test_the_lossless_check_rejects_each_flawed_verifier(flaw):
    rule = "match" if flaw.startswith("match") else "rejection"
    for setting in SETTINGS.values():
        sampling = SamplingConfig(**{**setting.__dict__, "verify_rule": rule})
        with pytest.raises(AssertionError, match="do not follow the target"):
            check_verify_is_lossless(flawed_verify(flaw), sampling)


def test_greedy_verify_keeps_the_leading_agreeing_run():
    target_logits = torch.full((4, VOCAB), -1.0)
    target_logits[torch.arange(4), torch.tensor([5, 2, 7, 1])] = 1.0  # the target's argmax per row
    cases = {(5, 2, 7): (3, 1), (5, 3, 7): (1, 2), (4, 2, 7): (0, 5), (5, 2, 6): (2, 7), (): (0, 5)}
    for drafts, expected in cases.items():
        tokens = torch.tensor(drafts, dtype=torch.long)
        assert verify(target_logits[: len(drafts) + 1], Drafts(tokens=tokens), SamplingConfig(), None) == expected
