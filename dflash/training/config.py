"""Training hyper-parameters of the DFlash training module, as one plain dataclass.

The Hydra entry point fills it from the `training` config group; library code only
sees the dataclass. Gradient clipping (1.0 in the published recipe) and mixed
precision are `lightning.Trainer` settings (`gradient_clip_val=1.0`,
`precision="bf16-mixed"`), not fields here.
"""

from __future__ import annotations

from dataclasses import dataclass

from dflash.errors import require

ANCHOR_SAMPLING_MODES = ("random", "stride")


@dataclass
class TrainingConfig:
    """What the LightningModule needs besides the target and the drafter.

    num_anchors: blocks per sequence (fewer when the sequence has fewer valid anchors).
    anchor_sampling: "random" (uniform without replacement, the published recipe) or
        "stride" (every B-th valid position from the first; ablation).
    loss_gamma: decay of the position weights w_k = exp(-(k-1)/gamma); "auto" picks the
        published value for the block size (see `dflash.training.loss.default_gamma`),
        None gives uniform weights (ablation).
    learning_rate, betas, weight_decay, eps: AdamW.
    warmup_ratio: fraction of the trainer's estimated total steps spent in linear warm-up
        before the cosine decay.
    min_lr_ratio: the cosine decays to learning_rate * min_lr_ratio.
    """

    num_anchors: int = 512
    anchor_sampling: str = "random"
    loss_gamma: float | str | None = "auto"
    learning_rate: float = 6e-4
    betas: tuple[float, float] = (0.9, 0.999)
    weight_decay: float = 0.0
    eps: float = 1e-8
    warmup_ratio: float = 0.04
    min_lr_ratio: float = 0.0

    def __post_init__(self):
        require(self.num_anchors >= 1, "training.num_anchors", f"must be >= 1, got {self.num_anchors}")
        require(
            self.anchor_sampling in ANCHOR_SAMPLING_MODES,
            "training.anchor_sampling",
            f"unknown {self.anchor_sampling!r}; choose one of {list(ANCHOR_SAMPLING_MODES)}",
        )
        gamma = self.loss_gamma
        require(
            gamma is None or gamma == "auto" or (isinstance(gamma, (int, float)) and gamma > 0),
            "training.loss_gamma",
            f"must be 'auto', null (uniform weights) or a positive number, got {gamma!r}",
        )
        require(self.learning_rate > 0, "training.learning_rate", f"must be > 0, got {self.learning_rate}")
        require(len(self.betas) == 2, "training.betas", f"needs two values, got {self.betas!r}")
        self.betas = tuple(float(b) for b in self.betas)
        require(0.0 <= self.warmup_ratio < 1.0, "training.warmup_ratio", f"must be in [0, 1), got {self.warmup_ratio}")
        require(0.0 <= self.min_lr_ratio <= 1.0, "training.min_lr_ratio", f"must be in [0, 1], got {self.min_lr_ratio}")
