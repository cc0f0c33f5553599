"""The optimizer of a training run (`training.optimizer`): AdamW, or Muon on the drafter's
hidden matrices beside AdamW on the rest (docs/frontier.md sections 4 and 5.4), as ONE
`torch.optim.Optimizer`: Lightning refuses two under automatic optimization.

Invariants:
- Split rule (`muon_parameters`): a trainable parameter goes to Muon iff it is a 2-D matrix
  with both sides > 1 that is not a token table. A token table is indexed by token ids or
  scores them: the weight of any `nn.Embedding`, and any parameter whose dotted name has a
  part in `TOKEN_TABLES` (a target-style `embed_tokens` / `lm_head`, DSpark's Markov factors
  `markov_w1` (an `nn.Embedding`) and `markov_w2`, DFlash2's `predecessor_codebook` and
  `successor_codebook`). Keller Jordan's Muon and speculators keep these out of Muon too;
  speculators matches them by the same names. Everything else (norms, biases, `[1, N]`
  heads, 3-D kernels, the token tables) goes to AdamW.
- AdamW's groups are those of `training.optimizer=adamw` restricted to AdamW's parameters:
  "matrices" (dim >= 2 at setup: `training.weight_decay`) then "norms_biases" (no decay), at
  `training.learning_rate`. Muon's one group "muon" starts at `training.muon_lr` (None: 10 x
  `training.learning_rate`). An `adamw` run's optimizer is a plain `torch.optim.AdamW`.
- `MuonAdamW.param_groups` is Muon's groups then AdamW's, the very dicts the inner optimizers
  step with, in one list object that `load_state_dict` refills in place (Lightning's
  `LightningOptimizer` holds a copy of the attribute). So the `LambdaLR` warm-up and cosine
  scale both learning rates by the same factor, and gradient clipping, the loss scale
  (`DrafterTrainingModule.on_before_optimizer_step`) and LearningRateMonitor
  (`train/lr/muon`, `train/lr/matrices`, `train/lr/norms_biases`) see every parameter.
- `step(closure)` evaluates the closure once, with gradients on, then steps Muon, then AdamW;
  `zero_grad` clears both (the base class's, over `param_groups`).
- `state_dict()` is `{"muon": ..., "adamw": ...}`, each the inner optimizer's own;
  `load_state_dict` restores both, so a resumed run takes the uninterrupted run's next step.
  `state` is a read view of both inner states (the per-parameter dicts themselves, which
  Lightning moves between devices in place).
- Muon needs whole matrices: FSDP shards them, and `optimizer=muon` is refused there
  (`dflash.cli.train.check_job`, before anything loads) until tested. Under DDP every rank holds
  the whole averaged gradient and takes the same step.
"""

from __future__ import annotations

import torch
from torch import nn

from dflash.errors import require
from dflash.training.config import TrainingSettings

TOKEN_TABLES = frozenset({"embed_tokens", "lm_head", "markov_w1", "markov_w2", "predecessor_codebook", "successor_codebook"})
MUON_LR_FACTOR = 10.0  # muon_lr = null: this times learning_rate (speculators' default)
MUON_GROUP, MATRICES_GROUP, NORMS_BIASES_GROUP = "muon", "matrices", "norms_biases"


def muon_parameters(model: nn.Module) -> list[nn.Parameter]:
    """The trainable parameters of `model` that Muon steps (the module's split rule), in
    `model.parameters()` order."""
    tables = set()
    for module_name, module in model.named_modules():
        for name, parameter in module.named_parameters(recurse=False):
            parts = f"{module_name}.{name}".split(".")
            if isinstance(module, nn.Embedding) or TOKEN_TABLES.intersection(parts):
                tables.add(id(parameter))
    return [p for p in model.parameters() if p.requires_grad and p.dim() == 2 and min(p.shape) > 1 and id(p) not in tables]


def build_optimizer(model: nn.Module, config: TrainingSettings, matrices: set[int]) -> torch.optim.Optimizer:
    """The optimizer of `training.optimizer` over `model`'s trainable parameters.

    matrices: ids of the parameters AdamW decays (the matrices, recorded before a strategy
        reshaped them; module invariants of `dflash.training.module`).
    """
    params = [p for p in model.parameters() if p.requires_grad]
    muon = muon_parameters(model) if config.optimizer == "muon" else []
    to_muon = {id(p) for p in muon}
    rest = [p for p in params if id(p) not in to_muon]
    adamw = torch.optim.AdamW(
        [
            {"params": [p for p in rest if id(p) in matrices], "weight_decay": config.weight_decay, "name": MATRICES_GROUP},
            {"params": [p for p in rest if id(p) not in matrices], "weight_decay": 0.0, "name": NORMS_BIASES_GROUP},
        ],
        lr=config.learning_rate,
        betas=config.betas,
        eps=config.eps,
    )
    if config.optimizer == "adamw":
        return adamw
    muon_lr = config.muon_lr if config.muon_lr is not None else MUON_LR_FACTOR * config.learning_rate
    return MuonAdamW(
        torch.optim.Muon(
            [{"params": muon, "name": MUON_GROUP}],
            lr=muon_lr,
            weight_decay=config.muon_weight_decay,
            momentum=config.muon_momentum,
            nesterov=True,
            ns_steps=config.muon_ns_steps,
            adjust_lr_fn=config.muon_adjust_lr_fn,
        ),
        adamw,
    )


class MuonAdamW(torch.optim.Optimizer):
    """`muon` and `adamw` stepped as one optimizer (module invariants); their parameters are disjoint."""

    def __init__(self, muon: torch.optim.Muon, adamw: torch.optim.AdamW):
        self.muon, self.adamw = muon, adamw
        # the base class keeps these dicts as they are: no defaults to add
        super().__init__([*muon.param_groups, *adamw.param_groups], defaults={})

    @property
    def state(self) -> dict:
        return {**self.muon.state, **self.adamw.state}

    @state.setter
    def state(self, value) -> None:
        # `Optimizer.__init__` sets an empty state; the inner optimizers hold the real one
        if value:
            raise AttributeError("MuonAdamW's state is its inner optimizers'; load it with load_state_dict")

    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self.muon.step()
        self.adamw.step()
        return loss

    def state_dict(self) -> dict:
        return {"muon": self.muon.state_dict(), "adamw": self.adamw.state_dict()}

    def load_state_dict(self, state_dict: dict) -> None:
        require(
            isinstance(state_dict, dict) and state_dict.keys() == {"muon", "adamw"},
            "training.optimizer",
            "the checkpoint holds another optimizer's state than muon's; resume with the optimizer it was trained with",
        )
        self.muon.load_state_dict(state_dict["muon"])
        self.adamw.load_state_dict(state_dict["adamw"])
        self.param_groups[:] = [*self.muon.param_groups, *self.adamw.param_groups]  # the inner ones made new dicts
