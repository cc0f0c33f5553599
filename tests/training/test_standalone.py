"""The standalone-drafter ablation (no target features) trains what decoding runs."""

import torch

from dflash.dflash.proposer import DFlashProposer
from dflash.specs import DrafterSpec, TargetSpec
from dflash.training.anchors import Anchors
from dflash.training.blocks import build_blocks
from dflash.training.config import TrainingSettings
from dflash.training.forward import draft_blocks
from helpers.training import dflash_training_module


def test_standalone_training_logits_equal_decoding_logits(tmp_path):
    spec = TargetSpec(path=str(tmp_path / "target"), dtype="float32", build={"arch": "qwen3", "seed": 0})
    module = dflash_training_module(
        spec, DrafterSpec(num_layers=1, block_size=4, use_target_features=False), TrainingSettings(num_anchors=4)
    )
    target, drafter = module.target, module.drafter.eval()
    assert drafter.fc is None
    ids = torch.randint(0, 256, (1, 20), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids, dtype=torch.bool)
    anchors = Anchors(positions=torch.tensor([[3, 9, 15]]), valid=torch.ones(1, 3, dtype=torch.bool))
    blocks = build_blocks(ids, mask, anchors, 4, drafter.config.mask_token_id)
    with torch.no_grad():
        hidden = draft_blocks(drafter, target.embed_tokens, target.embed_tokens(ids), mask, anchors, blocks)
        training = target.lm_head(hidden).view(3, 4, -1)[:, 1:]
    proposer = DFlashProposer(drafter, target.embed, target.logits)
    for j, anchor in enumerate([3, 9, 15]):
        decoding = proposer.propose(ids[:, : anchor + 1], None, 4, 3)
        torch.testing.assert_close(training[j], decoding, atol=1e-5, rtol=1e-5)
    result = module.compute_loss({"input_ids": ids, "loss_mask": mask, "attention_mask": mask})
    assert result.slots.numel() > 0 and torch.isfinite(result.loss)
    result.loss.backward()  # gradients reach the drafter without any target forward
    assert drafter.layers[0].self_attn.k_proj.weight.grad is not None
