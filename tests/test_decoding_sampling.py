"""Sampling stays lossless: the output distribution is the target's own.

Checked with a chi-square test on the joint distribution of the first three generated
tokens (the 2nd and 3rd come out of verify steps) over many seeds, against the exact
distribution computed from the target, for both verification rules.
"""

import itertools

import pytest
import torch
from scipy.stats import chisquare

from dflash.decoding import SamplingConfig, generate
from dflash.decoding.sampling import probabilities
from tests.conftest import OracleProposer
from tests.test_decoding_greedy import random_proposer

NUM_SAMPLES = 1500


@torch.no_grad()
def exact_joint(target, ids, sampling, length):
    """{(t1, .., t_length): probability} under the target's sampling distribution."""
    joint = {(): 1.0}
    for _ in range(length):
        nxt = {}
        for prefix, p_prefix in joint.items():
            seq = torch.cat([ids, torch.tensor([prefix], dtype=torch.long)], dim=1)
            probs = probabilities(target.model(seq).logits[0, -1], sampling)
            for token in probs.nonzero().flatten().tolist():
                nxt[prefix + (token,)] = p_prefix * float(probs[token])
        joint = nxt
    return joint


def chi_square_p_value(samples, joint):
    """Pool cells with expected count < 5; unseen-support samples fail outright."""
    assert all(s in joint for s in samples), "sampled a sequence the target cannot produce"
    counts = {cell: 0 for cell in joint}
    for s in samples:
        counts[s] += 1
    n = len(samples)
    observed, expected, pooled_obs, pooled_exp = [], [], 0, 0.0
    for cell, p in joint.items():
        if p * n >= 5:
            observed.append(counts[cell])
            expected.append(p * n)
        else:
            pooled_obs += counts[cell]
            pooled_exp += p * n
    if pooled_exp > 0:
        observed.append(pooled_obs)
        expected.append(pooled_exp)
    total = sum(expected)  # float32 probabilities sum to 1 only up to rounding
    return chisquare(observed, [e * n / total for e in expected]).pvalue


def run_case(target, proposer, rule):
    sampling = SamplingConfig(temperature=1.0, top_k=4, verify_rule=rule)
    ids = target.tokenizer("def f(x):", return_tensors="pt").input_ids
    samples, accepted = [], 0
    for seed in range(NUM_SAMPLES):
        result = generate(
            target, ids, max_new_tokens=3, block_size=4, proposer=proposer, sampling=sampling,
            generator=torch.Generator().manual_seed(seed),
        )
        samples.append(tuple(result.output_ids))
        accepted += sum(n - 1 for n in result.acceptance_lengths)
    return chi_square_p_value(samples, exact_joint(target, ids, sampling, 3)), accepted


@pytest.mark.slow
@pytest.mark.parametrize("rule", ["rejection", "match"])
def test_sampling_matches_target_distribution_with_close_drafter(tiny_target, rule):
    proposer = OracleProposer(tiny_target, greedy_oracle=False, sharpen=0.6)
    p_value, accepted = run_case(tiny_target, proposer, rule)
    assert accepted > NUM_SAMPLES // 4, "drafts were too rarely accepted to test the accept path"
    assert p_value > 1e-3


@pytest.mark.slow
@pytest.mark.parametrize("rule", ["rejection", "match"])
def test_sampling_matches_target_distribution_with_random_drafter(qwen3_target, rule):
    p_value, _ = run_case(qwen3_target, random_proposer(qwen3_target, block_size=4), rule)
    assert p_value > 1e-3


def test_chi_square_check_rejects_a_wrong_distribution(qwen3_target):
    """The check itself has power: samples drawn at the wrong temperature fail it."""
    ids = qwen3_target.tokenizer("def f(x):", return_tensors="pt").input_ids
    sampling = SamplingConfig(temperature=1.0, top_k=4)
    joint = exact_joint(qwen3_target, ids, sampling, 2)
    wrong = SamplingConfig(temperature=1.6, top_k=4)
    samples = [
        tuple(generate(qwen3_target, ids, max_new_tokens=2, sampling=wrong, generator=torch.Generator().manual_seed(s)).output_ids)
        for s in range(NUM_SAMPLES)
    ]
    assert chi_square_p_value(samples, joint) < 1e-3


def test_top_p_and_top_k_filters():
    logits = torch.tensor([3.0, 2.0, 1.0, 0.0, -1.0])
    assert (probabilities(logits, SamplingConfig(temperature=1.0, top_k=2)) > 0).sum() == 2
    probs = probabilities(logits, SamplingConfig(temperature=1.0, top_p=0.7))
    full = logits.softmax(-1)
    assert full[0] < 0.7 <= full[:2].sum()
    assert (probs > 0).tolist() == [True, True, False, False, False]
    assert probs.sum() == pytest.approx(1.0)
