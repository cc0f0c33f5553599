"""End to end: a drafter trained for about a minute learns a tiny target's greedy
continuations, and the decoding engine's acceptance matches what training predicts.

Data: a random tiny target continues varied random prompts greedily; random models
fall into repetitive loops, which a drafter can learn. Each prompt is 8 random bytes
plus the target's own first 24 tokens (so the continuation starts inside its loops);
the loss mask covers the 64-token continuation.
"""

import dataclasses

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader

from dflash.decoding import generate
from dflash.dflash.proposer import DFlashProposer
from dflash.specs import DrafterSpec, TargetSpec
from dflash.training import TrainingSettings
from dflash.training.anchors import Anchors
from dflash.training.blocks import build_blocks
from dflash.training.forward import draft_blocks, target_features
from helpers.training import dflash_training_module

RANDOM_BYTES, WARMUP, CONTINUATION, BLOCK_SIZE = 8, 24, 64, 16
PROMPT_LEN = RANDOM_BYTES + WARMUP


def greedy_sequences(target, num_sequences: int, generator: torch.Generator) -> torch.Tensor:
    """(n, PROMPT_LEN + CONTINUATION) random bytes followed by the target's greedy tokens."""
    ids = torch.randint(0, 256, (num_sequences, RANDOM_BYTES), generator=generator)
    cache = target.new_cache()
    logits = target.forward(ids, torch.arange(ids.shape[1]).expand_as(ids), cache).logits
    for _ in range(WARMUP + CONTINUATION):
        next_ids = logits[:, -1].argmax(-1, keepdim=True)
        ids = torch.cat([ids, next_ids], dim=1)
        logits = target.forward(next_ids, torch.full_like(next_ids, ids.shape[1] - 1), cache).logits
    return ids


def batches(sequences: torch.Tensor, batch_size: int) -> list[dict]:
    out = []
    for chunk in sequences.split(batch_size):
        attention_mask = torch.ones_like(chunk, dtype=torch.bool)
        loss_mask = attention_mask.clone()
        loss_mask[:, :PROMPT_LEN] = False
        out.append({"input_ids": chunk, "attention_mask": attention_mask, "loss_mask": loss_mask})
    return out


def simulated_engine_acceptance(module, sequences: torch.Tensor) -> list[int]:
    """Greedy acceptance lengths the engine must produce, derived from the training path:
    draft every anchor of the held-out sequences at once, then walk each sequence as the
    engine does (accept the leading correct drafts + the bonus token, jump)."""
    drafter, target = module.drafter, module.target
    anchors = torch.arange(PROMPT_LEN, sequences.shape[1] - 1).expand(len(sequences), -1)
    anchors = Anchors(positions=anchors, valid=torch.ones_like(anchors, dtype=torch.bool))
    real = torch.ones_like(sequences, dtype=torch.bool)
    blocks = build_blocks(sequences, real, anchors, BLOCK_SIZE, drafter.config.mask_token_id)
    with torch.no_grad():
        features = target_features(target, sequences, drafter.config.target_layer_ids)
        hidden = draft_blocks(drafter, target.embed_tokens, features, real, anchors, blocks)
        correct = target.lm_head(hidden).argmax(-1) == blocks.labels
    correct = correct.view(len(sequences), -1, BLOCK_SIZE)[:, :, 1:]
    lengths = []
    for row in range(len(sequences)):
        produced = 1  # the prefill's token is the first anchor
        while produced < CONTINUATION:
            num_drafts = min(BLOCK_SIZE - 1, CONTINUATION - produced - 1)
            accepted = 0
            while accepted < num_drafts and correct[row, produced - 1, accepted]:
                accepted += 1
            lengths.append(accepted + 1)
            produced += accepted + 1
    return lengths


@pytest.mark.slow
def test_drafter_learns_and_engine_acceptance_matches_training(tmp_path):
    L.seed_everything(0)
    training = TrainingSettings(num_anchors=8, learning_rate=1e-2)
    module = dflash_training_module(
        TargetSpec(path=str(tmp_path / "target"), build={"arch": "qwen3", "seed": 0}),
        DrafterSpec(num_layers=2, block_size=BLOCK_SIZE),
        training,
    )
    generator = torch.Generator().manual_seed(0)
    train_sequences = greedy_sequences(module.target, 3072, generator)
    heldout_sequences = greedy_sequences(module.target, 48, generator)

    trainer = L.Trainer(
        accelerator="cpu",
        max_steps=800,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        gradient_clip_val=1.0,
    )
    trainer.fit(module, DataLoader(batches(train_sequences, 8), batch_size=None, shuffle=True))
    # Held-out tau_sim over every anchor of every held-out sequence.
    module.training_config = dataclasses.replace(training, num_anchors=CONTINUATION)
    heldout = trainer.validate(module, DataLoader(batches(heldout_sequences, 16), batch_size=None), verbose=False)[0]

    target = module.target
    proposer = DFlashProposer(module.drafter.eval(), target.embed, target.logits)
    engine_lengths = []
    for sequence in heldout_sequences:
        prompt, reference = sequence[:PROMPT_LEN].unsqueeze(0), sequence[PROMPT_LEN:].tolist()
        result = generate(target, prompt, max_new_tokens=CONTINUATION, block_size=BLOCK_SIZE, proposer=proposer)
        assert result.output_ids == reference  # lossless
        engine_lengths += result.acceptance_lengths
    engine_tau = sum(engine_lengths) / len(engine_lengths)
    tau_sim = heldout["val/tau_sim"]
    print(f"held-out tau_sim {tau_sim:.3f}, engine tau {engine_tau:.3f} (bonus token counted)")

    assert tau_sim >= 1.8, f"the drafter did not learn: held-out tau_sim {tau_sim:.3f}"
    assert abs(engine_tau - tau_sim) <= 0.10 * tau_sim
    # Stronger: greedy acceptance is fully determined by the training path's predictions.
    assert engine_lengths == simulated_engine_acceptance(module, heldout_sequences)
