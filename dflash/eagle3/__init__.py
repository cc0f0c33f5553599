"""EAGLE-3, the trained autoregressive baseline beside DFlash: one-layer drafter (model),
training-time test (training, module), EAGLE-3 directory layout (io) and chain drafting
(proposer)."""

from __future__ import annotations

from dflash.eagle3.config import Eagle3Config, default_eagle3_layer_ids
from dflash.eagle3.io import load_eagle3, save_eagle3
from dflash.eagle3.model import Eagle3Drafter
from dflash.eagle3.proposer import Eagle3Proposer


def build_eagle3_proposer(path: str | None, target, num_draft_tokens: int, seed: int = 0) -> Eagle3Proposer:
    """An `Eagle3Proposer` for `target` (a `TargetModel`) from the drafter directory at
    `path`, or a randomly initialised drafter sized from the target's config (path None).
    num_draft_tokens: the chain length k the evaluation will ask for (verify width k + 1)."""
    if path is None:
        import torch

        torch.manual_seed(seed)
        drafter = Eagle3Drafter(Eagle3Config.from_target(target.config)).to(target.device)
    else:
        drafter = load_eagle3(path, device=target.device)
    return Eagle3Proposer(drafter, target.embed, target.draft_dtype)


__all__ = [
    "Eagle3Config",
    "Eagle3Drafter",
    "Eagle3Proposer",
    "build_eagle3_proposer",
    "default_eagle3_layer_ids",
    "load_eagle3",
    "save_eagle3",
]
