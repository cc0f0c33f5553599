"""Targets beyond Qwen3/Llama: sliding windows, Gemma's embedding scale and logit
softcapping, per-layer-type rope, GPT-2/GPT-NeoX/Falcon module layouts.

Every family runs as a tiny random model (`dflash.toy.tiny`); sliding windows are 8
tokens, so prompt + output cross the window many times.
"""

import functools
import logging

import pytest
import torch
from torch import nn

from dflash.decoding import generate
from dflash.dflash.proposer import DFlashProposer
from dflash.drafter import DFlashDrafter, DrafterConfig, load_drafter, resolve_mask_token_id, save_drafter
from dflash.errors import ConfigError
from dflash.target import TargetModel
from dflash.target.model import find_decoder_layers
from dflash.toy.tiny import build_tiny_target, save_tiny_target
from dflash.training.anchors import Anchors
from dflash.training.blocks import build_blocks
from dflash.training.forward import draft_blocks, target_features
from helpers.decoding import PartialOracleProposer, hf_greedy

WINDOW = 8
# Families whose sliding window is opt-in (Gemma2/3 always alternate window and full layers).
OPT_IN_WINDOW = {"mistral", "qwen3", "phi3"}
# The minimum set first; the rest run in the slow set.
DECODING_ARCHS = ["mistral", "gemma2", "gemma3", "qwen2", "qwen3_moe", "gpt2"]
MORE_ARCHS = ["qwen3", "phi3", "olmo2", "stablelm", "gpt_neox", "falcon", "granite", "cohere"]
PROMPT = "def add(a, b):\n    return a + b\n# more"  # 38 tokens: longer than the window
MAX_NEW = 30


@functools.cache
def tiny_target(arch: str) -> TargetModel:
    window = {"sliding_window": WINDOW} if arch in OPT_IN_WINDOW else {}
    model, tokenizer = build_tiny_target(arch, seed=0, **window)
    return TargetModel(model, tokenizer)


def random_drafter(target: TargetModel, block_size: int = 16, num_layers: int = 2, seed: int = 0) -> DFlashDrafter:
    torch.manual_seed(seed)
    mask_id = resolve_mask_token_id(target.tokenizer, target.embedding_rows)
    config = DrafterConfig.from_target(target.config, num_layers=num_layers, block_size=block_size, mask_token_id=mask_id)
    return DFlashDrafter(config).eval()


def _assert_lossless(arch: str) -> None:
    target = tiny_target(arch)
    ids = target.tokenizer(PROMPT, return_tensors="pt").input_ids
    expected = hf_greedy(target, ids, MAX_NEW)
    proposer = DFlashProposer(random_drafter(target), target.embed, target.logits)
    for block_size in (2, 16):
        result = generate(target, ids, max_new_tokens=MAX_NEW, block_size=block_size, proposer=proposer)
        assert result.output_ids == expected, ("random drafter", block_size)
    for block_size in (4, 16):
        oracle = PartialOracleProposer(target, seed=block_size)
        result = generate(target, ids, max_new_tokens=MAX_NEW, block_size=block_size, proposer=oracle)
        assert result.output_ids == expected, ("partial oracle", block_size)
        # Drafts were rejected mid-block and the cache rewound across the window.
        assert any(0 < n < block_size for n in result.acceptance_lengths)


@pytest.mark.parametrize("arch", DECODING_ARCHS)
def test_speculative_greedy_equals_hf_generate(arch):
    _assert_lossless(arch)


@pytest.mark.slow
@pytest.mark.parametrize("arch", MORE_ARCHS)
def test_speculative_greedy_equals_hf_generate_more_families(arch):
    _assert_lossless(arch)


def test_the_window_changes_the_output_these_tests_compare():
    """Guard for the tests above: with the window off the same weights decode differently,
    so a cache or mask that ignored the window would be caught."""
    target = tiny_target("mistral")
    ids = target.tokenizer(PROMPT, return_tensors="pt").input_ids
    windowed = hf_greedy(target, ids, MAX_NEW)
    target.config.sliding_window = None
    try:
        full = hf_greedy(target, ids, MAX_NEW)
    finally:
        target.config.sliding_window = WINDOW
    assert windowed != full


