"""Tiny random targets built from a config: for tests, the random-drafter floor, and
anything that must run with no hub access.

The tokenizer is byte-level (256 byte tokens + special tokens, no merges), so it needs
no training data and encodes any text. Models are Qwen3 or Llama architectures with
random weights from a seed; they are saved as ordinary HF directories that
`AutoModelForCausalLM` / `AutoTokenizer` load.
"""

from __future__ import annotations

import os

import torch

from dflash.errors import require

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
):
    """A small `Qwen3Config` or `LlamaConfig` (Llama with llama3 rope scaling, as 3.1 uses)."""
    from transformers import LlamaConfig, Qwen3Config

    common = dict(
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
    require(arch in ("qwen3", "llama"), "target.arch", f"unknown tiny architecture {arch!r}; choose qwen3 or llama")
    if arch == "qwen3":
        return Qwen3Config(head_dim=hidden_size // num_heads, rope_theta=10000.0, **common)
    rope = {
        "rope_type": "llama3",
        "rope_theta": 500000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 256,
    }
    return LlamaConfig(rope_scaling=rope, **common)


def build_tiny_target(arch: str = "qwen3", seed: int = 0, chat_template: bool = False, **config_overrides):
    """A random tiny target and its byte tokenizer, as (model, tokenizer).

    The embedding has spare rows beyond the tokenizer (as Qwen's does), so a mask token
    fits.
    """
    from transformers import AutoModelForCausalLM

    tokenizer = byte_tokenizer(chat_template=chat_template)
    config_overrides.setdefault("eos_token_id", tokenizer.eos_token_id)
    config_overrides.setdefault("pad_token_id", tokenizer.pad_token_id)
    config_overrides.setdefault("vocab_size", max(272, len(tokenizer)))
    config = tiny_config(arch, **config_overrides)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation="sdpa")
    _sharpen(model)
    return model.eval(), tokenizer


def _sharpen(model) -> None:
    """Scale up the LM head so random models have peaked next-token distributions.

    With default init, random logits are nearly flat and greedy decoding sits on
    near-ties that float rounding can flip; sharper logits make greedy comparisons
    between two mathematically equal computations meaningful.
    """
    with torch.no_grad():
        model.lm_head.weight.mul_(20.0)


def save_tiny_target(directory: str, arch: str = "qwen3", seed: int = 0, chat_template: bool = False, **overrides) -> str:
    """Build a random tiny target and save it as an HF directory; returns `directory`."""
    model, tokenizer = build_tiny_target(arch, seed=seed, chat_template=chat_template, **overrides)
    os.makedirs(directory, exist_ok=True)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory
