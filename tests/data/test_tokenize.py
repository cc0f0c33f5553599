"""Loss masks cover exactly the response (+ end-of-turn token), the training layout of
the prompt equals the layout used to prompt the target, and rows carrying the target's
token ids are used as they are (text only as the fallback)."""

from __future__ import annotations

import logging

import pytest

from dflash.data import TokenizeSettings, prompt_token_ids, tokenize_conversation, tokenize_conversations
from dflash.data.chat import UnlocatableResponse, end_of_turn_token_id
from dflash.data.token_ids import token_ids_record, tokenizer_fingerprint
from dflash.errors import ConfigError
from dflash.toy.tiny import byte_tokenizer

CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello!"},
    {"role": "user", "content": "2+2?"},
    {"role": "assistant", "content": "It is 4."},
]

# Qwen3-like: the generation prompt of non-thinking mode opens an empty think block, the
# final assistant turn is rendered with that block, earlier turns without it.
QWEN3_LIKE_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['role'] == 'assistant' and loop.last %}<think>\n\n</think>\n\n{% endif %}"
    "{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}{% endif %}"
)


def masked_text(tokenizer, row) -> str:
    return tokenizer.decode([t for t, m in zip(row["input_ids"], row["loss_mask"]) if m])


def test_chatml_mask_is_the_last_answer_and_its_end_of_turn():
    tokenizer = byte_tokenizer(chat_template=True)
    row = tokenize_conversation(tokenizer, CONVERSATION, TokenizeSettings())
    assert masked_text(tokenizer, row) == "It is 4.<|im_end|>"
    assert len(row["input_ids"]) == len(row["loss_mask"])
    # The masked tokens are one contiguous run at the end: the newline the template writes
    # after <|im_end|> is not part of the sequence (the target stops at <|im_end|>).
    first = row["loss_mask"].index(1)
    assert all(row["loss_mask"][first:]) and not any(row["loss_mask"][:first])
    assert tokenizer.decode(row["input_ids"]).endswith("<|im_start|>assistant\nIt is 4.<|im_end|>")


def test_chatml_mask_on_all_assistant_turns():
    tokenizer = byte_tokenizer(chat_template=True)
    row = tokenize_conversation(tokenizer, CONVERSATION, TokenizeSettings(assistant_turns="all"))
    assert masked_text(tokenizer, row) == "Hello!<|im_end|>It is 4.<|im_end|>"
    decoded = tokenizer.decode(row["input_ids"])
    assert "Hello!<|im_end|>\n<|im_start|>user\n2+2?" in decoded  # prompt text between turns is kept


def test_plain_text_mask_is_response_and_eos():
    tokenizer = byte_tokenizer()
    row = tokenize_conversation(tokenizer, CONVERSATION, TokenizeSettings())
    assert masked_text(tokenizer, row) == "It is 4.<|endoftext|>"
    assert tokenizer.decode(row["input_ids"]) == "Be brief.\n\nHi\n\nHello!\n\n2+2?It is 4.<|endoftext|>"
    assert row["input_ids"][-1] == tokenizer.eos_token_id and row["loss_mask"][-1] == 1


@pytest.mark.parametrize("chat_template", [True, False])
def test_training_prompt_equals_the_prompt_the_target_answers(chat_template):
    tokenizer = byte_tokenizer(chat_template=chat_template)
    row = tokenize_conversation(tokenizer, CONVERSATION, TokenizeSettings())
    prompt_length = row["loss_mask"].index(1)
    assert row["input_ids"][:prompt_length] == prompt_token_ids(tokenizer, CONVERSATION[:-1])


def test_thinking_block_of_the_generation_prompt_stays_in_the_prompt():
    tokenizer = byte_tokenizer(chat_template=True)
    tokenizer.chat_template = QWEN3_LIKE_TEMPLATE
    row = tokenize_conversation(tokenizer, CONVERSATION, TokenizeSettings(enable_thinking=False))
    assert masked_text(tokenizer, row) == "It is 4.<|im_end|>"
    prompt_length = row["loss_mask"].index(1)
    prompt = prompt_token_ids(tokenizer, CONVERSATION[:-1], enable_thinking=False)
    assert row["input_ids"][:prompt_length] == prompt
    assert tokenizer.decode(prompt).endswith("<think>\n\n</think>\n\n")


def test_earlier_turns_rendered_differently_are_still_found():
    tokenizer = byte_tokenizer(chat_template=True)
    tokenizer.chat_template = QWEN3_LIKE_TEMPLATE
    row = tokenize_conversation(tokenizer, CONVERSATION, TokenizeSettings(assistant_turns="all", enable_thinking=False))
    assert masked_text(tokenizer, row) == "Hello!<|im_end|>It is 4.<|im_end|>"


def test_template_that_rewrites_a_past_turn_is_reported():
    tokenizer = byte_tokenizer(chat_template=True)
    tokenizer.chat_template = QWEN3_LIKE_TEMPLATE.replace(
        "{{ message['content'] }}", "{{ message['content'] if loop.last else message['content'] | upper }}"
    )
    with pytest.raises(UnlocatableResponse):
        tokenize_conversation(tokenizer, CONVERSATION, TokenizeSettings(assistant_turns="all"))


def test_end_of_turn_token():
    chat = byte_tokenizer(chat_template=True)
    assert end_of_turn_token_id(chat) == chat.convert_tokens_to_ids("<|im_end|>")
    assert end_of_turn_token_id(byte_tokenizer()) is None


