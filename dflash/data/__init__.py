"""Training data for drafters: sources, regeneration by the target, tokenisation with
loss masks. The Lightning DataModule lives in `dflash.data.datamodule` (imported on its
own so that regeneration does not load Lightning)."""

from dflash.data.chat import has_chat_template, prompt_token_ids
from dflash.data.config import DataSpec
from dflash.data.generators import Generated, HFGenerator, ServerGenerator
from dflash.data.regenerate import RegenerateSettings, regenerate, shard_paths
from dflash.data.sources import SourceSpec, iter_conversations, load_conversations, split_prompt
from dflash.data.token_ids import TOKEN_IDS, sequence_from_token_ids, tokenizer_fingerprint
from dflash.data.tokenize import TokenizedRows, TokenizeSettings, tokenize_conversation, tokenize_conversations

__all__ = [
    "DataSpec",
    "Generated",
    "HFGenerator",
    "RegenerateSettings",
    "ServerGenerator",
    "SourceSpec",
    "TOKEN_IDS",
    "TokenizeSettings",
    "TokenizedRows",
    "has_chat_template",
    "iter_conversations",
    "load_conversations",
    "prompt_token_ids",
    "regenerate",
    "sequence_from_token_ids",
    "shard_paths",
    "split_prompt",
    "tokenize_conversation",
    "tokenize_conversations",
    "tokenizer_fingerprint",
]
