"""Training data for drafters: sources, regeneration by the target, tokenisation with
loss masks. The Lightning DataModule lives in `dflash.data.datamodule` (imported on its
own so that regeneration does not load Lightning).

The names below are imported on first use (PEP 562): the config schemas of its modules
(`dflash.schema`) are read without importing torch. `regenerate` is the submodule's name, so its
function is imported from `dflash.data.regenerate`."""

from dflash import lazy_exports

__all__, __getattr__ = lazy_exports(
    __name__,
    {
        "dflash.data.chat": ["has_chat_template", "prompt_token_ids"],
        "dflash.data.config": ["DataSpec", "RegenerateSettings"],
        "dflash.data.generators": ["Generated", "HFGenerator", "ServerGenerator"],
        "dflash.data.regenerate": ["shard_paths"],
        "dflash.data.sources": ["SourceSpec", "iter_conversations", "load_conversations", "split_prompt"],
        "dflash.data.token_ids": ["TOKEN_IDS", "sequence_from_token_ids", "tokenizer_fingerprint"],
        "dflash.data.tokenize": ["TokenizedRows", "TokenizeSettings", "tokenize_conversation", "tokenize_conversations"],
    },
)
