"""The speculative decoding loop (batch size 1).

Per step: the proposer drafts up to B-1 tokens (DFlash: a block [anchor, mask x (B-1)] in
one forward; a `TokenProposer` may return fewer, even none), the target verifies anchor +
drafts in one forward, the longest agreeing prefix is kept plus one
token of the target's own, both caches are cropped to the committed length, and the
features of the kept positions become drafter context. `block_size=1` drafts nothing
and is plain autoregressive decoding through the same code: the in-run baseline.

Cache invariant at the top of each step: committed tokens occupy positions [0, L);
the target cache holds [0, L-1) (it has not yet run on the anchor at L-1), and the
drafter has seen target features of exactly [0, L-1).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from dflash.decoding.proposer import Proposer, TokenProposer
from dflash.decoding.sampling import SamplingConfig, probabilities, sample
from dflash.decoding.verify import Drafts, propose_tokens, verify
from dflash.errors import require
from dflash.target import TargetModel, crop_cache


@dataclass
class GenerationResult:
    """One request's output and measurements.

    output_ids: new tokens only (stop token included when one ended the output).
    acceptance_lengths: tokens emitted by each verify step, i.e. accepted drafts + 1
        (the bonus token counts); the first token, produced by prefill, is not a step.
    draft_counts: draft tokens the target verified in each step (the step's forward covers
        the anchor plus these), aligned with acceptance_lengths.
    prefill_time_s / decode_time_s: wall-clock seconds (CUDA synchronised).
    """

    output_ids: list[int]
    acceptance_lengths: list[int] = field(default_factory=list)
    draft_counts: list[int] = field(default_factory=list)
    prefill_time_s: float = 0.0
    decode_time_s: float = 0.0

    @property
    def num_steps(self) -> int:
        return len(self.acceptance_lengths)

    @property
    def total_time_s(self) -> float:
        return self.prefill_time_s + self.decode_time_s

    @property
    def tokens_per_s(self) -> float:
        """New tokens per second of total (prefill + decode) time."""
        return len(self.output_ids) / self.total_time_s if self.total_time_s > 0 else 0.0

    @property
    def tau(self) -> float:
        """Mean acceptance length per verify step (bonus token included)."""
        return sum(self.acceptance_lengths) / self.num_steps if self.num_steps else 0.0


def synchronize(device: torch.device) -> None:
    """Wait for queued CUDA work so wall-clock timings are real (no-op on CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def target_token(logits: torch.Tensor, sampling: SamplingConfig, generator) -> int:
    """The target's own next token from its (V,) logits: argmax when greedy, else a sample."""
    if sampling.greedy:
        return int(logits.argmax(-1))
    return int(sample(probabilities(logits, sampling), generator))


def _check_drafts(drafts: Drafts, num_drafts: int) -> None:
    """A `TokenProposer` broke its contract: a bug in it, named before verification goes wrong."""
    k = drafts.tokens.numel()
    if drafts.tokens.dim() != 1 or k > num_drafts:
        shape = tuple(drafts.tokens.shape)
        raise RuntimeError(f"the proposer drafted tokens of shape {shape}; expected (k,), k <= {num_drafts}")
    if drafts.probs is not None and drafts.probs.shape[0] != k:
        raise RuntimeError(f"the proposer returned {drafts.probs.shape[0]} distributions for {k} draft tokens")


def prefill(target: TargetModel, input_ids: torch.Tensor, layer_ids, sampling: SamplingConfig, generator):
    """The timed prompt forward that starts every decoding loop.

    Args:
        input_ids: (1, P) prompt ids on the target's device.
        layer_ids: target layers to tap (None: no features).
    Returns:
        (cache holding [0, P), the prompt's features (1, P, F) or None, a GenerationResult
        holding the first token and the prefill time, committed ids (1, P + 1)).
    """
    device = target.device
    synchronize(device)
    start = time.perf_counter()
    cache = target.new_cache()
    prompt_len = input_ids.shape[1]
    # Only the last position's logits are used: (P, vocab) would be ~1 GB at P=2k, vocab 150k.
    out = target.forward(
        input_ids, torch.arange(prompt_len, device=device).unsqueeze(0), cache, layer_ids, logits_to_keep=1
    )
    first = target_token(out.logits[0, -1], sampling, generator)
    synchronize(device)
    result = GenerationResult(output_ids=[first], prefill_time_s=time.perf_counter() - start)
    committed = torch.cat([input_ids, torch.tensor([[first]], device=device)], dim=1)
    return cache, out.features, result, committed


def commit(result: GenerationResult, committed: torch.Tensor, emitted: list[int], stop_ids: set[int], max_new_tokens: int):
    """Record one verify step's emitted tokens, cut right after the first stop token.

    Returns (committed ids (1, L + n), whether generation is done).
    """
    done = False
    for i, token in enumerate(emitted):
        if token in stop_ids:
            emitted, done = emitted[: i + 1], True
            break
    result.output_ids.extend(emitted)
    result.acceptance_lengths.append(len(emitted))
    committed = torch.cat([committed, torch.tensor([emitted], device=committed.device)], dim=1)
    return committed, done or len(result.output_ids) >= max_new_tokens


@torch.inference_mode()
def generate(
    target: TargetModel,
    input_ids: torch.Tensor,
    *,
    max_new_tokens: int,
    block_size: int = 1,
    proposer: Proposer | TokenProposer | None = None,
    stop_token_ids: list[int] | tuple[int, ...] = (),
    sampling: SamplingConfig = SamplingConfig(),
    generator: torch.Generator | None = None,
) -> GenerationResult:
    """Generate up to `max_new_tokens` tokens after `input_ids`, losslessly.

    Args:
        target: the frozen target.
        input_ids: (1, P) prompt ids, P >= 1.
        block_size: B, the verify width: at most B-1 drafts per step; 1 is autoregressive
            decoding (no proposer needed).
        proposer: drafts when B > 1: through `draft` when it has one (`TokenProposer`),
            else through `propose` and `propose_tokens`.
        stop_token_ids: generation ends right after the first of these it emits.
        generator: torch RNG for sampling (on the target's device), for reproducibility.
    """
    require(block_size >= 1, "decoding.block_size", f"must be >= 1, got {block_size}")
    require(max_new_tokens >= 1, "decoding.max_new_tokens", f"must be >= 1, got {max_new_tokens}")
    require(input_ids.dim() == 2 and input_ids.shape[0] == 1, "input_ids", "batch size 1 is supported: shape (1, P)")
    require(input_ids.shape[1] >= 1, "prompt", "the prompt is empty")
    require(block_size == 1 or proposer is not None, "drafter", "block_size > 1 needs a drafter")
    device = target.device
    input_ids = input_ids.to(device)
    stop_ids = set(int(t) for t in stop_token_ids)
    layer_ids = proposer.target_layer_ids if block_size > 1 else None
    if proposer is not None:
        proposer.reset()

    cache, pending_features, result, committed = prefill(target, input_ids, layer_ids, sampling, generator)
    done = result.output_ids[0] in stop_ids or max_new_tokens == 1
    start = time.perf_counter()
    while not done:
        anchor_pos = committed.shape[1] - 1
        num_drafts = min(block_size - 1, max_new_tokens - len(result.output_ids) - 1)
        drafts = Drafts(tokens=torch.empty(0, dtype=torch.long, device=device))
        if num_drafts > 0:
            if hasattr(proposer, "draft"):
                drafts = proposer.draft(committed, pending_features, num_drafts, sampling, generator)
                _check_drafts(drafts, num_drafts)
            else:
                draft_logits = proposer.propose(committed, pending_features, block_size, num_drafts)
                drafts = propose_tokens(draft_logits, sampling, generator)
            pending_features = None
        verify_ids = torch.cat([committed[:, -1], drafts.tokens]).unsqueeze(0)
        positions = torch.arange(anchor_pos, anchor_pos + verify_ids.shape[1], device=device).unsqueeze(0)
        out = target.forward(verify_ids, positions, cache, layer_ids)
        accepted, next_token = verify(out.logits[0], drafts, sampling, generator)

        crop_cache(cache, anchor_pos + accepted + 1)
        if layer_ids is not None:
            kept = out.features[:, : accepted + 1]
            pending_features = kept if pending_features is None else torch.cat([pending_features, kept], dim=1)

        emitted = drafts.tokens[:accepted].tolist() + [next_token]
        result.draft_counts.append(drafts.tokens.numel())
        committed, done = commit(result, committed, emitted, stop_ids, max_new_tokens)
    synchronize(device)
    result.decode_time_s = time.perf_counter() - start
    return result
