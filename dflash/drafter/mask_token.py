"""The `<mask>` token that fills block slots 1..B-1.

Its id must index a row of the target's embedding: the drafter embeds block tokens
with the target's frozen `embed_tokens`. Qwen's embedding has spare rows beyond the
tokenizer's vocabulary, so adding `<|MASK|>` lands on one. Many real targets have none
(SmolLM2, Llama-3): then, unless the user names a token, an existing special token the
target never emits is chosen (`unused_special_token`) and a log line says which; the
drafter directory records its id and string, so training, export and serving agree
(docs/design.md invariant 7).
"""

from __future__ import annotations

import logging

from dflash.errors import ConfigError

log = logging.getLogger(__name__)

DEFAULT_MASK_TOKEN = "<|MASK|>"
# Names of special tokens that tokenizers set aside for later use (Llama-3, Gemma, ...).
_RESERVED_MARKERS = ("reserved", "unused")


def resolve_mask_token_id(tokenizer, embedding_rows: int, mask_token: str | None = None) -> int:
    """Id of the mask token; `tokenizer.mask_token` is set to it.

    Args:
        tokenizer: an HF tokenizer; gains `mask_token` when it had none.
        embedding_rows: number of rows of the target's input embedding.
        mask_token: a token string to use (e.g. "<|reserved_special_token_0|>"); default:
            the tokenizer's mask token; else "<|MASK|>" added when the embedding has a
            row for a new token; else an unused special token of the tokenizer.
    """
    if mask_token is None and tokenizer.mask_token is not None:
        mask_token = tokenizer.mask_token
    if mask_token is None:
        if len(tokenizer) >= embedding_rows:  # no spare row for a new token
            mask_token = unused_special_token(tokenizer, embedding_rows)
            if mask_token is None:
                raise ConfigError(
                    "mask_token",
                    f"the target's embedding has no spare row ({embedding_rows} rows, {len(tokenizer)} tokens) and "
                    "its tokenizer has no unused special token; name one with drafter.mask_token=TOKEN",
                )
            log.info(
                "mask token: %r (id %d), an unused special token: the target's embedding has no spare row",
                mask_token,
                tokenizer.convert_tokens_to_ids(mask_token),
            )
        else:
            mask_token = DEFAULT_MASK_TOKEN
    token_id = tokenizer.convert_tokens_to_ids(mask_token)
    if token_id is None or token_id == tokenizer.unk_token_id:
        tokenizer.add_special_tokens({"mask_token": mask_token})
        token_id = tokenizer.convert_tokens_to_ids(mask_token)
    elif tokenizer.mask_token != mask_token:
        tokenizer.add_special_tokens({"mask_token": mask_token})
    if token_id >= embedding_rows:
        raise ConfigError(
            "mask_token",
            f"mask token {mask_token!r} got id {token_id}, but the target's embedding has only "
            f"{embedding_rows} rows; name an existing unused special token instead "
            "(e.g. drafter.mask_token='<|reserved_special_token_0|>' for Llama-3), or leave it unset to pick one",
        )
    return int(token_id)


def unused_special_token(tokenizer, embedding_rows: int) -> str | None:
    """A special token of `tokenizer` that chat never produces, or None.

    Candidates are the tokenizer's special added tokens with an embedding row, minus
    those with a role (bos, eos, pad, unk, ...) and those its chat template writes. A
    token named as reserved or unused (Llama-3's `<|reserved_special_token_0|>`) is
    preferred, lowest id first; otherwise the candidate with the highest id (legacy
    tokens sit after the ones in use: SmolLM2's StarCoder-era `<empty_output>`, id 16).
    """
    decoder = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    with_role = set(tokenizer.all_special_ids)
    template = tokenizer.chat_template if isinstance(tokenizer.chat_template, str) else ""
    candidates = sorted(
        (token_id, token.content)
        for token_id, token in decoder.items()
        if token.special and token_id < embedding_rows and token_id not in with_role and token.content not in template
    )
    if not candidates:
        return None
    reserved = [content for _, content in candidates if any(m in content.lower() for m in _RESERVED_MARKERS)]
    return reserved[0] if reserved else candidates[-1][1]
