"""Statistics for the lossless checks: chi-square p-values and the target's sampling
distribution written out independently of the library.

The chi-square tail is torch's regularised upper incomplete gamma function, not scipy:
with scipy installed, every process that imports Lightning (torchmetrics) or a
transformers model also imports scipy.signal and scipy.optimize, about 1.3 s of each
`python -m dflash.train` in the end-to-end tests (2-core Xeon)."""

from __future__ import annotations

import torch

from dflash.decoding import SamplingConfig, generate
from dflash.target import TargetModel


def chi2_sf(statistic: float, dof: int) -> float:
    """P(X >= statistic) for X chi-square with `dof` degrees of freedom (scipy's `chi2.sf`,
    equal to it to about 1e-14 relative)."""
    return float(
        torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64), torch.tensor(statistic / 2, dtype=torch.float64))
    )


def chi_square_p_value(samples, probs: dict) -> float:
    """Pearson chi-square p-value of `samples` against {cell: probability}.

    Cells with expected count < 5 are pooled; a sample outside the support gives 0.
    """
    if any(s not in probs for s in samples):
        return 0.0
    counts = {cell: 0 for cell in probs}
    for s in samples:
        counts[s] += 1
    n = len(samples)
    observed, expected, pooled_obs, pooled_exp = [], [], 0, 0.0
    for cell, p in probs.items():
        if p * n >= 5:
            observed.append(counts[cell])
            expected.append(p * n)
        else:
            pooled_obs += counts[cell]
            pooled_exp += p * n
    if pooled_exp > 0:
        observed.append(pooled_obs)
        expected.append(pooled_exp)
    if len(observed) < 2:
        return 1.0
    total = sum(expected)  # float32 probabilities sum to 1 only up to rounding
    statistic = sum((o - e * n / total) ** 2 / (e * n / total) for o, e in zip(observed, expected))
    return chi2_sf(statistic, len(observed) - 1)  # Pearson's test, as scipy.stats.chisquare


def reference_probabilities(logits: torch.Tensor, temperature: float, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """The target's sampling distribution written out independently of the library's
    `probabilities()`, for lossless checks: softmax(logits / T) over the top_k most
    likely tokens, then the smallest set of most likely tokens whose renormalised mass
    reaches top_p, renormalised. (vocab,) logits -> (vocab,) float64 probabilities."""
    scaled = logits.double() / temperature
    weights = (scaled - scaled.max()).exp()
    ranked = sorted(range(len(weights)), key=lambda token: -float(weights[token]))
    kept = ranked[:top_k] if top_k > 0 else ranked
    mass = sum(float(weights[token]) for token in kept)
    nucleus, covered = [], 0.0
    for token in kept:
        nucleus.append(token)
        covered += float(weights[token]) / mass
        if covered >= top_p:
            break
    probs = torch.zeros_like(weights)
    probs[nucleus] = weights[nucleus] / weights[nucleus].sum()
    return probs


@torch.no_grad()
def exact_joint(target: TargetModel, ids: torch.Tensor, sampling: SamplingConfig, length: int) -> dict:
    """{(t1, .., t_length): probability} under the target's sampling distribution."""
    filters = dict(temperature=sampling.temperature, top_k=sampling.top_k, top_p=sampling.top_p)
    joint = {(): 1.0}
    for _ in range(length):
        extended = {}
        for prefix, p_prefix in joint.items():
            sequence = torch.cat([ids, torch.tensor([prefix], dtype=torch.long)], dim=1)
            probs = reference_probabilities(target.model(sequence).logits[0, -1], **filters)
            for token in probs.nonzero().flatten().tolist():
                extended[prefix + (token,)] = p_prefix * float(probs[token])
        joint = extended
    return joint


def sampled_p_value(target: TargetModel, ids: torch.Tensor, proposer, sampling: SamplingConfig, samples: int,
                    length: int = 4, block_size: int = 4) -> tuple[float, list[int]]:  # fmt: skip
    """`samples` outputs of `generate()` (seed i for the i-th) of `length` tokens after `ids`: their
    chi-square p-value against the target's exact joint, and every verify step's acceptance length."""
    outputs, lengths = [], []
    for seed in range(samples):
        result = generate(target, ids, max_new_tokens=length, block_size=block_size, proposer=proposer, sampling=sampling,
                          generator=torch.Generator().manual_seed(seed))  # fmt: skip
        outputs.append(tuple(result.output_ids))
        lengths.extend(result.acceptance_lengths)
    return chi_square_p_value(outputs, exact_joint(target, ids, sampling, length)), lengths
