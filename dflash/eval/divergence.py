"""Why a greedy output differs from the autoregressive baseline: a near-tie, or a bug.

Greedy speculative decoding is lossless in exact arithmetic. In float32 our outputs equal
the target's greedy output token for token. In bf16/fp16 they cannot always: a verify
forward runs the target on 1 + k positions at once, the baseline on one, and products
of different shapes round differently (other kernels, other reduction orders). Where
the target's two best next tokens have logits within rounding of each other, the two
computations can rank them differently; each output is then the greedy output of the
target as that computation evaluated it, and they part ways from there
(docs/design.md invariant 18).

Diagnosis of a divergence at output position p (the first token that differs):
- The target's logits at p are recomputed in both computations by replaying them:
  `replay_logits` (`dflash.decoding.replay`) issues again the target forwards that the
  run recorded (`GenerationResult.steps`), through the loop's own functions, for every
  verifier (chain and tree); HF `generate()` is replayed by HF `generate()` itself
  (`hf_generate_logits`). A run without a record (a loop of its own) is not replayed.
- gap (per computation) = its top logit - the lower of the logits of the two tokens
  (the baseline's and the candidate's). When the computation chose one of the two,
  that is the pair's logit difference: the margin by which it broke the tie.
- tolerance = TIE_ULPS rounding steps of the dtype at the row's scale:
  `TIE_ULPS * eps(dtype) * 2**floor(log2(max |logit|))`: two logits closer than one
  step (ulp) of the largest are indistinguishable in the dtype, and each layer's rounding
  moves a logit by a step or two between two shapes (the figures that set TIE_ULPS are
  in docs/design.md, "Measured figures"). In float32 any gap over 4 float32 steps is a bug.
- numerical: gap <= tolerance in both computations (the pair is tied up to rounding
  and each computation chose one of the two). bug: anything else, e.g. a token that
  the candidate's own verify forward did not rank first (a verify rule that kept a
  wrong draft), or an output that ended before the other.

A replay that did not reproduce its run would find the run's token not ranked first and
report a bug: it errs towards alarm, never towards silence.
"""

from __future__ import annotations

import math

import torch

from dflash.decoding.replay import replay_logits
from dflash.target import TargetModel
from dflash.target.cache import decode_attention

__all__ = ["BUG", "NUMERICAL", "TIE_ULPS", "diagnose", "first_difference", "hf_generate_logits", "replay_logits", "tie_tolerance"]

TIE_ULPS = 4
NUMERICAL, BUG = "numerical", "bug"


def first_difference(expected: list[int], got: list[int]) -> int | None:
    """Index of the first token where two outputs differ (or where the shorter one ends); None if equal."""
    if expected == got:
        return None
    return next((i for i, (a, b) in enumerate(zip(expected, got)) if a != b), min(len(expected), len(got)))


def tie_tolerance(logits: torch.Tensor, dtype: torch.dtype) -> float:
    """TIE_ULPS rounding steps of `dtype` at the scale of `logits` (vocab,): see the module docstring."""
    scale = float(logits.abs().max())
    if scale == 0.0 or not math.isfinite(scale):
        return 0.0
    return TIE_ULPS * torch.finfo(dtype).eps * 2.0 ** math.floor(math.log2(scale))


def diagnose(
    position: int,
    expected: int | None,
    got: int | None,
    baseline_logits: torch.Tensor | None,
    candidate_logits: torch.Tensor | None,
    dtype: torch.dtype | None,
) -> dict:
    """Classify one divergence (see the module docstring).

    Args:
        position: output position of the first differing token.
        expected / got: the baseline's and the candidate's token there (None: that output ended).
        baseline_logits / candidate_logits: (vocab,) the target's logits at `position` in
            each computation; None when not replayed (a token is missing, or the caller
            could not replay), which makes the divergence a bug: nothing shows a tie.
        dtype: the target's dtype, whose rounding sets the tolerance (unused when not replayed).
    Returns:
        {position, expected, got, baseline: {expected_logit, got_logit, top_logit, gap},
        candidate: {...}, tolerance, kind: "numerical" | "bug"}; the two computations'
        entries and the tolerance are None when not replayed.
    """
    entry = {"position": position, "expected": expected, "got": got, "baseline": None, "candidate": None}
    if expected is None or got is None or baseline_logits is None or candidate_logits is None:
        return entry | {"tolerance": None, "kind": BUG}
    tolerance = max(tie_tolerance(baseline_logits, dtype), tie_tolerance(candidate_logits, dtype))
    entry["baseline"] = _gaps(baseline_logits, expected, got)
    entry["candidate"] = _gaps(candidate_logits, expected, got)
    tied = entry["baseline"]["gap"] <= tolerance and entry["candidate"]["gap"] <= tolerance
    return entry | {"tolerance": tolerance, "kind": NUMERICAL if tied else BUG}


def _gaps(logits: torch.Tensor, expected: int, got: int) -> dict:
    top = float(logits.max())
    expected_logit, got_logit = float(logits[expected]), float(logits[got])
    return {"expected_logit": expected_logit, "got_logit": got_logit, "top_logit": top,
            "gap": top - min(expected_logit, got_logit)}  # fmt: skip


@torch.inference_mode()
@decode_attention()  # the kernels the timed generate() ran under (dflash.eval.evaluator)
def hf_generate_logits(target: TargetModel, input_ids: torch.Tensor, position: int, options: dict) -> torch.Tensor:
    """The target's raw logits (vocab,) for output token `position` of HF greedy `generate()`.

    options: the keyword arguments the timed `generate()` call used (stop and pad ids,
    greedy); `generate()` decodes one token per forward whatever its length limit, so
    stopping after `position` replays the same computation.
    """
    input_ids = input_ids.to(target.device)
    output = target.model.generate(
        input_ids,
        attention_mask=torch.ones_like(input_ids),
        max_new_tokens=position + 1,
        output_logits=True,
        return_dict_in_generate=True,
        **options,
    )
    return output.logits[position][0].float()
