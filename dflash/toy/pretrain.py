"""Pre-training of the tiny code target: a Lightning module with plain next-token loss.

Batches are windows of `seq_len` tokens cut from the training token stream at start
offsets drawn once from a seeded generator, so the whole run is a function of the
config (no time budget, no data-loader workers).
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
import warnings

import lightning as L
import torch
from lightning.pytorch.callbacks import TQDMProgressBar
from torch.utils.data import DataLoader, Dataset

from dflash.errors import require
from dflash.fit_progress import training_progress


class TokenWindows(Dataset):
    """Windows of a token stream: item i is a (seq_len,) long tensor starting at `starts[i]`."""

    def __init__(self, stream: torch.Tensor, starts: torch.Tensor, seq_len: int):
        self.stream = stream
        self.starts = starts
        self.seq_len = seq_len

    def __len__(self) -> int:
        return len(self.starts)

    def __getitem__(self, index: int) -> torch.Tensor:
        start = int(self.starts[index])
        return self.stream[start : start + self.seq_len]


class CausalLMPretrainer(L.LightningModule):
    """Next-token cross-entropy on an HF causal LM; AdamW, warm-up then cosine to lr/10.

    Logs `train_loss` and `tok_s` (training tokens per second since the start) to the progress bar and
    accumulates the validation loss token-weighted over all validation windows.
    """

    def __init__(self, model, lr: float, weight_decay: float, warmup_steps: int, max_steps: int):
        super().__init__()
        self.model = model
        self.lr = lr
        self.weight_decay = weight_decay
        self.warmup_steps = warmup_steps
        self.max_steps = max_steps
        self.train_losses: list[float] = []
        self.val_loss_sum = 0.0
        self.val_tokens = 0
        self._train_started = 0.0

    def on_train_start(self):
        self._train_started = time.perf_counter()

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        loss = self.model(input_ids=batch, labels=batch).loss
        self.train_losses.append(loss.item())
        self.log("train_loss", loss, prog_bar=True, on_step=True, on_epoch=False)
        return loss

    def on_train_batch_end(self, outputs, batch, batch_idx):
        seconds = time.perf_counter() - self._train_started
        tokens = len(self.train_losses) * batch.numel()
        self.log("tok_s", tokens / max(seconds, 1e-9), prog_bar=True, on_step=True, on_epoch=False)

    def on_validation_epoch_start(self):
        self.val_loss_sum, self.val_tokens = 0.0, 0

    def validation_step(self, batch: torch.Tensor, batch_idx: int) -> None:
        loss = self.model(input_ids=batch, labels=batch).loss
        predicted = batch.numel() - batch.shape[0]  # the first token of each window is never a label
        self.val_loss_sum += loss.item() * predicted
        self.val_tokens += predicted

    def configure_optimizers(self):
        decay = [p for p in self.model.parameters() if p.ndim >= 2]
        no_decay = [p for p in self.model.parameters() if p.ndim < 2]
        optimizer = torch.optim.AdamW(
            [{"params": decay, "weight_decay": self.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
            lr=self.lr,
            betas=(0.9, 0.95),
            fused=True,
        )

        def lr_factor(step: int) -> float:
            if step < self.warmup_steps:
                return (step + 1) / self.warmup_steps
            progress = (step - self.warmup_steps) / max(1, self.max_steps - self.warmup_steps)
            return 0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0)))

        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


@contextlib.contextmanager
def _quiet_lightning_banner():
    """Silence Lightning's start-up lines (GPU/TPU availability, tips) for this build only."""
    logger = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    level = logger.level
    logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        logger.setLevel(level)


@contextlib.contextmanager
def _torch_threads(num_threads: int):
    previous = torch.get_num_threads()
    torch.set_num_threads(num_threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def qwen3_config(config, tokenizer):
    """The `Qwen3Config` of a tiny code target (`config` is a `TinyCodeConfig`)."""
    from transformers import Qwen3Config

    return Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads,
        num_key_value_heads=config.num_kv_heads,
        head_dim=config.hidden_size // config.num_heads,
        max_position_embeddings=config.max_position_embeddings,
        rope_theta=10000.0,
        tie_word_embeddings=False,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
    )


def pretrain(config, train_ids: list[int], heldout_ids: list[int], tokenizer, progress: bool = True):
    """Pre-train a fresh Qwen3 on the token streams; returns (model in eval mode, stats).

    stats: train_loss (mean over the last 10% of steps), val_loss (token-weighted mean
    over at most `config.val_windows` held-out windows of `seq_len`), tokens_seen,
    train_time_s, train_tokens_per_s, num_parameters.
    """
    from transformers import AutoModelForCausalLM

    seq_len = config.seq_len
    require(
        len(train_ids) > seq_len and len(heldout_ids) > seq_len,
        "max_corpus_bytes",
        f"corpus too small for seq_len {seq_len} ({len(train_ids)} train / {len(heldout_ids)} held-out tokens)",
    )
    L.seed_everything(config.seed, workers=True, verbose=False)
    model = AutoModelForCausalLM.from_config(qwen3_config(config, tokenizer), dtype=torch.float32, attn_implementation="sdpa")
    train_stream = torch.tensor(train_ids, dtype=torch.long)
    heldout_stream = torch.tensor(heldout_ids, dtype=torch.long)
    generator = torch.Generator().manual_seed(config.seed)
    train_starts = torch.randint(0, len(train_ids) - seq_len + 1, (config.max_steps * config.batch_size,), generator=generator)
    num_val = min(config.val_windows, len(heldout_ids) // seq_len)
    val_starts = torch.arange(num_val) * seq_len
    train_loader = DataLoader(TokenWindows(train_stream, train_starts, seq_len), batch_size=config.batch_size)
    val_loader = DataLoader(TokenWindows(heldout_stream, val_starts, seq_len), batch_size=config.batch_size)

    module = CausalLMPretrainer(model, config.lr, config.weight_decay, config.warmup_steps, config.max_steps)
    show_bar, lines = training_progress(progress, label="target pre-training")  # a bar, or lines in logs
    with warnings.catch_warnings(), _quiet_lightning_banner(), _torch_threads(config.num_threads):
        # Validation runs once, after training, on purpose; the other is Lightning-internal.
        warnings.filterwarnings("ignore", message=".*`validation_step` but have no `val_dataloader`")
        warnings.filterwarnings("ignore", message=".*isinstance\\(treespec, LeafSpec\\)")
        trainer = L.Trainer(
            accelerator="cpu",
            devices=1,
            max_steps=config.max_steps,
            gradient_clip_val=1.0,
            logger=False,
            enable_checkpointing=False,
            enable_model_summary=False,
            enable_progress_bar=show_bar,
            callbacks=[TQDMProgressBar(refresh_rate=10)] if show_bar else lines,
            num_sanity_val_steps=0,
            deterministic=True,
        )
        started = time.perf_counter()
        trainer.fit(module, train_dataloaders=train_loader)
        train_time = time.perf_counter() - started
        trainer.validate(module, dataloaders=val_loader, verbose=False)
    tail = module.train_losses[-max(1, len(module.train_losses) // 10) :]
    tokens_seen = len(module.train_losses) * config.batch_size * seq_len
    stats = {
        "train_loss": round(sum(tail) / len(tail), 4),
        "val_loss": round(module.val_loss_sum / max(1, module.val_tokens), 4),
        "val_tokens": module.val_tokens,
        "tokens_seen": tokens_seen,
        "train_time_s": round(train_time, 1),
        "train_tokens_per_s": round(tokens_seen / train_time, 1),
        "num_parameters": sum(p.numel() for p in model.parameters()),
    }
    return model.eval(), stats