@pytest.mark.parametrize("arch", DECODING_ARCHS + MORE_ARCHS)
def test_embed_logits_and_taps_are_what_the_target_computes(arch):
    target = tiny_target(arch)
    ids = torch.tensor([[5, 80, 81, 99, 3, 17]])
    layer_outputs = []
    record = lambda module, inputs, out: layer_outputs.append(out)  # noqa: E731
    hooks = [layer.register_forward_hook(record) for layer in find_decoder_layers(target.model)]
    try:
        out = target.model(ids, output_hidden_states=True)
    finally:
        for hook in hooks:
            hook.remove()
    hidden = out.hidden_states
    assert len(hidden) == target.num_layers + 1
    # Taps: hidden_states[i + 1] is layer i's output (the last entry comes after the final norm).
    for i, layer_out in enumerate(layer_outputs[:-1]):
        assert torch.equal(hidden[i + 1], layer_out[0] if isinstance(layer_out, tuple) else layer_out)
    torch.testing.assert_close(target.logits(hidden[-1]), out.logits.float(), rtol=0, atol=1e-5)
    if arch in ("gemma2", "gemma3", "granite", "cohere"):  # the checks would catch a missing transform
        assert (target.lm_head(hidden[-1]).float() - out.logits).abs().max() > 1e-2
    if arch == "granite":
        assert (target.embed_tokens(ids) - hidden[0]).abs().max() > 1e-2
    if arch == "gpt2":  # the first layer also gets learned absolute positions; the drafter uses rope instead
        hidden0 = hidden[0] - target.model.transformer.wpe(torch.arange(ids.shape[1]))
    else:
        hidden0 = hidden[0]
    torch.testing.assert_close(target.embed(ids), hidden0, rtol=0, atol=1e-6)


def test_gemma2_scaled_in_the_forward_as_transformers_4_does():
    """transformers 4 Gemma/Gemma2 scale by sqrt(hidden) in the model forward, with a
    plain nn.Embedding; `embed` then applies the scale itself."""
    target = tiny_target("gemma2")
    scaled = target.embed_tokens
    plain = nn.Embedding(scaled.num_embeddings, scaled.embedding_dim)
    plain.weight = scaled.weight
    model = build_tiny_target("gemma2", seed=0)[0]
    model.set_input_embeddings(plain)
    ids = torch.tensor([[1, 2, 3]])
    torch.testing.assert_close(TargetModel(model).embed(ids), scaled(ids), rtol=0, atol=0)
    assert not torch.equal(plain(ids), scaled(ids))


@pytest.mark.parametrize(
    "arch,intermediate,kv_heads,eps",
    [("gpt2", 256, 4, 1e-5), ("falcon", 256, 2, 1e-5), ("gpt_neox", 128, 4, 1e-5), ("gemma3", 128, 2, 1e-6)],
)
def test_drafter_sizes_from_each_family(arch, intermediate, kv_heads, eps):
    config = random_drafter(tiny_target(arch)).config
    assert (config.hidden_size, config.num_attention_heads, config.head_dim) == (64, 4, 16)
    assert (config.intermediate_size, config.num_key_value_heads, config.rms_norm_eps) == (intermediate, kv_heads, eps)


@pytest.mark.parametrize("arch", ["gemma3", "llama", "mistral"])
def test_drafter_rope_equals_the_targets_full_attention_rope(arch):
    target = tiny_target(arch)
    drafter = random_drafter(target)
    x = torch.zeros(1, 5, target.hidden_size)
    positions = torch.tensor([[0, 1, 7, 300, 1500]])
    rotary = target.model.model.rotary_emb
    expected = rotary(x, positions, "full_attention") if arch == "gemma3" else rotary(x, positions)
    for got, want in zip(drafter.rotary_emb(x, positions), expected):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-6)


@pytest.mark.parametrize("arch", ["gpt2", "gpt_neox"])
def test_drafter_without_target_rope_uses_the_default_theta_over_whole_heads(arch):
    """GPT-2 has no rope and GPT-NeoX rotates 25% of each head: the drafter, always
    Qwen3-style, rotates whole heads with theta 10000."""
    rope = random_drafter(tiny_target(arch)).config.rope_hf_config().rope_parameters
    assert rope == {"rope_type": "default", "rope_theta": 10000.0}


