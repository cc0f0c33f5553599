"""Sampling stays lossless end to end: the output distribution is the target's own.

`generate()` runs a few hundred times per case with a drafter close to the target (so
verify steps accept some drafts and reject others) and blocks whose first verify step
carries two drafts; the joint distribution of the first four tokens is compared by a
chi-square test with the exact one, computed from the target's logits with the
filters written out in the test (`helpers.stats.reference_probabilities`), not the
library's `probabilities()`. The statistical power per verification rule lives in
tests/decoding/test_verify.py; here the engine's plumbing is under test.
"""

import pytest
import torch

import dflash.decoding.chain
from dflash.decoding import SamplingConfig
from dflash.decoding.sampling import probabilities
from dflash.target import TargetModel
from dflash.toy.tiny import build_tiny_target
from helpers.decoding import OracleProposer, flawed_verify
from helpers.stats import reference_probabilities, sampled_p_value

NUM_SAMPLES = 800
OUTPUT_LENGTH = 4  # the prefill token, then a verify step of two drafts, then what is left
BLOCK_SIZE = 4
ALPHA = 1e-3
# (architecture, sampling): each rule once, at both temperatures, with both filters.
CASES = {
    "rejection": ("qwen3", SamplingConfig(temperature=0.7, top_k=3, top_p=0.9, verify_rule="rejection")),
    "match": ("llama", SamplingConfig(temperature=1.3, top_k=3, top_p=0.9, verify_rule="match")),
}


@pytest.fixture(scope="module")
def two_layer_targets() -> dict[str, TargetModel]:
    """Two-layer tiny targets: the engine's sampling plumbing does not depend on depth,
    and each of the thousands of forwards costs a third of the six-layer one's."""
    return {arch: TargetModel(*build_tiny_target(arch, seed=0, num_layers=2)) for arch, _ in CASES.values()}


def check_generate_is_lossless(target: TargetModel, sampling: SamplingConfig) -> list[int]:
    """Assert NUM_SAMPLES sampled outputs follow the exact joint; return the acceptance lengths."""
    ids = target.tokenizer("def f(x):", return_tensors="pt").input_ids
    proposer = OracleProposer(target, greedy_oracle=False, sharpen=0.6)
    p_value, lengths = sampled_p_value(target, ids, proposer, sampling, NUM_SAMPLES, OUTPUT_LENGTH, BLOCK_SIZE)
    assert p_value > ALPHA, f"outputs do not follow the target's distribution (p={p_value:.2g})"
    return lengths


@pytest.mark.slow
@pytest.mark.parametrize("rule", CASES)
def test_sampled_outputs_follow_the_targets_distribution(two_layer_targets, rule):
    arch, sampling = CASES[rule]
    lengths = check_generate_is_lossless(two_layer_targets[arch], sampling)
    # the two-draft step accepted none, one and both drafts, each many times
    assert all(lengths.count(n) >= NUM_SAMPLES // 10 for n in (1, 2, 3)), lengths


@pytest.mark.slow
def test_the_end_to_end_check_rejects_a_flawed_verifier(two_layer_targets, monkeypatch):
    """Negative control: the same check fails when verification multiplies by T."""
    arch, sampling = CASES["rejection"]
    monkeypatch.setattr(dflash.decoding.chain, "verify", flawed_verify("temperature_multiplied"))
    with pytest.raises(AssertionError, match="do not follow"):
        check_generate_is_lossless(two_layer_targets[arch], sampling)


@pytest.mark.parametrize(
    "temperature,top_k,top_p", [(0.7, 0, 1.0), (1.3, 0, 1.0), (0.7, 0, 0.8), (1.3, 0, 0.6), (1.3, 5, 1.0), (0.7, 20, 0.9)]
)
def test_probabilities_equal_the_reference_filters(temperature, top_k, top_p):
    """The library's distribution is softmax(logits / T), then top-k, then top-p, as
    written out in the test, on rows whose nucleus boundaries fall everywhere."""
    logits = 3 * torch.randn(64, 50, generator=torch.Generator().manual_seed(0))
    library = probabilities(logits, SamplingConfig(temperature=temperature, top_k=top_k, top_p=top_p))
    reference = torch.stack([reference_probabilities(row, temperature, top_k, top_p) for row in logits])
    torch.testing.assert_close(library.double(), reference, atol=1e-6, rtol=1e-5)


def test_top_p_and_top_k_filters():
    logits = torch.tensor([3.0, 2.0, 1.0, 0.0, -1.0])
    assert (probabilities(logits, SamplingConfig(temperature=1.0, top_k=2)) > 0).sum() == 2
    probs = probabilities(logits, SamplingConfig(temperature=1.0, top_p=0.7))
    full = logits.softmax(-1)
    assert full[0] < 0.7 <= full[:2].sum()
    assert (probs > 0).tolist() == [True, True, False, False, False]
    assert probs.sum() == pytest.approx(1.0)
