"""The LightningModule that trains a drafter against a frozen target, composed from a
method's `Objective` (`dflash.training.objective`): the module owns the target, its
state caches, metrics, logging, optimizer and schedule; the objective owns the drafter
and its loss. No method subclasses this module.

Invariants:
- The target (`dflash.target.TargetModel`) is a plain attribute, not a submodule: it is
  outside the optimizer, the state_dict, checkpoints and DDP/FSDP wrapping. It runs in
  eval mode under no_grad and is moved to the module's device at the first step.
- The drafter is the submodule `drafter` (checkpoint keys `drafter.*`); checkpoints also
  hold the drafter's config.json dict under `DRAFTER_CONFIG_KEY`, and a DFlash drafter's
  draft vocabulary (`DFlashDrafter.draft_vocab`) under `DRAFT_VOCAB_KEY` (both named in `dflash.layout`), so a method's
  exporter rebuilds the drafter without loading the target.
- A step's target states (the objective's `taps()`, concatenated in that order) come from
  the disk cache when `training.target_cache_dir` is set (filled in `setup`,
  `dflash.training.disk_cache`), else from the in-memory cache when
  `training.target_cache_gib` > 0, else from a target forward; all three give the same
  states up to float rounding.
- An optimizer step's gradient is that of sum w l / W over the step's whole global batch
  (docs/design.md invariant 10, `dflash.training.normalisation`): `training_step` returns
  the scaled micro-batch sum, `on_before_optimizer_step` corrects the gradients when
  accumulating, before clipping.
- Gradient clipping and bf16 autocast are `lightning.Trainer` settings (`dflash.training.config`);
  under FSDP the clipping norm is the whole gradient's, over all ranks' shards
  (`configure_gradient_clipping`).
- AdamW decays the drafter's matrices only; which parameters those are is recorded in
  `setup`, before a strategy wraps the drafter (FSDP shows every parameter as 1-D). With
  `training.optimizer=muon` Muon steps the hidden matrices (`dflash.training.optimizers`).

Logged metrics: `train/loss`, `train/acc_01`.., `train/tau_sim` (`dflash.training.metrics`)
every `trainer.log_every_n_steps` optimizer steps, from the sums over that window and all
ranks; `val/...` the same over the whole validation set. At the same steps the
`dflash.training.monitor` values and, from Lightning's LearningRateMonitor,
`train/lr/matrices` and `train/lr/norms_biases` (and `train/lr/muon` with Muon).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import lightning as L
import torch

from dflash.errors import require
from dflash.layout import DRAFT_VOCAB_KEY, DRAFTER_CONFIG_KEY
from dflash.progress import budget_timer
from dflash.structured import config_key
from dflash.target import TargetModel
from dflash.training.config import TrainingSettings
from dflash.training.disk_cache import DiskStateCache
from dflash.training.feature_cache import TargetStateCache
from dflash.training.forward import target_features
from dflash.training.loss import BlockLoss
from dflash.training.metrics import BlockMetrics
from dflash.training.monitor import StepMonitor
from dflash.training.normalisation import GlobalLossScale
from dflash.training.objective import Objective
from dflash.training.optimizers import build_optimizer


class DrafterTrainingModule(L.LightningModule):
    """Trains `self.drafter` (the objective's); the frozen target provides states, embedding and LM head.

    Batches are dicts of right-padded tensors (b, S): `input_ids` long, `loss_mask` bool
    (True on response tokens that are training targets), `attention_mask` bool (True on
    real tokens), and `row_index` (b,) from `DFlashDataModule` for the state caches.

    Args:
        target: the frozen target (`dflash.specs.load_target`).
        objective: the method's `Objective` for this target (`Method.build_objective`).
        training: optimizer, schedule and cache settings.
        hparams: what the checkpoint records as hyper-parameters (the run's settings).
    """

    def __init__(self, target: TargetModel, objective: Objective, training: TrainingSettings, hparams: dict):
        super().__init__()
        self.save_hyperparameters(hparams)
        self.training_config = training
        self.target = target
        self.objective = objective
        self.drafter = self.objective.drafter
        gib = training.target_cache_gib
        self.state_cache = TargetStateCache(int(gib * 2**30)) if gib > 0 and training.target_cache_dir is None else None
        self.disk_cache: DiskStateCache | None = None  # opened and filled in `setup`
        self.train_metrics = BlockMetrics(self.objective.slots)
        self.val_metrics = BlockMetrics(self.objective.slots)
        self.loss_scale = GlobalLossScale()
        self.monitor = StepMonitor()
        self._matrices: set[int] | None = None  # ids of the drafter's matrices (weight decay), recorded in `setup`
        self._parameters_at_setup: set[int] = set()

    def prepare_device(self) -> None:
        """Bring the target to the drafter's device (and let the objective adapt to it)."""
        if self.target.device != self.device:
            self.target.model.to(self.device)
        self.objective.on_device(self.device)

    def compute_loss(self, batch: dict, generator: torch.Generator | None = None, full_vocab: bool = False) -> BlockLoss:
        """The objective's loss of `batch` (see the class docstring for its tensors).

        generator: RNG of the objective's sampling (None: the global one).
        full_vocab: score the whole vocabulary even where the objective trains on a
            smaller one (validation does).
        """
        self.prepare_device()
        attention_mask = batch["attention_mask"].bool()
        taps = self.objective.taps()
        states = self.states(batch, attention_mask, taps) if taps else None
        return self.objective.loss(self.target, batch, states, generator, full_vocab)

    def on_before_batch_transfer(self, batch: dict, dataloader_idx: int) -> dict:
        """Refuse a batch that is not right-padded; checked on the CPU, so it never syncs the GPU."""
        attention_mask = batch["attention_mask"].bool()
        if not bool((attention_mask[:, 1:] <= attention_mask[:, :-1]).all()):
            raise ValueError("training batches must be right-padded (attention_mask of the form 1..1 0..0)")
        return batch

    def states(self, batch: dict, attention_mask: torch.Tensor, taps: list[int]) -> torch.Tensor:
        """(b, S, len(taps) * D) target states of the batch: read from the disk cache, kept
        in memory, or computed by the target."""
        if self.disk_cache is not None:
            row_index = batch.get("row_index")
            if row_index is None:
                raise ValueError("training.target_cache_dir needs batches with row_index (DFlashDataModule adds it)")
            with config_key("training"):
                return self.disk_cache.read(row_index, attention_mask.shape[1], taps, self.target.dtype).to(self.device)
        compute = lambda: target_features(self.target, batch["input_ids"], taps)  # noqa: E731
        if self.state_cache is not None:
            return self.state_cache.get(batch.get("row_index"), attention_mask, compute)
        return compute()

    def setup(self, stage: str) -> None:
        self.setup_disk_cache()
        if self._trainer is not None:
            self.objective.setup(self.target, getattr(self.trainer, "datamodule", None))
        # Before the strategy wraps the drafter, on the real shapes (module invariants).
        self._matrices = {id(p) for p in self.drafter.parameters() if p.dim() >= 2}
        self._parameters_at_setup = {id(p) for p in self.drafter.parameters()}

    def setup_disk_cache(self) -> None:
        """With `training.target_cache_dir`: open the disk cache of this target on the
        trainer's data, fill what is missing (ranks split the work), wait for every rank."""
        config = self.training_config
        if config.target_cache_dir is None or self.disk_cache is not None or self.trainer is None:
            return
        datamodule = getattr(self.trainer, "datamodule", None)
        rows = getattr(datamodule, "rows", None)
        with config_key("training"):  # the cache names its fields (target_cache_dir)
            require(
                rows is not None and hasattr(datamodule, "fingerprint"),
                "target_cache_dir",
                "the disk cache reads the rows of a DFlashDataModule; train through python -m dflash.train or pass one",
            )
            self.prepare_device()
            with self.trainer.precision_plugin.forward_context():  # a training step's target forward runs in it too
                self.disk_cache = open_disk_cache(
                    config, self.target, rows, datamodule.fingerprint(), self.objective.taps(),
                    rank=self.trainer.global_rank, world_size=self.trainer.world_size,
                )  # fmt: skip
        self.trainer.strategy.barrier("target_state_cache")

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        """The micro-batch's sum w l scaled for the global normalisation (module invariants):
        on one rank without accumulation its value is the batch's loss sum w l / sum w."""
        result = self.compute_loss(batch)
        self.train_metrics.update(result)
        self.monitor.count(batch)
        return self.loss_scale.backward_value(result, self.trainer.world_size, self._sum_over_ranks)

    def on_before_optimizer_step(self, optimizer) -> None:
        # After the step's last backward, before clipping: every micro-batch of the step is in.
        gradients = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        self.loss_scale.finish_step(gradients, self.trainer.accumulate_grad_batches, self._sum_over_ranks)
        # Lightning flushes step logs when (optimizer steps + 1) % log_every_n_steps == 0,
        # at the end of the batch that steps: log the window's sums at exactly those steps.
        if (self.trainer.global_step + 1) % self.trainer.log_every_n_steps == 0:
            self._log_metrics(self.train_metrics, "train")
            sharded = type(self.trainer.model).__name__ == "FullyShardedDataParallel"
            watched = self.monitor.measure(gradients, self.device, self._sum_over_ranks, sharded)
            self.log_dict(watched, prog_bar=False, sync_dist=False)

    def _sum_over_ranks(self, value: torch.Tensor) -> torch.Tensor:
        return self.trainer.strategy.reduce(value, reduce_op="sum")

    def on_train_epoch_end(self) -> None:
        self.train_metrics.reset()

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        # A fixed seed per batch gives the same anchors every validation run.
        generator = torch.Generator(device=self.device).manual_seed(batch_idx)
        self.val_metrics.update(self.compute_loss(batch, generator, full_vocab=True))

    def on_validation_epoch_start(self) -> None:
        self.val_metrics.reset()

    def on_validation_epoch_end(self) -> None:
        self._log_metrics(self.val_metrics, "val")

    def _log_metrics(self, metrics: BlockMetrics, prefix: str) -> None:
        # compute() already sums over ranks, so every rank logs the same global value.
        values = {f"{prefix}/{name}": value for name, value in metrics.compute().items()}
        metrics.reset()
        self.log_dict(values, prog_bar=False, sync_dist=False)
        self.log_dict(
            {f"{prefix}_tau_sim": values[f"{prefix}/tau_sim"], f"{prefix}_loss": values[f"{prefix}/loss"]},
            prog_bar=True,
            logger=False,
        )

    def configure_optimizers(self):
        """`training.optimizer` (`dflash.training.optimizers`: AdamW, weight decay on matrices
        only, or Muon + AdamW) with linear warm-up then cosine decay of every group, per step."""
        config = self.training_config
        params = [p for p in self.drafter.parameters() if p.requires_grad]
        matrices = self._matrices
        if matrices is None:  # no trainer setup (nothing wraps the drafter): the shapes are the real ones
            matrices = {id(p) for p in params if p.dim() >= 2}
        elif not {id(p) for p in params} <= self._parameters_at_setup:
            raise RuntimeError("the strategy replaced the drafter's parameters after setup; their weight-decay groups are unknown")
        optimizer = build_optimizer(self.drafter, config, matrices)
        total_steps = self.trainer.estimated_stepping_batches
        time_fraction = training_time_fraction(self.trainer)
        require(
            math.isfinite(total_steps) or time_fraction is not None,
            "trainer.max_steps",
            "the cosine schedule needs a finite length; set trainer.max_steps, trainer.max_epochs or trainer.max_minutes",
        )
        total = int(total_steps) if math.isfinite(total_steps) else None
        schedule = warmup_cosine_schedule(total, config.warmup_ratio, config.min_lr_ratio, time_fraction)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
        # named for LearningRateMonitor: train/lr/matrices, train/lr/norms_biases, with Muon train/lr/muon (dflash.training.run)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step", "name": "train/lr"}}

    def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None) -> None:
        """Clip as the Trainer says; under FSDP by the root module's `clip_grad_norm_`, the norm over
        all ranks' shards (Lightning's FSDP precision plugin refuses clipping by norm)."""
        from torch.distributed.fsdp import FullyShardedDataParallel

        model = self.trainer.model
        if isinstance(model, FullyShardedDataParallel) and gradient_clip_val and gradient_clip_algorithm in (None, "norm"):
            model.clip_grad_norm_(gradient_clip_val)
            return
        super().configure_gradient_clipping(optimizer, gradient_clip_val, gradient_clip_algorithm)

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint[DRAFTER_CONFIG_KEY] = self.objective.checkpoint_config()
        vocab = getattr(self.drafter, "draft_vocab", None)  # a DFlash drafter's, once its training counted it
        if vocab is not None:
            checkpoint[DRAFT_VOCAB_KEY] = vocab.clone()


def open_disk_cache(
    config: TrainingSettings, target, rows, data_fingerprint: str, layers: list[int], rank: int = 0, world_size: int = 1
) -> DiskStateCache:
    """The disk cache of `target` on tokenised `rows` (`dflash.data.tokenize.TokenizedRows`),
    with this rank's share of the missing `layers` filled."""
    lengths = rows.offsets[1:] - rows.offsets[:-1]
    cache = DiskStateCache.open(config.target_cache_dir, target, data_fingerprint, lengths, dtype=config.target_cache_dtype)
    cache.fill(
        target,
        lambda row: rows.input_ids[rows.offsets[row] : rows.offsets[row + 1]],
        layers,
        batch_size=config.target_cache_batch_size,
        rank=rank,
        world_size=world_size,
    )
    return cache


def warmup_cosine_schedule(
    total_steps: int | None,
    warmup_ratio: float,
    min_lr_ratio: float = 0.0,
    time_fraction: Callable[[], float] | None = None,
):
    """LR multiplier per optimizer step: a linear warm-up over the first `warmup_ratio` of
    training, then a cosine down to `min_lr_ratio` at its end.

    Without `time_fraction`, training is `total_steps` steps: the warm-up goes from ~0 to 1
    over ceil(warmup_ratio * total_steps) steps. With it (a time budget, `trainer.max_minutes`),
    progress is the larger of the step fraction (when `total_steps` is known) and the
    fraction of the budget spent, so whichever limit ends training also ends the schedule;
    the warm-up then starts at 1% of the peak.
    """
    if time_fraction is None:
        if total_steps is None:
            raise ValueError("a schedule without a time budget needs a step count")
        warmup_steps = math.ceil(warmup_ratio * total_steps)

    def cosine(progress: float) -> float:
        return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))

    def multiplier(step: int) -> float:
        if time_fraction is not None:
            progress = max(time_fraction(), step / total_steps if total_steps else 0.0)
            if progress < warmup_ratio:
                return max(progress, 0.01 * warmup_ratio) / warmup_ratio
            return cosine((progress - warmup_ratio) / (1.0 - warmup_ratio))
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        return cosine((step - warmup_steps) / max(1, total_steps - warmup_steps))

    return multiplier


def training_time_fraction(trainer) -> Callable[[], float] | None:
    """With a time budget (`trainer.max_minutes`: Lightning's Timer, restored on resume),
    a function giving the fraction of it spent, the same on every rank (rank 0's); else None."""
    timer = budget_timer(trainer)
    if timer is None:
        return None

    def fraction() -> float:
        elapsed = timer.time_elapsed("train")
        budget = elapsed + (timer.time_remaining("train") or 0.0)
        value = elapsed / budget if budget > 0 else 1.0
        if trainer.world_size > 1:  # ranks must step the same learning rate
            value = float(trainer.strategy.broadcast(value, src=0))
        return min(1.0, value)

    return fraction