def test_drafter_reads_transformers_4_rope_keys():
    """A config.json written under transformers 4 (`rope_theta`, `rope_scaling` with the
    old `type` key) gives the same rope as the transformers-5 form."""
    llama = random_drafter(tiny_target("llama")).config
    v4_keys = {k: v for k, v in llama.to_hf_dict().items() if k != "rope_parameters"}
    scaling = dict(llama.target_config["rope_parameters"])
    v4_keys["rope_theta"] = scaling.pop("rope_theta")
    v4_keys["rope_scaling"] = dict(scaling, type=scaling.pop("rope_type"))
    from_v4 = DrafterConfig.from_hf_dict(v4_keys).rope_hf_config().rope_parameters
    assert from_v4 == llama.rope_hf_config().rope_parameters
    assert from_v4["rope_type"] == "llama3" and from_v4["rope_theta"] == 500000.0


@pytest.mark.parametrize("arch", ["gemma3", "gpt2"])
def test_saved_drafter_keeps_its_rope(arch, tmp_path):
    """Per-layer-type rope (Gemma3) and no rope (GPT-2) survive config.json unchanged."""
    drafter = random_drafter(tiny_target(arch))
    save_drafter(drafter, str(tmp_path))
    loaded = load_drafter(str(tmp_path))
    x, positions = torch.zeros(1, 3, 64), torch.tensor([[0, 5, 900]])
    for got, want in zip(loaded.rotary_emb(x, positions), drafter.rotary_emb(x, positions)):
        assert torch.equal(got, want)


def test_training_blocks_equal_proposer_blocks_on_gemma3():
    """Training path == decoding path (see tests/training/test_equivalence.py) through
    Gemma3's scaled embedding, softcapped head and per-layer-type rope."""
    target, block_size = tiny_target("gemma3"), 4
    drafter = random_drafter(target, block_size=block_size)
    with torch.no_grad():
        for parameter in drafter.parameters():
            if parameter.dim() == 2:
                parameter.normal_(std=0.15)
    torch.manual_seed(3)
    input_ids = torch.randint(0, 256, (1, 40))
    real = torch.ones_like(input_ids, dtype=torch.bool)
    anchor_positions = [2, 9, 10, 25, 39]
    anchors = Anchors(positions=torch.tensor([anchor_positions]), valid=torch.ones(1, 5, dtype=torch.bool))
    blocks = build_blocks(input_ids, real, anchors, block_size, drafter.config.mask_token_id)
    features = target_features(target, input_ids, drafter.config.target_layer_ids)
    with torch.no_grad():
        hidden = draft_blocks(drafter, target.embed, features, real, anchors, blocks)
    training = target.logits(hidden).view(5, block_size, -1)[:, 1:]
    proposer = DFlashProposer(drafter, target.embed, target.logits)
    seen = 0
    for j, anchor in enumerate(anchor_positions):
        decoding = proposer.propose(input_ids[:, : anchor + 1], features[:, seen:anchor], block_size, block_size - 1)
        seen = anchor
        torch.testing.assert_close(training[j], decoding, atol=1e-5, rtol=1e-5)


def test_a_model_whose_layers_cannot_be_found_fails_in_one_line():
    class Blockless(nn.Module):
        config = type("Config", (), {"num_hidden_layers": 2})()

        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(10, 4)
            self.head = nn.Linear(4, 10)
            self.stack = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))

        def get_input_embeddings(self):
            return self.embed

        def get_output_embeddings(self):
            return self.head

    with pytest.raises(ConfigError, match="cannot find the decoder layers of Blockless") as error:
        TargetModel(Blockless())
    assert "\n" not in str(error.value)


def test_gemma2_loads_with_eager_attention_when_sdpa_is_asked(tmp_path, caplog):
    save_tiny_target(str(tmp_path), arch="gemma2")
    with caplog.at_level(logging.INFO, logger="dflash.target.model"):
        target = TargetModel.load(str(tmp_path), dtype="float32", attn_implementation="sdpa")
    assert target.model.config._attn_implementation == "eager"
    assert "Gemma2ForCausalLM does not support sdpa" in caplog.text
