"""Starting a drafter from the target's weights (`drafter.init_from_target`)."""

from __future__ import annotations

import pytest
import torch

from dflash.drafter.model import DrafterCache
from dflash.drafter.target_init import final_norm
from dflash.errors import ConfigError
from dflash.specs import DrafterSpec, build_drafter
from dflash.target import TargetModel
from dflash.target.model import find_decoder_layers
from dflash.toy.tiny import build_tiny_target


def _cache_keys(cache, layer: int) -> torch.Tensor:
    """(b, kv_heads, len, head_dim) keys of one layer of an HF cache (transformers 4 or 5)."""
    if hasattr(cache, "layers"):
        return cache.layers[layer].keys
    return cache.key_cache[layer]


@pytest.mark.parametrize("arch", ["qwen3", "llama"])
def test_layers_and_norms_are_the_targets_top_ones(arch):
    target = TargetModel(*build_tiny_target(arch, seed=0))
    drafter = build_drafter(DrafterSpec(num_layers=2, block_size=4, num_target_features=2, init_from_target=True), target)
    layers = find_decoder_layers(target.model)
    for ours, theirs in zip(drafter.layers, layers[-2:]):
        for name in ("self_attn.q_proj", "self_attn.o_proj", "mlp.down_proj", "input_layernorm", "post_attention_layernorm"):
            assert torch.equal(ours.get_submodule(name).weight, theirs.get_submodule(name).weight), name
        if arch == "qwen3":
            assert torch.equal(ours.self_attn.k_norm.weight, theirs.self_attn.k_norm.weight)
        else:  # Llama has no q/k norms: the drafter's stay at ones
            assert torch.equal(ours.self_attn.k_norm.weight, torch.ones_like(ours.self_attn.k_norm.weight))
    assert torch.equal(drafter.norm.weight, final_norm(target).weight)
    assert torch.equal(drafter.hidden_norm.weight, layers[-2].input_layernorm.weight)
    # a randomly initialised drafter of the same shape differs
    fresh = build_drafter(DrafterSpec(num_layers=2, block_size=4, num_target_features=2), target)
    assert not torch.equal(fresh.layers[0].mlp.down_proj.weight, drafter.layers[0].mlp.down_proj.weight)


def test_context_keys_and_values_start_as_the_copied_layer_computes_them():
    # Tap the output of layer 4, the input of layer 5, which the 1-layer drafter copies: fc
    # passes that tap through and hidden_norm is layer 5's input norm, so the drafter's
    # context keys/values are the target's own layer-5 cache entries.
    target = TargetModel(*build_tiny_target("qwen3", seed=0))
    drafter = build_drafter(DrafterSpec(num_layers=1, block_size=4, target_layer_ids=[0, 4], init_from_target=True), target)
    ids = torch.randint(0, 250, (1, 12), generator=torch.Generator().manual_seed(0))
    positions = torch.arange(12).unsqueeze(0)
    target_cache = target.new_cache()
    features = target.forward(ids, positions, target_cache, [0, 4]).features
    drafter_cache = DrafterCache(1)
    block = target.embed(torch.tensor([[int(ids[0, -1])] + [drafter.config.mask_token_id] * 3]))
    with torch.no_grad():
        drafter(block, torch.arange(11, 15).unsqueeze(0), features[:, :11], positions[:, :11], cache=drafter_cache)
    assert torch.allclose(drafter_cache.keys[0][:, :, :11], _cache_keys(target_cache, 5)[:, :, :11], atol=1e-5)
    values = target_cache.layers[5].values if hasattr(target_cache, "layers") else target_cache.value_cache[5]
    assert torch.allclose(drafter_cache.values[0][:, :, :11], values[:, :, :11], atol=1e-5)


def test_bad_combinations_are_one_config_error():
    target = TargetModel(*build_tiny_target("qwen3", seed=0))
    with pytest.raises(ConfigError, match="drafter.intermediate_size"):
        build_drafter(DrafterSpec(num_layers=1, block_size=4, intermediate_size=96, init_from_target=True), target)
    with pytest.raises(ConfigError, match="only 6"):
        build_drafter(DrafterSpec(num_layers=7, block_size=4, num_target_features=2, init_from_target=True), target)
    with pytest.raises(ConfigError, match="^init_from_target: "):  # the field; the CLI adds the group
        DrafterSpec(path="/some/drafter", init_from_target=True)
    gemma = TargetModel(*build_tiny_target("gemma2", seed=0))
    with pytest.raises(ConfigError, match="gemma2 targets are not supported"):
        build_drafter(DrafterSpec(num_layers=1, block_size=4, init_from_target=True), gemma)
