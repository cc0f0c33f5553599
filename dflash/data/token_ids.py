"""Token-exact regenerated data: the ids the target saw and produced, kept with each row.

Invariant: a row that carries `token_ids` holds exactly the ids the target was fed
(`prompt`, laid out by `dflash.data.chat.prompt_token_ids`) and exactly the ids it
generated (`response`: the new tokens, up to and including the stop token when
generation stopped on one, never padding). Training uses them as they are, because
decode -> encode is not the identity (invalid UTF-8 bytes, BPE re-merges, special tokens),
and a drafter trained on re-encoded text learns sequences the target never produced.

The ids mean something only under the tokenizer that made them, so the record names it
by `tokenizer_fingerprint`; rows made under another tokenizer fall back to their text.

Row layout: `{"messages": [...], "token_ids": {"tokenizer": FINGERPRINT, "prompt": [...],
"response": [...]}}`.
"""

from __future__ import annotations

import json

from dflash.fileio import json_digest

TOKEN_IDS = "token_ids"

# Runtime state a fast tokenizer carries in its serialisation (set by padding / truncation
# arguments of earlier calls) and the serialisation version: none of it changes what an id means.
_VOLATILE_BACKEND_KEYS = ("truncation", "padding", "version")


def tokenizer_fingerprint(tokenizer) -> str:
    """A 16-hex-digit hash of everything that gives token ids their meaning and lays out
    prompts: vocabulary, merges, added and special tokens, normaliser, pre-tokeniser,
    post-processor (BOS), decoder, and the chat template. Equal for a tokenizer and its
    saved-and-reloaded copy."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        state = json.loads(backend.to_str())
        for key in _VOLATILE_BACKEND_KEYS:
            state.pop(key, None)
    else:  # a Python (sentencepiece) tokenizer: its vocabulary and added tokens
        state = {
            "class": type(tokenizer).__name__,
            "vocab": sorted(tokenizer.get_vocab().items()),
            "added": sorted((i, str(t)) for i, t in tokenizer.added_tokens_decoder.items()),
        }
    state["chat_template"] = getattr(tokenizer, "chat_template", None)
    state["vocab_size"] = len(tokenizer)
    return json_digest(state, 16, ensure_ascii=False)


def tokenizer_manifest(tokenizer) -> dict:
    """What a regeneration manifest records about the tokenizer of its token ids."""
    return {"fingerprint": tokenizer_fingerprint(tokenizer), "vocab_size": len(tokenizer)}


def token_ids_record(prompt_ids: list[int], response_ids: list[int], fingerprint: str) -> dict:
    """The `token_ids` field of a regenerated row."""
    return {"tokenizer": fingerprint, "prompt": list(prompt_ids), "response": list(response_ids)}


def sequence_from_token_ids(record: dict, max_length: int) -> dict | None:
    """A training row `{"input_ids": prompt + response, "loss_mask": [0]*len(prompt) +
    [1]*len(response)}` cut to `max_length` tokens, or None when no response token is left."""
    prompt, response = list(record["prompt"]), list(record["response"])
    input_ids = (prompt + response)[:max_length]
    loss_mask = ([0] * len(prompt) + [1] * len(response))[:max_length]
    if not any(loss_mask):
        return None
    return {"input_ids": input_ids, "loss_mask": loss_mask}
