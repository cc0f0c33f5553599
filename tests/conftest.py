"""Shared fixtures: tiny random targets of two architectures and proposer doubles."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from scipy.stats import chisquare

from dflash.decoding.sampling import probabilities, sample
from dflash.errors import require
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
        # Next-token logits per prefix: consecutive steps share most of their greedy
        # lookahead, and sampling tests revisit the same few prefixes thousands of times.
        self._next_logits: dict[tuple[int, ...], torch.Tensor] = {}

    def reset(self):
        pass

    @torch.no_grad()
    def next_token_logits(self, ids: torch.Tensor) -> torch.Tensor:
        """(vocab,) float target logits after the (1, L) ids, one full forward per new prefix."""
        key = tuple(ids[0].tolist())
        if key not in self._next_logits:
            self._next_logits[key] = self.target.model(ids, attention_mask=torch.ones_like(ids)).logits[0, -1].float()
        return self._next_logits[key]

    def propose(self, committed_ids, new_features, block_size, num_drafts):
        self.calls += 1
        ids = committed_ids
        rows = []
        for _ in range(num_drafts):
            logits = self.next_token_logits(ids)
            rows.append(logits)
            ids = torch.cat([ids, logits.argmax().view(1, 1)], dim=1)
        logits = torch.stack(rows)  # a fresh tensor: callers may edit it without touching the memo
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

    `wrong_slots`, when given, replaces the random draws by a schedule cycled through
    step by step (restarting with each request; a slot above num_drafts corrupts
    nothing): a permutation of 0..B-1 makes every accept length occur within B steps,
    where random draws need about B * ln(B) steps, hundreds of tokens at B = 16.
    """

    def __init__(self, target: TargetModel, seed: int = 0, wrong_slots: list[int] | None = None):
        super().__init__(target, greedy_oracle=True)
        self.generator = torch.Generator().manual_seed(seed)
        self.wrong_slots = wrong_slots
        self.planned_accepts: list[int] = []

    def reset(self):
        self.planned_accepts = []

    def _wrong_slot(self, num_drafts: int) -> int:
        if self.wrong_slots is None:
            return int(torch.randint(0, num_drafts + 1, (1,), generator=self.generator))
        return min(self.wrong_slots[len(self.planned_accepts) % len(self.wrong_slots)], num_drafts)

    def propose(self, committed_ids, new_features, block_size, num_drafts):
        logits = super().propose(committed_ids, new_features, block_size, num_drafts)
        wrong_slot = self._wrong_slot(num_drafts)
        self.planned_accepts.append(wrong_slot)
        if wrong_slot < num_drafts:
            right = int(logits[wrong_slot].argmax())
            wrong = (right + 1) % logits.shape[-1]
            logits[wrong_slot] = -1e4
            logits[wrong_slot, wrong] = 0.0
        return logits


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
    return float(chisquare(observed, [e * n / total for e in expected]).pvalue)


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


VERIFY_FLAWS = (
    "first_rejection_is_last",
    "residual_from_next_row",
    "residual_is_target_row",
    "one_uniform_for_all_drafts",
    "temperature_multiplied",
    "match_counts_all_matches",
)


def flawed_verify(flaw: str):
    """Test double: the library's `verify` for sampling with one known bug, as a negative
    control that the statistical lossless checks must reject. Flaws:
      first_rejection_is_last: stops at the last rejected draft (`i = rejected[-1]`);
      residual_from_next_row: the residual uses target row i + 1 instead of row i;
      residual_is_target_row: resamples from p_i instead of norm(max(0, p_i - q_i));
      one_uniform_for_all_drafts: one uniform shared by every draft of the block;
      temperature_multiplied: target logits multiplied by T instead of divided;
      match_counts_all_matches: the "match" rule keeps every matching draft, not the
        leading run.
    """
    require(flaw in VERIFY_FLAWS, "flaw", f"unknown flaw {flaw!r}")

    def verify_with_flaw(target_logits, drafts, sampling, generator):
        temperature = 1 / sampling.temperature if flaw == "temperature_multiplied" else sampling.temperature
        target_probs = probabilities(target_logits, replace(sampling, temperature=temperature))
        k = drafts.tokens.numel()
        if k == 0:
            return 0, int(sample(target_probs[0], generator))
        if sampling.verify_rule == "match":
            agree = (drafts.tokens == sample(target_probs, generator)[:k]).int()
            accepted = int(agree.sum() if flaw == "match_counts_all_matches" else agree.cumprod(0).sum())
            return accepted, int(sample(target_probs[accepted], generator))
        rows = torch.arange(k)
        p, q = target_probs[rows, drafts.tokens], drafts.probs[rows, drafts.tokens]
        u = torch.rand(1 if flaw == "one_uniform_for_all_drafts" else k, generator=generator).expand(k)
        rejected = (u * q > p).nonzero().flatten()
        if rejected.numel() == 0:
            return k, int(sample(target_probs[k], generator))
        i = int(rejected[-1] if flaw == "first_rejection_is_last" else rejected[0])
        if flaw == "residual_is_target_row":
            return i, int(sample(target_probs[i], generator))
        target_row = target_probs[i + 1] if flaw == "residual_from_next_row" else target_probs[i]
        residual = (target_row - drafts.probs[i]).clamp_min(0)
        residual = residual / residual.sum() if residual.sum() > 0 else target_row
        return i, int(sample(residual, generator))

    return verify_with_flaw
