"""The training vocabulary (`training.draft_vocab_size`): which tokens, what a step scores,
that validation still scores the whole vocabulary, and that the export keeps it for decoding."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch

from dflash.drafter import load_drafter, save_drafter
from dflash.layout import DRAFT_VOCAB_FILE, DRAFTER_CONFIG, DRAFTER_WEIGHTS
from dflash.training.draft_vocab import DraftVocab, frequent_response_tokens
from dflash.training.export import export_state
from dflash.training.loss import LossSettings, block_loss
from helpers.training import BATCH, BLOCKS, B, D, V, batch, module_for, random_blocks, softcapped_head


def test_the_vocabulary_counts_response_tokens_of_training_rows_only():
    # row 0 (training): response tokens 5 5 5 7 7 (prompt token 9 is not counted)
    # row 1 (held out): response 3 3 3 3 3 3 must not count
    # row 2 (training): response 7 2
    input_ids = np.array([9, 9, 9, 5, 5, 5, 7, 7, 3, 3, 3, 3, 3, 3, 1, 7, 2], dtype=np.int32)
    loss_mask = np.array([0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 1, 1], dtype=np.uint8)
    offsets = np.array([0, 8, 14, 17])
    ids = frequent_response_tokens(input_ids, loss_mask, offsets, np.array([0, 2]), size=2, vocab_rows=12)
    assert ids.tolist() == [5, 7]  # 5 x3, 7 x3: both; never 9 (prompt) or 3 (held out)
    ids = frequent_response_tokens(input_ids, loss_mask, offsets, np.array([0, 2]), size=4, vocab_rows=12)
    assert ids.tolist() == [0, 2, 5, 7]  # 2 once, then the lowest unused id pads


def test_a_step_scores_the_vocabulary_and_skips_labels_outside_it():
    head, to_logits = softcapped_head()
    blocks = random_blocks()
    ids = torch.arange(0, V, 2)  # the even tokens
    vocab = DraftVocab.build(ids, head.weight.detach()[ids], V)
    settings = LossSettings(block_size=B, position_weights="uniform", chunk_rows=3)
    hidden = torch.randn(BATCH, BLOCKS * B, D, generator=torch.Generator().manual_seed(1)).requires_grad_()
    subset_logits = lambda rows: torch.tanh(torch.nn.functional.linear(rows, vocab.head_rows) / 5.0) * 5.0  # noqa: E731
    result = block_loss(hidden, subset_logits, blocks, settings, vocab_lookup=vocab.lookup)
    # by hand: the valid slots whose label is even, cross-entropy over the even tokens' logits
    scored = blocks.label_valid & (blocks.labels % 2 == 0)
    assert 0 < int(scored.sum()) < int(blocks.label_valid.sum())
    logits = to_logits(hidden[scored])[:, ids]
    expected = torch.nn.functional.cross_entropy(logits, blocks.labels[scored] // 2)
    assert result.loss.item() == pytest.approx(expected.item(), abs=1e-5)
    assert result.slots.numel() == int(scored.sum())


def _vocab_module(tmp_path, data: dict, size: int = 64):
    """The training module with `training.draft_vocab_size=size`, counting on the rows of `data`."""
    module = module_for(tmp_path, f"training.draft_vocab_size={size}", "training.num_anchors=512")

    class Rows:  # the DFlashDataModule fields the vocabulary is counted from
        input_ids = data["input_ids"].reshape(-1).numpy()
        loss_mask = data["loss_mask"].reshape(-1).numpy().astype(np.uint8)
        offsets = np.array([0, data["input_ids"].shape[1], data["input_ids"].numel()])

    class DataModule:
        rows, train_set = Rows(), type("Split", (), {"indices": np.array([0, 1])})()

    module.objective.setup(module.target, DataModule())
    return module


def test_training_steps_use_it_and_validation_scores_the_whole_vocabulary(tmp_path):
    data = batch()
    module = _vocab_module(tmp_path, data)
    full_module = module_for(tmp_path, "training.num_anchors=512")
    full_module.drafter.load_state_dict(module.drafter.state_dict())
    torch.manual_seed(0)
    val = module.compute_loss(data, torch.Generator().manual_seed(0), full_vocab=True)
    torch.manual_seed(0)
    full = full_module.compute_loss(data, torch.Generator().manual_seed(0))
    assert val.loss.item() == pytest.approx(full.loss.item(), abs=1e-6)
    step = module.compute_loss(data, torch.Generator().manual_seed(0))
    assert module.objective.draft_vocab.ids.numel() == 64
    assert step.loss.item() < full.loss.item()  # softmax over 64 tokens, not the whole vocabulary
    # every response token of these rows is in the vocabulary, so every slot is still scored
    assert step.slots.numel() == full.slots.numel()


def test_the_export_keeps_it_beside_unchanged_weights_and_config(tmp_path):
    data = batch()
    module = _vocab_module(tmp_path, data)
    assert module.drafter.draft_vocab is None  # counted on the first step, not before
    module.compute_loss(data, torch.Generator().manual_seed(0))
    checkpoint = {"state_dict": module.state_dict()}
    module.on_save_checkpoint(checkpoint)
    directory = export_state(checkpoint, str(tmp_path / "drafter"))
    counted = module.objective.draft_vocab.ids.cpu()
    assert torch.equal(load_drafter(directory).draft_vocab, counted)
    with open(os.path.join(directory, DRAFT_VOCAB_FILE)) as f:
        assert json.load(f) == {"token_ids": counted.tolist()}
    # what other readers open is byte for byte what a drafter without a vocabulary writes
    plain = load_drafter(directory)
    plain.draft_vocab = None
    save_drafter(plain, str(tmp_path / "plain"))
    for name in (DRAFTER_CONFIG, DRAFTER_WEIGHTS):
        with open(os.path.join(directory, name), "rb") as ours, open(tmp_path / "plain" / name, "rb") as theirs:
            assert ours.read() == theirs.read()
    save_drafter(plain, directory)  # a drafter without one, saved over it, leaves none behind
    assert load_drafter(directory).draft_vocab is None
