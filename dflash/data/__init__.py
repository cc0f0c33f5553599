"""Training data for drafters: sources, regeneration by the target, tokenisation with
loss masks. The Lightning DataModule lives in `dflash.data.datamodule` (imported on its
own so that regeneration does not load Lightning)."""

from dflash.data.chat import has_chat_template, prompt_token_ids
from dflash.data.config import DataSpec
from dflash.data.generators import Generated, HFGenerator, ServerGenerator
from dflash.data.regenerate import RegenerateSettings, regenerate, shard_paths
from dflash.data.sources import SourceSpec, load_conversations, split_prompt
from dflash.data.tokenize import TokenizedRows, TokenizeSettings, tokenize_conversation, tokenize_conversations

__all__ = [
    "DataSpec",
    "Generated",
    "HFGenerator",
    "RegenerateSettings",
    "ServerGenerator",
    "SourceSpec",
    "TokenizeSettings",
    "TokenizedRows",
    "has_chat_template",
    "load_conversations",
    "prompt_token_ids",
    "regenerate",
    "shard_paths",
    "split_prompt",
    "tokenize_conversation",
    "tokenize_conversations",
]
