"""Tokenise conversations for drafter training, with a loss mask on response tokens.

A row becomes `{"input_ids": list[int], "loss_mask": list[int]}`: `loss_mask` is 1 on
the tokens of the assistant response(s) that are training targets (the response text
and its end-of-turn / EOS token), 0 on the prompt and template scaffolding. The layout
rules live in `dflash.data.chat`. Rows are truncated to `max_length` tokens; rows with
no response token left are dropped and counted.

Rows that carry the target's own token ids (`dflash.data.token_ids`) are used as they are:
`prompt + response`, loss on the response. Other rows are encoded from their text, and
`tokenize_conversations` warns, with counts, when such text cannot be the target's tokens.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np
from tqdm.auto import tqdm

from dflash.data.chat import (
    UnlocatableResponse,
    chat_pieces,
    check_chat_template,
    has_chat_template,
    plain_prompt_text,
    special_token_ids,
)
from dflash.data.sources import split_prompt
from dflash.data.token_ids import TOKEN_IDS, sequence_from_token_ids, tokenizer_fingerprint
from dflash.errors import require
from dflash.progress import bar_interval

log = logging.getLogger(__name__)

ASSISTANT_TURNS = ("last", "all")


@dataclass
class TokenizeSettings:
    """How conversations become training sequences: the `data` group's fields of these names
    (documented on `dflash.data.config.DataSpec`)."""

    max_length: int = 3072
    require_chat_template: bool = False
    enable_thinking: bool | None = False
    assistant_turns: str = "last"

    def validate(self, tokenizer, key: str = "data") -> None:
        """ConfigError (naming `key`.field) for bad values or a missing required template."""
        require(self.max_length >= 2, f"{key}.max_length", f"must be at least 2, got {self.max_length}")
        require(
            self.assistant_turns in ASSISTANT_TURNS,
            f"{key}.assistant_turns",
            f"unknown value {self.assistant_turns!r}; choose one of {list(ASSISTANT_TURNS)}",
        )
        check_chat_template(tokenizer, self.require_chat_template, f"{key}.require_chat_template")


def tokenize_conversation(tokenizer, messages: list[dict], settings: TokenizeSettings) -> dict | None:
    """One conversation as `{"input_ids": list[int], "loss_mask": list[int]}` (equal lengths,
    at most `settings.max_length`), or None when no response token survives truncation.

    Raises `UnlocatableResponse` when the chat template hides an assistant turn.
    """
    if has_chat_template(tokenizer):
        input_ids, loss_mask = [], []
        for text, is_response in chat_pieces(tokenizer, messages, settings.assistant_turns, settings.enable_thinking):
            ids = tokenizer(text, add_special_tokens=False)["input_ids"]
            input_ids += ids
            loss_mask += [int(is_response)] * len(ids)
    else:
        prompt, response = split_prompt(messages)
        if response is None:
            return None
        prompt_ids = tokenizer(plain_prompt_text(prompt))["input_ids"]
        response_ids = tokenizer(response, add_special_tokens=False)["input_ids"]
        if tokenizer.eos_token_id is not None:
            response_ids.append(tokenizer.eos_token_id)
        input_ids = prompt_ids + response_ids
        loss_mask = [0] * len(prompt_ids) + [1] * len(response_ids)
    input_ids, loss_mask = input_ids[: settings.max_length], loss_mask[: settings.max_length]
    if not any(loss_mask):
        return None
    return {"input_ids": input_ids, "loss_mask": loss_mask}


@dataclass
class TokenizedRows:
    """Tokenised rows stored flat: row i is `input_ids[offsets[i]:offsets[i+1]]`.

    input_ids: int32 (total_tokens,); loss_mask: uint8 (total_tokens,); offsets: int64 (rows + 1,).
    conversation_index: int64 (rows,), the input conversation each row came from.
    num_conversations: how many conversations were tokenised (kept + dropped).
    dropped: how many conversations were left out, by reason.
    counts: how conversations were tokenised: "from_token_ids" (the target's own ids),
        "from_text" (encoded from text), and among those from text, "text_not_token_exact"
        (text that cannot be the target's tokens), "text_with_replacement_char" (U+FFFD),
        "token_ids_of_other_tokenizer" and "token_ids_unused_for_all_turns".
    """

    input_ids: np.ndarray
    loss_mask: np.ndarray
    offsets: np.ndarray
    conversation_index: np.ndarray
    num_conversations: int
    dropped: dict[str, int] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, index: int) -> dict:
        start, stop = int(self.offsets[index]), int(self.offsets[index + 1])
        return {
            "input_ids": self.input_ids[start:stop].tolist(),
            "loss_mask": self.loss_mask[start:stop].tolist(),
        }

    def save(self, path: str) -> None:
        """Write to `path` (.npz) atomically."""
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        temporary = f"{path}.tmp.{os.getpid()}.npz"
        np.savez(
            temporary,
            input_ids=self.input_ids,
            loss_mask=self.loss_mask,
            offsets=self.offsets,
            conversation_index=self.conversation_index,
            num_conversations=np.int64(self.num_conversations),
            dropped_names=np.array(list(self.dropped), dtype=str),
            dropped_counts=np.array(list(self.dropped.values()), dtype=np.int64),
            count_names=np.array(list(self.counts), dtype=str),
            count_values=np.array(list(self.counts.values()), dtype=np.int64),
        )
        os.replace(temporary, path)

    @classmethod
    def load(cls, path: str) -> TokenizedRows:
        with np.load(path) as stored:
            dropped = dict(zip(stored["dropped_names"].tolist(), stored["dropped_counts"].tolist()))
            counts = dict(zip(stored["count_names"].tolist(), stored["count_values"].tolist()))
            return cls(
                stored["input_ids"],
                stored["loss_mask"],
                stored["offsets"],
                stored["conversation_index"],
                int(stored["num_conversations"]),
                dropped,
                counts,
            )


def tokenize_conversations(tokenizer, rows: Iterable[dict], settings: TokenizeSettings, progress: bool = True) -> TokenizedRows:
    """Tokenise rows `{"messages": [...]}` (optionally with the target's `"token_ids"`),
    a list or a stream (each row is turned into compact arrays at once); drop (and log
    the count of) rows with no response token left after truncation or whose response
    the template hides.

    A row's token ids are used when their tokenizer fingerprint is this tokenizer's and
    only the last assistant turn is trained (ids cover the regenerated turn only);
    otherwise the row is encoded from its text, with a warning once per call.
    """
    fingerprint = tokenizer_fingerprint(tokenizer)
    special = special_token_ids(tokenizer)
    all_turns = settings.assistant_turns == "all" and has_chat_template(tokenizer)
    pieces_ids, pieces_mask, lengths, kept = [], [], [], []
    dropped = {"no_response_tokens": 0, "unlocatable_response": 0}
    counts = dict.fromkeys(_COUNT_NAMES, 0)
    num_conversations = 0
    bar = tqdm(rows, desc="tokenise", unit="row", disable=not progress, mininterval=bar_interval(terminal_s=2.0))
    for index, row in enumerate(bar):
        num_conversations += 1
        record = row.get(TOKEN_IDS)
        if record and record.get("tokenizer") == fingerprint and not all_turns:
            counts["from_token_ids"] += 1
            tokenized = sequence_from_token_ids(record, settings.max_length)
        else:
            if record:
                counts["token_ids_unused_for_all_turns" if all_turns else "token_ids_of_other_tokenizer"] += 1
            counts["from_text"] += 1
            _check_text_is_token_exact(tokenizer, row["messages"], special, counts)
            try:
                tokenized = tokenize_conversation(tokenizer, row["messages"], settings)
            except UnlocatableResponse:
                dropped["unlocatable_response"] += 1
                continue
        if tokenized is None:
            dropped["no_response_tokens"] += 1
            continue
        pieces_ids.append(np.asarray(tokenized["input_ids"], dtype=np.int32))
        pieces_mask.append(np.asarray(tokenized["loss_mask"], dtype=np.uint8))
        lengths.append(len(tokenized["input_ids"]))
        kept.append(index)
    dropped = {reason: count for reason, count in dropped.items() if count}
    if dropped:
        log.warning("tokenise: dropped %d of %d conversations (%s)", sum(dropped.values()), num_conversations, dropped)
    _log_counts(counts, fingerprint)
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return TokenizedRows(
        input_ids=np.concatenate(pieces_ids) if pieces_ids else np.zeros(0, dtype=np.int32),
        loss_mask=np.concatenate(pieces_mask) if pieces_mask else np.zeros(0, dtype=np.uint8),
        offsets=offsets,
        conversation_index=np.asarray(kept, dtype=np.int64),
        num_conversations=num_conversations,
        dropped=dropped,
        counts=counts,
    )


_COUNT_NAMES = (
    "from_token_ids",
    "from_text",
    "text_not_token_exact",
    "text_with_replacement_char",
    "token_ids_of_other_tokenizer",
    "token_ids_unused_for_all_turns",
)


def _check_text_is_token_exact(tokenizer, messages: list[dict], special: set[int], counts: dict) -> None:
    """Count a final response whose text cannot be the tokens a model emitted: it holds
    U+FFFD (bytes that were not valid UTF-8 were lost in decoding), encodes to special
    tokens (they were stripped from, or never were, generated text), or does not survive
    decode(encode(text))."""
    _, response = split_prompt(messages)
    if response is None:
        return
    ids = tokenizer(response, add_special_tokens=False)["input_ids"]
    replacement = "\ufffd" in response
    counts["text_with_replacement_char"] += replacement
    counts["text_not_token_exact"] += (
        replacement
        or any(token in special for token in ids)
        or tokenizer.decode(ids, clean_up_tokenization_spaces=False) != response
    )


def _log_counts(counts: dict, fingerprint: str) -> None:
    log.info("tokenise: %d rows from the target's token ids, %d from text", counts["from_token_ids"], counts["from_text"])
    if counts["token_ids_of_other_tokenizer"]:
        log.warning(
            "tokenise: %d rows carry token ids of another tokenizer than this one (fingerprint %s) and are "
            "encoded from their text instead",
            counts["token_ids_of_other_tokenizer"],
            fingerprint,
        )
    if counts["token_ids_unused_for_all_turns"]:
        log.warning(
            "tokenise: assistant_turns=all encodes %d rows from text although they carry the target's token ids "
            "(the ids cover only the last turn); use assistant_turns=last to train on the exact tokens",
            counts["token_ids_unused_for_all_turns"],
        )
    if counts["text_not_token_exact"]:
        log.warning(
            "tokenise: %d of %d responses encoded from text cannot be the tokens the target produced (%d contain "
            "U+FFFD from invalid UTF-8; others hold special tokens or change under decode(encode(text))); "
            "regenerate with the HF target (not a server) to keep its exact token ids",
            counts["text_not_token_exact"],
            counts["from_text"],
            counts["text_with_replacement_char"],
        )
