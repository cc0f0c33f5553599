"""Issue a recorded generation's target forwards again, to read the logits it decided on.

The loop (`dflash.decoding.loop`) records every verify forward (`VerifyStep`); the
replay runs the same prefill and the same verify forwards, built by the same functions
(`prefill_forward`, `verify_forward`, the verifier's `layout` and `compact`) from the
recorded tokens and structure, so shapes, masks, positions and cache history are the
run's own, whichever verifier ran. Target features are not tapped: they do not change
the logits. The replay assumes kernels that are deterministic for equal shapes (CPU;
CUDA GEMMs and attention forwards without atomics).
"""

from __future__ import annotations

import torch

from dflash.decoding.chain import ChainVerifier
from dflash.decoding.loop import VerifyStep, prefill_forward, verify_forward
from dflash.decoding.tree import TreeVerifier
from dflash.target import TargetModel
from dflash.target.cache import decode_attention

#: verifier name (`VerifyStep.verifier`) -> its class
VERIFIERS = {verifier.name: verifier for verifier in (ChainVerifier, TreeVerifier)}


@torch.inference_mode()
@decode_attention()  # the loop's kernels: the same forwards must give the same logits
def replay_logits(target: TargetModel, input_ids: torch.Tensor, steps: list[VerifyStep], position: int) -> torch.Tensor:
    """The target's logits (V,) from which the run chose output token `position`.

    Args:
        input_ids: (1, P) the run's prompt.
        steps: the run's record (`GenerationResult.steps`).
        position: output index, < 1 + the tokens the steps emitted (0: the prefill's token).
    """
    device = target.device
    input_ids = input_ids.to(device)
    cache = target.new_cache()
    out = prefill_forward(target, input_ids, cache, None)
    if position == 0:
        return out.logits[0, -1]
    emitted = 1
    for step in steps:
        verifier = VERIFIERS[step.verifier]
        tokens = torch.tensor(step.input_ids, dtype=torch.long, device=device)
        drafts = verifier.rebuild(tokens[1:], step.parents)
        out = verify_forward(target, cache, verifier, tokens[:1], drafts, step.anchor_position, None)
        if position < emitted + len(step.emitted):
            return out.logits[0, step.kept_rows[position - emitted]]
        verifier.compact(cache, step.anchor_position, step.kept_rows)
        emitted += len(step.emitted)
    raise ValueError(f"output position {position} is past the {emitted} tokens the run emitted")
