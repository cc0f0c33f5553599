"""Tiny random targets built from a config: for tests, the random-drafter floor, and anything that
must run with no hub access.

The tokenizer is byte-level (256 byte tokens + special tokens, no merges): it needs no training data
and encodes any text. Models are small configs of the families in `TINY_ARCHS` (Qwen3, Llama-3.1,
Mistral, Gemma2/3, GPT-2, ...) with random weights from a seed, saved as ordinary HF directories.
"""

from __future__ import annotations

import os

import torch

from dflash.errors import require
from dflash.target.model import find_lm_head, supported_attention_implementation

SPECIAL_TOKENS = ["<|endoftext|>", "<|pad|>", "<|MASK|>"]

# A minimal ChatML template, so chat-template code paths can be tested offline.
CHATML_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def byte_tokenizer(chat_template: bool = False, mask_token: bool = True):
    """A byte-level `PreTrainedTokenizerFast` with <|endoftext|> (eos), <|pad|> and,
    optionally, <|MASK|> as the mask token and ChatML markers with a chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {symbol: i for i, symbol in enumerate(sorted(alphabet))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    specials = SPECIAL_TOKENS[:2] + (["<|MASK|>"] if mask_token else [])
    specials += ["<|im_start|>", "<|im_end|>"] if chat_template else []
    tok.add_special_tokens(specials)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|endoftext|>",
        pad_token="<|pad|>",
        mask_token="<|MASK|>" if mask_token else None,
    )
    if chat_template:
        fast.chat_template = CHATML_TEMPLATE
    return fast


def tiny_config(
    arch: str = "qwen3",
    vocab_size: int = 272,
    hidden_size: int = 64,
    num_layers: int = 6,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 128,
    max_positions: int = 2048,
    eos_token_id: int = 256,
    pad_token_id: int = 257,
    sliding_window: int | None = None,
):
    """A small HF config of the family `arch` (one of `TINY_ARCHS`).

    "llama" has llama3 rope scaling, as Llama-3.1 uses. `sliding_window` turns on
    sliding-window attention in the families that have it (mistral, qwen2, qwen3, phi3;
    gemma2 and gemma3 always alternate sliding and full layers, window 8 by default).
    """
    require(arch in _FAMILIES, "arch", f"unknown tiny architecture {arch!r}; choose one of {sorted(_FAMILIES)}")
    if sliding_window is not None:
        require(
            arch in _SLIDING_FAMILIES,
            "sliding_window",
            f"{arch} has no sliding window; windowed tiny families: {sorted(_SLIDING_FAMILIES)}",
        )
    sizes = dict(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=max_positions,
        eos_token_id=eos_token_id,
        pad_token_id=pad_token_id,
        bos_token_id=None,
        tie_word_embeddings=False,
    )
    config_cls, kwargs = _FAMILIES[arch](sizes, sliding_window)
    return config_cls(**kwargs)


# Each family: (config class, constructor kwargs) from Llama-named sizes and the window.
def _qwen3(sizes, window):
    from transformers import Qwen3Config

    sliding = dict(use_sliding_window=True, sliding_window=window, max_window_layers=1) if window else {}
    head_dim = sizes["hidden_size"] // sizes["num_attention_heads"]
    return Qwen3Config, dict(sizes, head_dim=head_dim, rope_theta=10000.0, **sliding)


def _llama(sizes, window):
    from transformers import LlamaConfig

    rope = {
        "rope_type": "llama3",
        "rope_theta": 500000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 256,
    }
    return LlamaConfig, dict(sizes, rope_scaling=rope)


def _qwen2(sizes, window):
    from transformers import Qwen2Config

    sliding = dict(use_sliding_window=True, sliding_window=window, max_window_layers=1) if window else {}
    return Qwen2Config, dict(sizes, **sliding)


def _qwen3_moe(sizes, window):
    from transformers import Qwen3MoeConfig

    experts = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=sizes["intermediate_size"] // 2)
    return Qwen3MoeConfig, dict(sizes, head_dim=sizes["hidden_size"] // sizes["num_attention_heads"], **experts)


def _mistral(sizes, window):
    from transformers import MistralConfig

    return MistralConfig, dict(sizes, sliding_window=window)


def _phi3(sizes, window):
    from transformers import Phi3Config

    return Phi3Config, dict(sizes, sliding_window=window)


def _olmo2(sizes, window):
    from transformers import Olmo2Config

    return Olmo2Config, sizes


def _stablelm(sizes, window):
    from transformers import StableLmConfig

    return StableLmConfig, sizes  # partial rotary (25%) by default


def _gemma2(sizes, window):
    from transformers import Gemma2Config

    head_dim = sizes["hidden_size"] // sizes["num_attention_heads"]
    return Gemma2Config, dict(sizes, head_dim=head_dim, query_pre_attn_scalar=head_dim, sliding_window=window or 8)


def _gemma3(sizes, window):
    from transformers import Gemma3TextConfig

    head_dim = sizes["hidden_size"] // sizes["num_attention_heads"]
    # Different rope settings per layer type; the drafter must take the full-attention ones.
    rope = {
        "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0},
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
    }
    return Gemma3TextConfig, dict(
        sizes,
        head_dim=head_dim,
        query_pre_attn_scalar=head_dim,
        sliding_window=window or 8,
        final_logit_softcapping=30.0,
        rope_parameters=rope,
    )


def _gpt2(sizes, window):
    from transformers import GPT2Config

    # No intermediate size (n_inner=None means 4x hidden) and learned absolute positions, no rope.
    return GPT2Config, dict(
        vocab_size=sizes["vocab_size"],
        n_embd=sizes["hidden_size"],
        n_layer=sizes["num_hidden_layers"],
        n_head=sizes["num_attention_heads"],
        n_positions=sizes["max_position_embeddings"],
        **{k: sizes[k] for k in ("eos_token_id", "pad_token_id", "bos_token_id", "tie_word_embeddings")},
    )


def _gpt_neox(sizes, window):
    from transformers import GPTNeoXConfig

    return GPTNeoXConfig, {k: v for k, v in sizes.items() if k != "num_key_value_heads"}  # partial rotary by default


def _falcon(sizes, window):
    from transformers import FalconConfig

    falcon = {k: v for k, v in sizes.items() if k not in ("num_key_value_heads", "intermediate_size")}
    return FalconConfig, dict(falcon, new_decoder_architecture=True, num_kv_heads=sizes["num_key_value_heads"])


def _granite(sizes, window):
    from transformers import GraniteConfig

    # Multipliers the family applies in its forward, away from the embedding and head modules.
    return GraniteConfig, dict(sizes, embedding_multiplier=6.0, logits_scaling=4.0)


def _cohere(sizes, window):
    from transformers import CohereConfig

    return CohereConfig, dict(sizes, logit_scale=0.5)


_FAMILIES = {
    "qwen3": _qwen3,
    "llama": _llama,
    "qwen2": _qwen2,
    "qwen3_moe": _qwen3_moe,
    "mistral": _mistral,
    "phi3": _phi3,
    "olmo2": _olmo2,
    "stablelm": _stablelm,
    "gemma2": _gemma2,
    "gemma3": _gemma3,
    "gpt2": _gpt2,
    "gpt_neox": _gpt_neox,
    "falcon": _falcon,
    "granite": _granite,
    "cohere": _cohere,
}
_SLIDING_FAMILIES = {"qwen3", "qwen2", "mistral", "phi3", "gemma2", "gemma3"}
TINY_ARCHS = tuple(_FAMILIES)


def build_tiny_target(arch: str = "qwen3", seed: int = 0, chat_template: bool = False, **config_overrides):
    """A random tiny target and its byte tokenizer, as (model, tokenizer). The embedding has spare rows
    beyond the tokenizer (as Qwen's does), so a mask token fits."""
    from transformers import AutoModelForCausalLM

    tokenizer = byte_tokenizer(chat_template=chat_template)
    config_overrides.setdefault("eos_token_id", tokenizer.eos_token_id)
    config_overrides.setdefault("pad_token_id", tokenizer.pad_token_id)
    config_overrides.setdefault("vocab_size", max(272, len(tokenizer)))
    config = tiny_config(arch, **config_overrides)
    torch.manual_seed(seed)
    implementation = supported_attention_implementation(config, "sdpa")
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation=implementation)
    # Sharpen the head: with default init, random logits are nearly flat and greedy decoding sits on near-ties
    # that float rounding can flip; peaked logits make greedy comparisons of two equal computations meaningful.
    with torch.no_grad():
        find_lm_head(model).weight.mul_(20.0)
    return model.eval(), tokenizer


def save_tiny_target(directory: str, arch: str = "qwen3", seed: int = 0, chat_template: bool = False, **overrides) -> str:
    """Build a random tiny target and save it as an HF directory; returns `directory`."""
    model, tokenizer = build_tiny_target(arch, seed=seed, chat_template=chat_template, **overrides)
    os.makedirs(directory, exist_ok=True)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory
