"""The one speculative decoding loop (batch size 1), with a pluggable verifier.

Per step: the verifier has the proposer draft up to B-1 tokens (a chain, or a tree of
candidates), lays them out for one target forward over [anchor, drafts] (positions and
attention mask), walks the target's logits to the accepted drafts and the target's own
next token, and compacts the target's KV cache to them; the loop commits the emitted
tokens, hands the kept positions' target features to the proposer as new context, and
stops at a stop token or at `max_new_tokens`. `block_size=1` drafts nothing: plain
autoregressive decoding through the same code, the in-run baseline.

Invariants (every verifier keeps them; tests/decoding/ check them):
- Cache (docs/design.md invariant 13): at the top of each step, committed tokens occupy positions [0, L); the target
  cache holds [0, L-1) (it has not yet run on the anchor at L-1), and the proposer has
  seen target features of exactly [0, L-1), each position once, in order.
- Rows: the verify forward's row 0 is the anchor; row r > 0 is draft r - 1. A verifier
  accepts `kept_rows` = [0, r1, r2, ...]: the anchor and the accepted drafts in output
  order; the token emitted after kept row i is the target's choice there (greedy: the
  row's argmax), so a step emits len(kept_rows) tokens, cut after a stop token.
- Lossless (docs/design.md invariant 12): every emitted token is the target's own choice (or, for rejection sampling,
  distributed as the target's) given the tokens before it.
- Record: `GenerationResult.steps` holds one `VerifyStep` per verify forward, enough to
  issue the same forwards again (`dflash.decoding.replay`), through the same functions
  (`prefill_forward`, `verify_forward`, the verifier's `compact`).
- Kernels: the loop (target and proposer forwards alike) runs under
  `dflash.target.cache.decode_attention()` (no cuDNN SDPA; the reason is there).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from dflash.decoding.chain import ChainVerifier
from dflash.decoding.proposer import Proposer
from dflash.decoding.sampling import SamplingConfig, probabilities, sample
from dflash.engine import argmax
from dflash.errors import require
from dflash.target import TargetModel
from dflash.target.cache import decode_attention


@dataclass
class VerifyStep:
    """One verify forward of the target, as the loop issued it.

    verifier: the verifier's name ("chain", "tree"), whose layout the forward used.
    anchor_position: position of row 0 (prompt length + tokens emitted before the step - 1).
    input_ids: the n + 1 tokens fed: the anchor, then the n drafts (rows 1..n).
    parents: per draft, its parent draft index (-1: the anchor), for tree layouts; None
        for a chain (draft i follows draft i - 1, causal attention).
    kept_rows: rows whose cache entries (and features) were kept, anchor first, in output order.
    emitted: the tokens the step emitted; emitted[i] follows row kept_rows[i] (the target's
        choice there). Shorter than kept_rows only when a stop token or max_new_tokens cut it.
    """

    verifier: str
    anchor_position: int
    input_ids: list[int]
    parents: list[int] | None
    kept_rows: list[int]
    emitted: list[int]


@dataclass
class GenerationResult:
    """One request's output and measurements.

    output_ids: new tokens only (stop token included when one ended the output).
    acceptance_lengths: tokens emitted by each verify step, i.e. accepted drafts + 1
        (the bonus token counts); the first token, produced by prefill, is not a step.
    draft_counts: draft tokens the target verified in each step (the step's forward covers
        the anchor plus these), aligned with acceptance_lengths.
    prefill_time_s / decode_time_s: wall-clock seconds (CUDA synchronised).
    steps: the record of every verify forward (`VerifyStep`), aligned with acceptance_lengths.
    """

    output_ids: list[int]
    acceptance_lengths: list[int] = field(default_factory=list)
    draft_counts: list[int] = field(default_factory=list)
    prefill_time_s: float = 0.0
    decode_time_s: float = 0.0
    steps: list[VerifyStep] = field(default_factory=list)

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


class Verifier(Protocol):
    """How one verify step lays out its drafts and picks the accepted ones.

    Drafts are an object with `tokens` (n,) long on the target's device (`Drafts` for a
    chain, `TokenTree` for a tree) and, for tree layouts, `parents` (n ints). `layout`,
    `compact` and `rebuild` depend on the drafts' structure only, so the replay calls
    them on the class (`dflash.decoding.replay`).
    """

    #: recorded in `VerifyStep.verifier`; the replay looks the class up by it
    name: str

    def check(self, target: TargetModel, sampling: SamplingConfig) -> None:
        """Refuse (ConfigError) a target or sampling setting this verifier cannot keep lossless."""

    def draft(
        self, proposer, committed_ids: torch.Tensor, new_features, block_size: int, num_drafts: int, sampling, generator
    ) -> Any:
        """Have `proposer` draft at most `num_drafts` >= 1 tokens (`Proposer.draft`: the arguments)."""

    def rebuild(self, draft_tokens: torch.Tensor, parents: list[int] | None) -> Any:
        """Drafts with these tokens (n,) and structure (as recorded); n = 0: no drafts."""

    def layout(self, drafts, anchor_position: int, device) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(position ids (1, n + 1), boolean attention mask (True: visible) or None for causal) of [anchor, drafts]."""

    def accept(self, drafts, target_logits: torch.Tensor, sampling, generator) -> tuple[list[int], int]:
        """(kept_rows, next_token) from the forward's logits (n + 1, V); see the module invariants."""

    def compact(self, cache, anchor_position: int, kept_rows: list[int]) -> None:
        """Leave the kept rows' entries at [anchor_position, anchor_position + len(kept_rows)) and drop the rest."""


