"""DFlash's objective (`dflash.training.objective.Objective`): random anchors in the
response, blocks under the sparse mask drafted in one pass, position-weighted loss
(`dflash.training.anchors` .. `dflash.training.loss`).
"""

from __future__ import annotations

import torch

from dflash.errors import require
from dflash.specs import DrafterSpec, build_drafter
from dflash.structured import config_key
from dflash.target import TargetModel
from dflash.training.anchors import sample_anchors
from dflash.training.blocks import build_blocks, on_policy_blocks
from dflash.training.config import BLOCK_SIZE_MESSAGE, TrainingSettings
from dflash.training.draft_vocab import DraftVocab, frequent_response_tokens
from dflash.training.forward import draft_blocks, set_attention_implementation, training_attention_implementation
from dflash.training.loss import BlockLoss, LossSettings, block_loss, resolve_gamma


class DFlashObjective:
    """DFlash: blocks at random anchors in the response, drafted in one pass, scored by
    the position-weighted loss over the target's LM head."""

    def __init__(self, target: TargetModel, drafter: DrafterSpec, training: TrainingSettings):
        self.training = training
        self.drafter = build_drafter(drafter, target)
        block_size = self.drafter.block_size
        if block_size < 2:  # the method's check_training refuses it before any model loads, naming drafter.block_size
            raise ValueError(BLOCK_SIZE_MESSAGE.format(block_size))
        self.slots = block_size
        # with the agreement mask, the blocks' labels are the target's greedy tokens already
        relabelled = training.agreement_mask and training.loss == "ce_target_argmax"
        self.reads_target = training.loss != "ce"
        self.loss_settings = LossSettings(
            block_size=block_size,
            objective="ce" if relabelled else training.loss,
            position_weights=training.position_weights,
            gamma=resolve_gamma(training.loss_gamma, block_size),
            dpace_alpha=training.dpace_alpha,
            chunk_rows=training.loss_chunk_rows,
        )
        self.num_target_layers = target.num_layers
        self.hidden_size = target.hidden_size
        self.draft_vocab: DraftVocab | None = None  # counted on the first training step
        self.drafter.draft_vocab = None  # exported: the vocabulary this training scores, if any
        self.datamodule = None  # the trainer's (`setup`): the vocabulary counts its training rows

    def feature_layers(self) -> list[int]:
        config = self.drafter.config
        return list(config.target_layer_ids) if config.use_target_features else []

    def taps(self) -> list[int]:
        """The drafter's taps, plus the final hidden states for losses that read the target's
        logits: HF's last hidden state ("layer L-1" here) is taken after the final norm, so
        target.logits() of it are the target's own logits (tests/training/test_losses.py)."""
        layers = self.feature_layers()
        return [*layers, self.num_target_layers - 1] if self.reads_target else layers

    def on_device(self, device: torch.device) -> None:
        implementation = training_attention_implementation(self.training.attention, device)
        if self.drafter.config.attn_implementation != implementation:
            set_attention_implementation(self.drafter, implementation)

    def setup(self, target: TargetModel, datamodule) -> None:
        self.datamodule = datamodule

    def checkpoint_config(self) -> dict:
        return self.drafter.config.to_hf_dict()

    def loss(self, target: TargetModel, batch: dict, states: torch.Tensor | None, generator, full_vocab: bool) -> BlockLoss:
        blocks, hidden, final_hidden = self.drafted_blocks(target, batch, states, generator)
        vocab = None if full_vocab else self.training_vocab(target)
        if vocab is None:
            return block_loss(hidden, target.logits, blocks, self.loss_settings, final_hidden)
        to_logits = lambda rows: target.logits(rows, head_rows=vocab.head_rows)  # noqa: E731
        return block_loss(hidden, to_logits, blocks, self.loss_settings, final_hidden, vocab.lookup)

    def drafted_blocks(self, target: TargetModel, batch: dict, states: torch.Tensor | None, generator):
        """(blocks, the drafter's hidden states of them (b, N*B, D), the target's final hidden
        states (b, S, D) or None) of a batch: anchors drawn, blocks laid out and drafted."""
        input_ids = batch["input_ids"]
        attention_mask = batch["attention_mask"].bool()
        loss_mask = batch["loss_mask"].bool() & attention_mask
        config = self.drafter.config
        split = len(self.feature_layers()) * self.hidden_size
        features = states[..., :split] if states is not None and split else None
        final_hidden = states[..., split:] if states is not None and self.reads_target else None
        if not config.use_target_features:  # standalone-drafter ablation: the context is the prefix's own token embeddings
            features = target.embed(input_ids)
        anchors = sample_anchors(loss_mask, config.block_size, self.training.num_anchors, self.training.anchor_sampling, generator)
        blocks = build_blocks(input_ids, loss_mask, anchors, config.block_size, config.mask_token_id)
        if self.training.agreement_mask:
            blocks = on_policy_blocks(blocks, greedy_tokens(target, final_hidden, blocks), config.block_size)
        hidden = draft_blocks(self.drafter, target.embed, features, attention_mask, anchors, blocks)
        return blocks, hidden, final_hidden

    def training_vocab(self, target: TargetModel) -> DraftVocab | None:
        """The training vocabulary (`training.draft_vocab_size`) on the target's device, or None."""
        size = self.training.draft_vocab_size
        if size is None or size >= target.embedding_rows:
            return None
        if self.draft_vocab is None:
            rows, train_set = getattr(self.datamodule, "rows", None), getattr(self.datamodule, "train_set", None)
            with config_key("training"):
                require(
                    rows is not None and train_set is not None,
                    "draft_vocab_size",
                    "counts the training rows of a DFlashDataModule; train through python -m dflash.train or pass one",
                )
                require(target.lm_head.bias is None, "draft_vocab_size", "this target's LM head has a bias; set it to null")
            ids = frequent_response_tokens(
                rows.input_ids, rows.loss_mask, rows.offsets, train_set.indices, size, target.embedding_rows
            )
            self.draft_vocab = DraftVocab.build(ids, target.head_rows_of(ids), target.embedding_rows)
            self.drafter.draft_vocab = ids  # exported beside the weights: decoding drafts over it
        if self.draft_vocab.ids.device != target.device:
            self.draft_vocab = self.draft_vocab.to(target.device)
        return self.draft_vocab


def greedy_tokens(target: TargetModel, final_hidden: torch.Tensor, blocks, chunk_rows: int = 1024) -> torch.Tensor:
    """(b, N*B) long: at each valid slot, the target's argmax over its whole vocabulary at the
    position before the slot's (0 elsewhere), from its final hidden states (b, S, D)."""
    valid = blocks.label_valid
    batch_index = torch.arange(valid.shape[0], device=valid.device)[:, None].expand_as(valid)[valid]
    rows = final_hidden[batch_index, blocks.positions[valid] - 1]
    greedy = torch.zeros_like(blocks.labels)
    with torch.no_grad():
        parts = [target.logits(rows[start : start + chunk_rows]).argmax(dim=-1) for start in range(0, rows.shape[0], chunk_rows)]
    if parts:
        greedy[valid] = torch.cat(parts)
    return greedy
