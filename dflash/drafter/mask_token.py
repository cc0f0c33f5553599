"""The `<mask>` token that fills block slots 1..B-1.

Its id must index a row of the target's embedding: the drafter embeds block tokens
with the target's frozen `embed_tokens`. Qwen's embedding has spare rows beyond the
tokenizer's vocabulary, so adding `<|MASK|>` lands on one; Llama-3's does not, but its
tokenizer has unused `<|reserved_special_token_*|>` entries that can be named instead.
"""

from __future__ import annotations

from dflash.errors import ConfigError

DEFAULT_MASK_TOKEN = "<|MASK|>"


def resolve_mask_token_id(tokenizer, embedding_rows: int, mask_token: str | None = None) -> int:
    """Id of the mask token, adding it to `tokenizer` if it has none.

    Args:
        tokenizer: an HF tokenizer; gains `mask_token` when it had none.
        embedding_rows: number of rows of the target's input embedding.
        mask_token: a token string to use (e.g. "<|reserved_special_token_0|>"); default:
            the tokenizer's mask token, else "<|MASK|>".
    """
    if mask_token is None and tokenizer.mask_token is not None:
        mask_token = tokenizer.mask_token
    mask_token = mask_token or DEFAULT_MASK_TOKEN
    token_id = tokenizer.convert_tokens_to_ids(mask_token)
    if token_id is None or token_id == tokenizer.unk_token_id:
        tokenizer.add_special_tokens({"mask_token": mask_token})
        token_id = tokenizer.convert_tokens_to_ids(mask_token)
    elif tokenizer.mask_token != mask_token:
        tokenizer.add_special_tokens({"mask_token": mask_token})
    if token_id >= embedding_rows:
        raise ConfigError(
            "drafter.mask_token",
            f"mask token {mask_token!r} got id {token_id}, but the target's embedding has only "
            f"{embedding_rows} rows; name an existing unused special token instead "
            "(e.g. drafter.mask_token='<|reserved_special_token_0|>' for Llama-3)",
        )
    return int(token_id)