def synchronize(device: torch.device) -> None:
    """Wait for queued CUDA work so wall-clock timings are real (no-op on CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def target_token(logits: torch.Tensor, sampling: SamplingConfig, generator) -> int:
    """The target's own next token from its (V,) logits: argmax when greedy, else a sample."""
    if sampling.greedy:
        return int(argmax(logits))
    return int(sample(probabilities(logits, sampling), generator))


def prefill_forward(target: TargetModel, input_ids: torch.Tensor, cache, layer_ids):
    """The prompt forward (1, P) into an empty `cache`; only the last row's logits are kept
    ((P, V) would be ~1 GB at P=2k, V=150k)."""
    positions = torch.arange(input_ids.shape[1], device=input_ids.device).unsqueeze(0)
    return target.forward(input_ids, positions, cache, layer_ids, logits_to_keep=1)


def verify_forward(target: TargetModel, cache, verifier, anchor: torch.Tensor, drafts, anchor_position: int, layer_ids):
    """One verify forward over [anchor (1,), drafts]: logits (1, n + 1, V), features or None."""
    input_ids = torch.cat([anchor, drafts.tokens]).unsqueeze(0)
    positions, mask = verifier.layout(drafts, anchor_position, target.device)
    return target.forward(input_ids, positions, cache, layer_ids, attention_mask=mask)


def _commit(result: GenerationResult, emitted: list[int], stop_ids: set[int], max_new_tokens: int) -> tuple[list[int], bool]:
    """Cut one step's tokens right after the first stop token and append them; (tokens, done)."""
    done = False
    for i, token in enumerate(emitted):
        if token in stop_ids:
            emitted, done = emitted[: i + 1], True
            break
    result.output_ids.extend(emitted)
    result.acceptance_lengths.append(len(emitted))
    return emitted, done or len(result.output_ids) >= max_new_tokens


