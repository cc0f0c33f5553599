"""Training hyper-parameters of the training module (the `training` config group), as one plain dataclass
(a config schema, dflash/schema.py: this module imports no torch; the choices it checks are named here).

Gradient clipping (1.0 in the published recipe) and mixed precision are `lightning.Trainer`
settings (`gradient_clip_val=1.0`, `precision="bf16-mixed"`), not fields here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dflash.errors import require

ANCHOR_SAMPLING_MODES = ("random", "stride")
BLOCK_SIZE_MESSAGE = "must be >= 2 for training (slot 0 is the anchor; at least one masked slot), got {}"
MUON_LR_ADJUSTMENTS = ("match_rms_adamw", "original")  # torch.optim.Muon's adjust_lr_fn
MUON_MAX_NS_STEPS = 99  # torch.optim.Muon refuses 100 or more
OBJECTIVES = ("ce", "kl", "ce_target_argmax")  # dflash.training.loss
OPTIMIZERS = ("adamw", "muon")  # dflash.training.optimizers
POSITION_WEIGHTS = ("gamma", "uniform", "dpace")  # dflash.training.loss
TARGET_CACHE_DTYPES = ("bfloat16", "float32")  # the keys of dflash.training.disk_cache.STORAGE_DTYPES
TRAINING_ATTENTION = ("auto", "flex_attention", "sdpa")


@dataclass
class TrainingSettings:
    """What the LightningModule needs besides the target and the drafter."""

    num_anchors: int = 512
    """Blocks per sequence (fewer when the sequence has fewer valid anchors)."""
    anchor_sampling: str = "random"
    """"random" (uniform without replacement, the published recipe) or "stride" (every B-th
    valid position from the first; ablation)."""
    loss: str = "ce"
    """The per-slot objective: "ce" (cross-entropy to the data token, published), "kl"
    (forward KL from the target's distribution to the drafter's) or "ce_target_argmax"
    (cross-entropy to the target's argmax). docs/training.md has the sources."""
    agreement_mask: bool = False
    """On-policy labels (`dflash.training.blocks.on_policy_blocks`, docs/design.md invariant
    26): slot k is scored on the target's greedy token, and only while the text's tokens at
    slots 1..k-1 are the target's greedy tokens. For text the target did not write
    (`dflash.data.shipped_text`); needs a loss that reads the target ("ce_target_argmax" or
    "kl"). Metrics then read the greedy labels."""
    position_weights: str = "gamma"
    """"gamma" (w_k = exp(-(k-1)/gamma), published), "uniform" (ablation) or "dpace" (D-PACE,
    arXiv 2605.18810: weights from the drafter's confidences)."""
    loss_gamma: Any = "auto"
    """float | "auto" (None only to refuse it with a pointer: it meant uniform; OmegaConf
    unions are fragile): the decay of `position_weights=gamma`; "auto" picks the published
    value for the block size (see `dflash.training.loss.default_gamma`)."""
    dpace_alpha: float = 0.5
    """D-PACE's confidence smoothing in [0, 1] (the authors' default 0.5)."""
    loss_chunk_rows: int | None = 256
    """Rows x vocabulary of logits held at once by the loss, forward and backward; None holds
    all of them (the dense reference path)."""
    attention: str = "auto"
    """The kernel of the drafter's training block mask: "auto" (flex_attention on CUDA, SDPA
    with the factored mask elsewhere), "flex_attention" (likewise: it has no CPU backward)
    or "sdpa" (the factored mask everywhere: slower and larger than flex on a GPU;
    docs/design.md, "Measured figures"). The drafter's own `attn_implementation` is its
    decoding kernel."""
    optimizer: str = "adamw"
    """"adamw" (every parameter, the published recipe) or "muon" (`torch.optim.Muon` with the
    muon_* keys on the drafter's hidden matrices, AdamW with the keys below on the rest: token
    tables, norms, biases; the split rule is in `dflash.training.optimizers`; the converged
    recipe of docs/frontier.md section 4). Refused under trainer=fsdp (untested there)."""
    learning_rate: float = 6e-4
    """AdamW's learning rate."""
    betas: tuple[float, float] = (0.9, 0.999)
    """AdamW's betas."""
    weight_decay: float = 0.0
    """AdamW's weight decay."""
    eps: float = 1e-8
    """AdamW's eps."""
    muon_lr: float | None = None
    """With optimizer=muon: Muon's peak learning rate (the warm-up and cosine scale it as they
    scale learning_rate); None is 10 x learning_rate (speculators' default)."""
    muon_momentum: float = 0.95
    """With optimizer=muon: Muon's momentum in [0, 1) (Nesterov)."""
    muon_weight_decay: float = 0.1
    """With optimizer=muon: Muon's decoupled weight decay (each step multiplies its matrices by
    1 - lr * muon_weight_decay)."""
    muon_ns_steps: int = 5
    """With optimizer=muon: Newton-Schulz iterations that orthogonalise each update."""
    muon_adjust_lr_fn: str = "match_rms_adamw"
    """With optimizer=muon: how Muon scales its lr per matrix shape (A, B): "match_rms_adamw"
    (0.2 * sqrt(max(A, B)), so an update's RMS is an AdamW update's at the same lr; Moonshot's)
    or "original" (sqrt(max(1, A / B)); Keller Jordan's)."""
    warmup_ratio: float = 0.04
    """Fraction of the trainer's estimated total steps spent in linear warm-up before the
    cosine decay."""
    min_lr_ratio: float = 0.0
    """The cosine decays to learning_rate * min_lr_ratio."""
    target_cache_gib: float = 0.0
    """Memory (GiB) for keeping the frozen target's states of each sequence after its first
    forward, so later epochs skip the target (`dflash.training.feature_cache`); 0 turns it
    off. For small targets only: a sequence of S tokens keeps S * (taps + 1) * D values."""
    target_cache_dir: str | None = None
    """Root of the disk cache of the target's states (`dflash.training.disk_cache`): filled
    once per target and tokenised data, in `target_cache_dtype`, then memory-mapped by every
    run on that data, which never runs the target; None turns it off. Takes the place of
    `target_cache_gib`."""
    target_cache_dtype: str = "bfloat16"
    """"bfloat16" (half the disk, rounding as a bf16 target would) or "float32"."""
    target_cache_batch_size: int = 8
    """Sequences per target forward while filling the disk cache."""
    draft_vocab_size: int | None = None
    """Score training steps over the K most frequent response tokens of the training rows
    (`dflash.training.draft_vocab`); validation keeps the whole vocabulary, the export keeps
    these tokens beside the weights and decoding drafts over them (`drafter.draft_vocab`).
    None (or K >= the vocabulary) scores everything."""

    def __post_init__(self):
        require(self.num_anchors >= 1, "num_anchors", f"must be >= 1, got {self.num_anchors}")
        require(
            self.anchor_sampling in ANCHOR_SAMPLING_MODES,
            "anchor_sampling",
            f"unknown {self.anchor_sampling!r}; choose one of {list(ANCHOR_SAMPLING_MODES)}",
        )
        require(self.loss in OBJECTIVES, "loss", f"unknown {self.loss!r}; choose one of {list(OBJECTIVES)}")
        require(
            not self.agreement_mask or self.loss != "ce",
            "agreement_mask",
            "labels the target's greedy tokens: set training.loss=ce_target_argmax (or kl)",
        )
        require(
            self.position_weights in POSITION_WEIGHTS,
            "position_weights",
            f"unknown {self.position_weights!r}; choose one of {list(POSITION_WEIGHTS)}",
        )
        gamma = self.loss_gamma
        require(
            gamma is not None,
            "loss_gamma",
            "null no longer means uniform weights; set training.position_weights=uniform",
        )
        require(
            gamma == "auto" or (isinstance(gamma, (int, float)) and not isinstance(gamma, bool) and gamma > 0),
            "loss_gamma",
            f"must be 'auto' or a positive number, got {gamma!r}",
        )
        require(0.0 <= self.dpace_alpha <= 1.0, "dpace_alpha", f"must be in [0, 1], got {self.dpace_alpha}")
        require(
            self.loss_chunk_rows is None or self.loss_chunk_rows >= 1,
            "loss_chunk_rows",
            f"must be >= 1 (rows of logits at a time) or null (all at once), got {self.loss_chunk_rows}",
        )
        require(
            self.attention in TRAINING_ATTENTION,
            "attention",
            f"unknown {self.attention!r}; choose one of {list(TRAINING_ATTENTION)}",
        )
        require(self.optimizer in OPTIMIZERS, "optimizer", f"unknown {self.optimizer!r}; choose one of {list(OPTIMIZERS)}")
        require(self.learning_rate > 0, "learning_rate", f"must be > 0, got {self.learning_rate}")
        require(
            self.muon_lr is None or self.muon_lr > 0,
            "muon_lr",
            f"must be > 0 or null (10 x learning_rate), got {self.muon_lr}",
        )
        require(0.0 <= self.muon_momentum < 1.0, "muon_momentum", f"must be in [0, 1), got {self.muon_momentum}")
        require(self.muon_weight_decay >= 0, "muon_weight_decay", f"must be >= 0, got {self.muon_weight_decay}")
        require(
            1 <= self.muon_ns_steps <= MUON_MAX_NS_STEPS,
            "muon_ns_steps",
            f"must be in [1, {MUON_MAX_NS_STEPS}], got {self.muon_ns_steps}",
        )
        require(
            self.muon_adjust_lr_fn in MUON_LR_ADJUSTMENTS,
            "muon_adjust_lr_fn",
            f"unknown {self.muon_adjust_lr_fn!r}; choose one of {list(MUON_LR_ADJUSTMENTS)}",
        )
        require(len(self.betas) == 2, "betas", f"needs two values, got {self.betas!r}")
        self.betas = tuple(float(b) for b in self.betas)
        require(0.0 <= self.warmup_ratio < 1.0, "warmup_ratio", f"must be in [0, 1), got {self.warmup_ratio}")
        require(0.0 <= self.min_lr_ratio <= 1.0, "min_lr_ratio", f"must be in [0, 1], got {self.min_lr_ratio}")
        require(
            isinstance(self.target_cache_gib, (int, float))
            and not isinstance(self.target_cache_gib, bool)
            and self.target_cache_gib >= 0,
            "target_cache_gib",
            f"must be a number of GiB >= 0 (0: no cache), got {self.target_cache_gib!r}",
        )
        require(
            self.target_cache_dtype in TARGET_CACHE_DTYPES,
            "target_cache_dtype",
            f"unknown {self.target_cache_dtype!r}; choose one of {list(TARGET_CACHE_DTYPES)}",
        )
        require(
            self.draft_vocab_size is None or self.draft_vocab_size >= 1,
            "draft_vocab_size",
            f"must be a number of tokens >= 1 or null (the whole vocabulary), got {self.draft_vocab_size}",
        )
        require(
            self.target_cache_batch_size >= 1,
            "target_cache_batch_size",
            f"must be >= 1, got {self.target_cache_batch_size}",
        )


def check_block_fits(block_size: int, max_length: int, num_anchors: int) -> None:
    """Config-time shape checks across groups (drafter.block_size, data.max_length,
    training.num_anchors); ConfigError naming the key to change.

    - A trained block has at least two slots: the anchor and one masked slot.
    - A block (the anchor and B-1 masked slots) must fit in a sequence behind at least one
      context token, since context is strictly before the anchor: B + 1 <= max_length. A
      longer block could never be trained whole, while its attention mask still grows with B
      times the anchors (issue 11).
    - training.num_anchors <= data.max_length: a sequence has no more anchors than tokens
      (num_anchors = max_length says "every position"). A larger value is refused, not
      clamped: no sequence can reach it, so it is a typo, and clamping would train the same
      thing under another run name (which hashes the overrides). Up to that bound it is a
      budget per sequence: fewer are used when a sequence has fewer valid anchors, and stride
      sampling takes every B-th one (the anchors ablation relies on that).
    """
    require(block_size >= 2, "drafter.block_size", BLOCK_SIZE_MESSAGE.format(block_size))
    require(
        block_size + 1 <= max_length,
        "drafter.block_size",
        f"a block of {block_size} does not fit in a sequence of data.max_length={max_length} tokens with "
        f"context before its anchor; set drafter.block_size <= {max_length - 1} or data.max_length >= {block_size + 1}",
    )
    require(
        num_anchors <= max_length,
        "training.num_anchors",
        f"{num_anchors} anchors cannot fit in a sequence of data.max_length={max_length} tokens; "
        f"set training.num_anchors <= {max_length} (= every position)",
    )