def test_truncation_and_dropped_rows_are_counted():
    tokenizer = byte_tokenizer(chat_template=True)
    short = [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "A" * 50}]
    long_prompt = [{"role": "user", "content": "Q" * 200}, {"role": "assistant", "content": "A"}]
    prompt_only = [{"role": "user", "content": "Q"}]
    settings = TokenizeSettings(max_length=40)
    row = tokenize_conversation(tokenizer, short, settings)
    assert len(row["input_ids"]) == 40 and row["loss_mask"][-1] == 1
    rows = tokenize_conversations(
        tokenizer, [{"messages": m} for m in (short, long_prompt, prompt_only, short)], settings, progress=False
    )
    assert len(rows) == 2 and rows.num_conversations == 4
    assert rows.conversation_index.tolist() == [0, 3]
    assert rows.dropped == {"no_response_tokens": 2}
    assert rows[1] == row


def test_tokenized_rows_round_trip(tmp_path):
    tokenizer = byte_tokenizer(chat_template=True)
    rows = tokenize_conversations(tokenizer, [{"messages": CONVERSATION}] * 3, TokenizeSettings(), progress=False)
    rows.save(str(tmp_path / "cache.npz"))
    loaded = type(rows).load(str(tmp_path / "cache.npz"))
    assert [loaded[i] for i in range(3)] == [rows[i] for i in range(3)]
    assert loaded.num_conversations == 3 and loaded.dropped == rows.dropped and loaded.counts == rows.counts


def test_bad_settings_name_their_keys():
    with pytest.raises(ConfigError) as err:
        TokenizeSettings(require_chat_template=True).validate(byte_tokenizer())
    assert err.value.key == "data.require_chat_template"
    TokenizeSettings(require_chat_template=True).validate(byte_tokenizer(chat_template=True))
    with pytest.raises(ConfigError) as err:
        TokenizeSettings(max_length=1).validate(byte_tokenizer())
    assert err.value.key == "data.max_length"
    with pytest.raises(ConfigError) as err:
        TokenizeSettings(assistant_turns="first").validate(byte_tokenizer())
    assert err.value.key == "data.assistant_turns"


def with_ids(messages, prompt, response, fingerprint):
    return {"messages": messages, "token_ids": token_ids_record(prompt, response, fingerprint)}


def test_token_ids_are_used_as_they_are_and_truncated():
    tokenizer = byte_tokenizer(chat_template=True)
    fingerprint = tokenizer_fingerprint(tokenizer)
    messages = CONVERSATION[-2:]  # the text says something else: the ids win
    # 265 is beyond the tokenizer but inside the embedding: a target may emit it, so it stays.
    rows = [
        with_ids(messages, [1, 2, 3], [250, 251, 265], fingerprint),
        with_ids(messages, [1, 2, 3, 4, 5, 6], [7], fingerprint),  # truncation leaves no response
        with_ids(messages, [1, 2], [], fingerprint),  # nothing generated
    ]
    full = tokenize_conversations(tokenizer, rows[:1], TokenizeSettings(), progress=False)
    assert full[0] == {"input_ids": [1, 2, 3, 250, 251, 265], "loss_mask": [0, 0, 0, 1, 1, 1]}
    cut = tokenize_conversations(tokenizer, rows, TokenizeSettings(max_length=5), progress=False)
    assert len(cut) == 1 and cut[0] == {"input_ids": [1, 2, 3, 250, 251], "loss_mask": [0, 0, 0, 1, 1]}
    assert cut.dropped == {"no_response_tokens": 2}
    assert cut.counts["from_token_ids"] == 3 and cut.counts["from_text"] == 0


def test_rows_without_ids_or_with_another_tokenizers_ids_use_the_text(caplog):
    tokenizer = byte_tokenizer(chat_template=True)
    from_text = tokenize_conversation(tokenizer, CONVERSATION, TokenizeSettings())
    foreign = with_ids(CONVERSATION, [1, 2], [3], tokenizer_fingerprint(byte_tokenizer()))
    rows = [foreign, {"messages": CONVERSATION}, foreign, with_ids(CONVERSATION, [1, 2], [3], tokenizer_fingerprint(tokenizer))]
    with caplog.at_level(logging.WARNING, logger="dflash.data.tokenize"):
        result = tokenize_conversations(tokenizer, rows, TokenizeSettings(), progress=False)
    assert [result[i] for i in range(4)] == [from_text, from_text, from_text, {"input_ids": [1, 2, 3], "loss_mask": [0, 0, 1]}]
    assert result.counts["token_ids_of_other_tokenizer"] == 2 and result.counts["from_text"] == 3
    warnings = [r.getMessage() for r in caplog.records if "another tokenizer" in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].startswith("tokenise: 2 rows")


def test_all_assistant_turns_come_from_text_even_with_ids():
    tokenizer = byte_tokenizer(chat_template=True)
    row = with_ids(CONVERSATION, [1, 2], [3], tokenizer_fingerprint(tokenizer))
    result = tokenize_conversations(tokenizer, [row], TokenizeSettings(assistant_turns="all"), progress=False)
    assert result[0] == tokenize_conversation(tokenizer, CONVERSATION, TokenizeSettings(assistant_turns="all"))
    assert result.counts["token_ids_unused_for_all_turns"] == 1


def test_text_that_cannot_be_the_targets_tokens_is_counted(caplog):
    tokenizer = byte_tokenizer(chat_template=True)

    def answered(text):
        return {"messages": [{"role": "user", "content": "Q"}, {"role": "assistant", "content": text}]}

    rows = [answered("fine"), answered("bad \ufffd byte"), answered("early <|im_end|> end"), answered("also fine")]
    with caplog.at_level(logging.WARNING, logger="dflash.data.tokenize"):
        result = tokenize_conversations(tokenizer, rows, TokenizeSettings(), progress=False)
    assert result.counts["text_not_token_exact"] == 2 and result.counts["text_with_replacement_char"] == 1
    assert any(r.getMessage().startswith("tokenise: 2 of 4 responses encoded from text") for r in caplog.records)