@torch.inference_mode()
@decode_attention()
def generate(
    target: TargetModel,
    input_ids: torch.Tensor,
    *,
    max_new_tokens: int,
    block_size: int = 1,
    proposer: Proposer | None = None,
    verifier: Verifier | None = None,
    stop_token_ids: list[int] | tuple[int, ...] = (),
    sampling: SamplingConfig = SamplingConfig(),
    generator: torch.Generator | None = None,
) -> GenerationResult:
    """Generate up to `max_new_tokens` tokens after `input_ids`, losslessly, recording every step.

    Args:
        input_ids: (1, P) prompt ids, P >= 1.
        block_size: B, the verify width: at most B - 1 drafts (tree: depth) per step; 1 is
            autoregressive decoding (no proposer needed).
        proposer: drafts when block_size > 1 (`Proposer`).
        verifier: lays out and verifies each step's drafts (`TreeVerifier`); None: a chain
            (`ChainVerifier`).
        stop_token_ids: generation ends right after the first of these it emits.
        generator: torch RNG for sampling (on the target's device), for reproducibility.
    Returns:
        the output, its measurements and the record of its verify forwards (`GenerationResult`).
    """
    require(input_ids.dim() == 2 and input_ids.shape[0] == 1, "input_ids", "batch size 1 is supported: shape (1, P)")
    require(input_ids.shape[1] >= 1, "prompt", "the prompt is empty")
    require(
        isinstance(max_new_tokens, int) and max_new_tokens >= 1,
        "max_new_tokens",
        f"must be an integer >= 1, got {max_new_tokens!r}",
    )
    require(isinstance(block_size, int) and block_size >= 1, "block_size", f"must be an integer >= 1, got {block_size!r}")
    require(block_size == 1 or proposer is not None, "drafter", "block_size > 1 needs a drafter")
    verifier = ChainVerifier() if verifier is None else verifier
    verifier.check(target, sampling)
    device = target.device
    input_ids = input_ids.to(device)
    stop_ids = set(int(t) for t in stop_token_ids)
    layer_ids = proposer.target_layer_ids if block_size > 1 else None
    if proposer is not None:
        proposer.reset()
    no_drafts = verifier.rebuild(torch.empty(0, dtype=torch.long, device=device), [])

    synchronize(device)
    start = time.perf_counter()
    cache = target.new_cache()
    out = prefill_forward(target, input_ids, cache, layer_ids)
    first = target_token(out.logits[0, -1], sampling, generator)
    pending_features = out.features
    synchronize(device)
    result = GenerationResult(output_ids=[first], prefill_time_s=time.perf_counter() - start)
    committed = torch.cat([input_ids, torch.tensor([[first]], device=device)], dim=1)
    done = first in stop_ids or max_new_tokens == 1

    start = time.perf_counter()
    while not done:
        anchor_position = committed.shape[1] - 1
        num_drafts = min(block_size - 1, max_new_tokens - len(result.output_ids) - 1)
        drafts = no_drafts
        if num_drafts > 0:
            drafts = verifier.draft(proposer, committed, pending_features, block_size, num_drafts, sampling, generator)
            pending_features = None
        out = verify_forward(target, cache, verifier, committed[:, -1], drafts, anchor_position, layer_ids)
        kept_rows, next_token = verifier.accept(drafts, out.logits[0], sampling, generator)
        verifier.compact(cache, anchor_position, kept_rows)
        if layer_ids is not None:
            # kept rows increase (a parent precedes its children); a leading run is a view, not a gather
            contiguous = kept_rows[-1] == len(kept_rows) - 1
            kept = out.features[:, : len(kept_rows)] if contiguous else out.features[:, kept_rows]
            pending_features = kept if pending_features is None else torch.cat([pending_features, kept], dim=1)

        step_ids = [result.output_ids[-1]] + drafts.tokens.tolist()
        emitted, done = _commit(result, [step_ids[row] for row in kept_rows[1:]] + [next_token], stop_ids, max_new_tokens)
        result.draft_counts.append(len(step_ids) - 1)
        result.steps.append(
            VerifyStep(verifier.name, anchor_position, step_ids, getattr(drafts, "parents", None), kept_rows, emitted)
        )
        committed = torch.cat([committed, torch.tensor([emitted], device=device)], dim=1)
    synchronize(device)
    result.decode_time_s = time.perf_counter() - start
    return result
