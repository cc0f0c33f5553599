"""Regenerated data is token-exact: every training row is what the target itself
generates, which re-encoding the decoded text does not give for a byte-level target."""

from __future__ import annotations

import json

import pytest
import torch

from dflash.data import (
    TOKEN_IDS,
    HFGenerator,
    RegenerateSettings,
    TokenizeSettings,
    prompt_token_ids,
    shard_paths,
    tokenize_conversations,
    tokenizer_fingerprint,
)
from dflash.data.datamodule import DFlashDataModule
from dflash.data.regenerate import regenerate
from dflash.target import TargetModel
from dflash.toy.tiny import build_tiny_target, byte_tokenizer, save_tiny_target

PROMPTS = ["Hi", "What is the capital of France?", "Write a poem about the sea.", "2+2?", "Tell me a story"]


def greedy_mismatches(model, rows) -> tuple[int, int]:
    """(response positions whose token is not the target's greedy argmax given the prefix,
    response positions) over tokenised `rows`."""
    mismatches = total = 0
    for index in range(len(rows)):
        row = rows[index]
        input_ids = torch.tensor([row["input_ids"]])
        with torch.no_grad():
            predicted = model(input_ids).logits[0].argmax(-1)
        targets = [p for p in range(1, len(row["input_ids"])) if row["loss_mask"][p]]
        assert row["loss_mask"][0] == 0
        total += len(targets)
        mismatches += sum(int(predicted[p - 1]) != row["input_ids"][p] for p in targets)
    return mismatches, total


@pytest.mark.parametrize("chat_template", [True, False])
def test_training_rows_are_exactly_what_the_target_generates(chat_template, tmp_path):
    model, tokenizer = build_tiny_target("qwen3", seed=0, chat_template=chat_template)
    target = TargetModel(model, tokenizer)
    rows = [{"messages": [{"role": "user", "content": p}]} for p in PROMPTS]
    # Batches of 2 with prompts of different lengths: left padding must not change the ids.
    settings = RegenerateSettings(batch_size=2, shard_size=3, max_new_tokens=24)
    out = regenerate(target, rows, str(tmp_path / "regenerated"), settings, progress=False)

    module = DFlashDataModule(out, tokenizer, TokenizeSettings(max_length=512), val_fraction=0.0)
    module.setup("fit")
    assert module.rows.counts["from_token_ids"] == len(PROMPTS) and module.rows.counts["from_text"] == 0
    for index, prompt in enumerate(rows):
        row = module.rows[index]
        prompt_length = row["loss_mask"].index(1)
        assert row["input_ids"][:prompt_length] == prompt_token_ids(tokenizer, prompt["messages"], False)
    mismatches, total = greedy_mismatches(model, module.rows)
    assert total >= len(PROMPTS) * 20 and mismatches == 0

    # The same shards without their ids go through decode -> encode, which for this
    # byte-level target (invalid UTF-8 becomes U+FFFD) is not what the target generated.
    conversations = []
    for path in shard_paths(out):
        with open(path) as handle:
            conversations += [{"messages": json.loads(line)["messages"]} for line in handle]
    from_text = tokenize_conversations(tokenizer, conversations, TokenizeSettings(max_length=512), progress=False)
    assert from_text.counts["from_text"] == len(PROMPTS) and from_text.counts["text_with_replacement_char"] > 0
    text_mismatches, text_total = greedy_mismatches(model, from_text)
    assert text_mismatches > text_total // 4


def test_response_ids_run_through_the_stop_token_without_padding():
    model, tokenizer = build_tiny_target("qwen3", seed=0, chat_template=True)
    prompts = [[{"role": "user", "content": p}] for p in PROMPTS[:2]]
    free = HFGenerator(TargetModel(model, tokenizer), max_new_tokens=12)(prompts)
    assert all(not answer.finished and len(answer.response_ids) == 12 for answer in free)
    # A stop token the first answer emits early and the second never does, so the batch
    # holds a stopped (then padded) row next to one cut at max_new_tokens.
    stop = next(t for t in free[0].response_ids[2:] if t not in free[1].response_ids and t != tokenizer.pad_token_id)
    model.generation_config.eos_token_id = [tokenizer.eos_token_id, stop]
    first, second = HFGenerator(TargetModel(model, tokenizer), max_new_tokens=12)(prompts)

    cut = free[0].response_ids.index(stop)
    assert first.response_ids == free[0].response_ids[: cut + 1] and first.finished
    assert first.num_tokens == cut + 1 < 12
    assert second.response_ids == free[1].response_ids and not second.finished
    for answer, prompt in zip((first, second), prompts):
        assert answer.prompt_ids == prompt_token_ids(tokenizer, prompt, False)


def test_fingerprint_names_the_vocabulary_and_template():
    tokenizer = byte_tokenizer(chat_template=True)
    fingerprint = tokenizer_fingerprint(tokenizer)
    assert fingerprint == tokenizer_fingerprint(byte_tokenizer(chat_template=True))
    tokenizer(["a", "bbb"], padding=True, truncation=True, max_length=2)  # leaves padding state behind
    assert tokenizer_fingerprint(tokenizer) == fingerprint
    assert tokenizer_fingerprint(byte_tokenizer(chat_template=False)) != fingerprint
    other_template = byte_tokenizer(chat_template=True)
    other_template.chat_template = other_template.chat_template.replace("\n", " ")
    assert tokenizer_fingerprint(other_template) != fingerprint
    more_tokens = byte_tokenizer(chat_template=True)
    more_tokens.add_tokens(["<|extra|>"], special_tokens=True)
    assert tokenizer_fingerprint(more_tokens) != fingerprint


def test_fingerprint_survives_save_and_reload(tmp_path):
    from transformers import AutoTokenizer

    save_tiny_target(str(tmp_path), chat_template=True)
    assert tokenizer_fingerprint(AutoTokenizer.from_pretrained(str(tmp_path))) == tokenizer_fingerprint(
        byte_tokenizer(chat_template=True)
    )


def test_regenerated_rows_and_manifest_carry_the_fingerprint(tmp_path):
    model, tokenizer = build_tiny_target("llama", seed=1)
    rows = [{"messages": [{"role": "user", "content": p}]} for p in PROMPTS[:2]]
    out = regenerate(TargetModel(model, tokenizer), rows, str(tmp_path), RegenerateSettings(max_new_tokens=4), progress=False)
    with open(tmp_path / "manifest.json") as handle:
        manifest = json.load(handle)
    assert manifest["tokenizer"] == {"fingerprint": tokenizer_fingerprint(tokenizer), "vocab_size": len(tokenizer)}
    with open(shard_paths(out)[0]) as handle:
        written = [json.loads(line) for line in handle]
    for row, prompt in zip(written, rows):
        record = row[TOKEN_IDS]
        assert record["tokenizer"] == manifest["tokenizer"]["fingerprint"]
        assert record["prompt"] == prompt_token_ids(tokenizer, prompt["messages"])
        assert 1 <= len(record["response"]) <= 4
