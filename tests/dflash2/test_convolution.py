"""DFlash2's block-local convolution in the drafter's layers (dflash/drafter/heads.py,
dflash/drafter/model.py; docs/frontier.md 1.2): llama.cpp's formula and coefficient layout
(src/models/dflash.cpp:409-472), the identity start equal to the DFlash drafter, blocks laid side
by side in training equal to each block alone (docs/design.md invariant 6) with a seeded bug, and
decoding on the lean or module forward, never the graphed one."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from dflash.dflash.proposer import DFlashProposer
from dflash.drafter import DFlashDrafter
from dflash.drafter.heads import GroupedDynamicConv
from dflash.engine import FastDrafter, GraphedDrafter
from dflash.specs import DrafterSpec, build_drafter

HIDDEN, BLOCK = 64, 4


def dflash2_config(target, block_size: int = BLOCK):
    config = build_drafter(DrafterSpec(num_layers=2, block_size=block_size), target).config
    return dataclasses.replace(config, conv_kernel_size=2, conv_group_size=16, selector_rank=8, selector_top_k=4)


def randomise_convolutions(drafter: DFlashDrafter, seed: int = 1) -> None:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for layer in drafter.layers:
            for conv in (layer.attention_conv, layer.mlp_conv):
                for parameter in (conv.base_kernel, conv.kernel_projection.weight):
                    parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.5)


def llama_cpp_convolution(x, coefficients, base, side, block_size, kernel, group_size):
    """dflash.cpp:409-472 written out row by row and channel by channel."""
    rows, hidden = x.shape
    groups = hidden // group_size
    out = torch.zeros_like(x)
    for r in range(rows):
        first = r - r % block_size
        for c in range(hidden):
            for t in range(min(kernel, block_size)):
                if r - t < first:
                    continue
                dynamic = coefficients[r, side * kernel * groups + t * groups + c // group_size]
                out[r, c] += (base[side, t, c] + dynamic) * x[r - t, c]
    return out


@pytest.mark.parametrize("kernel, block_size", [(2, 4), (3, 2)])
def test_the_convolution_is_llama_cpps(kernel, block_size):
    torch.manual_seed(0)
    hidden, group = 8, 4
    conv = GroupedDynamicConv(hidden, kernel, group)
    with torch.no_grad():
        conv.base_kernel.normal_()
        conv.kernel_projection.weight.normal_()
    x, y = torch.randn(1, 3 * block_size, hidden), torch.randn(1, 3 * block_size, hidden)
    pre, coefficients = conv.pre(x, block_size)
    post = conv.post(y, coefficients, block_size)
    base = conv.base_kernel.detach()
    args = (block_size, kernel, group)
    assert torch.allclose(pre[0], llama_cpp_convolution(x[0], coefficients[0].detach(), base, 0, *args), atol=1e-5)
    assert torch.allclose(post[0], llama_cpp_convolution(y[0], coefficients[0].detach(), base, 1, *args), atol=1e-5)


def block_inputs(target, num_blocks: int, context: int = 5, seed: int = 0):
    """Context features and N blocks of B rows, each block anchored after the context."""
    generator = torch.Generator().manual_seed(seed)
    features = torch.randn(1, context, 2 * HIDDEN, generator=generator)
    embeds = torch.randn(1, num_blocks * BLOCK, HIDDEN, generator=generator)
    anchors = torch.arange(num_blocks) + context
    positions = (anchors.unsqueeze(-1) + torch.arange(BLOCK)).view(1, -1)
    return embeds, positions, features, torch.arange(context).unsqueeze(0)


def side_by_side_mask(num_blocks: int, context: int) -> torch.Tensor:
    """Dense bool mask: every block row sees the whole context and its own block only."""
    block = torch.arange(num_blocks * BLOCK) // BLOCK
    own = block.unsqueeze(1) == block.unsqueeze(0)
    return torch.cat([torch.ones(num_blocks * BLOCK, context, dtype=torch.bool), own], dim=1)


def test_an_identity_convolution_drafts_what_the_dflash_drafter_drafts(qwen3_target):
    config = dflash2_config(qwen3_target)
    assert config.hidden_size == HIDDEN and config.num_target_features == 2
    torch.manual_seed(0)
    plain = DFlashDrafter(dataclasses.replace(config, conv_kernel_size=0, selector_rank=0, selector_top_k=0))
    torch.manual_seed(0)
    dflash2 = DFlashDrafter(config)
    inputs = block_inputs(qwen3_target, num_blocks=3)
    mask = side_by_side_mask(3, 5)
    assert torch.equal(plain(*inputs, mask=mask), dflash2(*inputs, mask=mask))
    randomise_convolutions(dflash2)
    assert not torch.allclose(plain(*inputs, mask=mask), dflash2(*inputs, mask=mask), atol=1e-3)  # the test can fail


@pytest.mark.parametrize("seeded_bug", [False, True])
def test_blocks_side_by_side_give_each_block_what_it_gives_alone(qwen3_target, seeded_bug):
    torch.manual_seed(0)
    drafter = DFlashDrafter(dflash2_config(qwen3_target))
    randomise_convolutions(drafter)
    embeds, positions, features, context_positions = block_inputs(qwen3_target, num_blocks=3)
    alone = [
        drafter(embeds[:, j * BLOCK : (j + 1) * BLOCK], positions[:, j * BLOCK : (j + 1) * BLOCK], features, context_positions)
        for j in range(3)
    ]
    if seeded_bug:  # a convolution that reads across blocks: row 0 of a block sees the previous block's last row
        drafter.config = dataclasses.replace(drafter.config, block_size=3 * BLOCK)
    together = drafter(embeds, positions, features, context_positions, mask=side_by_side_mask(3, 5))
    equal = all(torch.allclose(together[:, j * BLOCK : (j + 1) * BLOCK], alone[j], atol=1e-5) for j in range(3))
    assert equal is not seeded_bug


def test_decoding_convolves_all_its_rows_as_one_block(qwen3_target, monkeypatch):
    """Training (a mask) convolves blocks of the trained B rows; decoding (no mask) all query rows
    as one block, whatever the verify width, as llama.cpp's draft block of --spec-draft-n-max + 1
    rows is."""
    drafter = DFlashDrafter(dflash2_config(qwen3_target))
    seen, convolve = [], GroupedDynamicConv.convolve
    monkeypatch.setattr(
        GroupedDynamicConv, "convolve", lambda self, x, c, side, rows: seen.append(rows) or convolve(self, x, c, side, rows)
    )
    inputs = block_inputs(qwen3_target, num_blocks=2)
    drafter(*inputs)  # a decoding block of 2B rows
    assert set(seen) == {2 * BLOCK} and len(seen) == 2 * 2 * 2  # 2 layers x (attention, MLP) x 2 sides
    seen.clear()
    drafter(*inputs, mask=side_by_side_mask(2, 5))  # two training blocks
    assert set(seen) == {BLOCK}


def test_a_dflash2_drafter_decodes_on_the_lean_or_module_forward(qwen3_target, caplog):
    drafter = DFlashDrafter(dflash2_config(qwen3_target))
    with pytest.raises(ValueError, match="causal block, decodes on the lean or module forward"):
        GraphedDrafter(drafter)
    with caplog.at_level("INFO"):
        proposer = DFlashProposer(drafter, qwen3_target.embed, qwen3_target.logits, graphed=True)
    assert proposer.forward is drafter
    assert "without CUDA graphs" in caplog.text
    lean = DFlashProposer(drafter, qwen3_target.embed, qwen3_target.logits, lean_dtype=torch.float32)
    assert isinstance(lean.forward, FastDrafter)
    plain = build_drafter(DrafterSpec(num_layers=2, block_size=BLOCK), qwen3_target)
    assert isinstance(DFlashProposer(plain, qwen3_target.embed, qwen3_target.logits, graphed=True).forward, GraphedDrafter)
