"""Drafting over a drafter's draft vocabulary (`DFlashDrafter.draft_vocab`): the logits of its
tokens are the head's, every other token is -inf, decoding stays lossless, and a damaged
draft_vocab.json or `drafter.draft_vocab=false` is handled as the user would expect."""

from __future__ import annotations

import pytest
import torch

from dflash.decoding import generate
from dflash.dflash.proposer import DFlashProposer
from dflash.drafter import DFlashDrafter, DrafterConfig, load_drafter, resolve_mask_token_id, save_drafter
from dflash.errors import ConfigError
from dflash.layout import DRAFT_VOCAB_FILE
from dflash.specs import DrafterSpec, build_drafter
from dflash.target import TargetModel
from dflash.toy.tiny import build_tiny_target


@pytest.fixture(scope="module", params=["auto", "eager"])
def target(request) -> TargetModel:
    # widths in multiples of 64: the shapes the fast engine's kernels take ("auto" runs them)
    model, tokenizer = build_tiny_target("qwen3", seed=0, hidden_size=256, num_heads=4, num_kv_heads=2, intermediate_size=384)
    return TargetModel(model, tokenizer, engine=request.param)


def _drafter(target: TargetModel) -> DFlashDrafter:
    torch.manual_seed(1)
    mask_id = resolve_mask_token_id(target.tokenizer, target.embedding_rows)
    config = DrafterConfig.from_target(target.config, num_layers=2, block_size=4, mask_token_id=mask_id)
    return DFlashDrafter(config).eval()


def test_the_vocabularys_logits_are_the_heads_and_the_rest_minus_infinity(target):
    ids = torch.arange(1, target.embedding_rows, 3)
    hidden = torch.randn(3, target.hidden_size, generator=torch.Generator().manual_seed(0))
    target.new_cache()  # prepares the fast engine, as decoding does
    with torch.inference_mode():
        full, over = target.draft_logits(hidden), target.draft_logits_over(ids)(hidden)
    assert over.shape == full.shape
    outside = torch.ones(full.shape[-1], dtype=torch.bool)
    outside[ids] = False
    assert torch.isneginf(over[:, outside]).all()
    assert torch.allclose(over[:, ids], full[:, ids], rtol=0, atol=1e-5 * float(full.abs().max()))
    assert target.draft_logits_over(None) == target.draft_logits


def test_a_bfloat16_target_drafts_over_its_vocabulary_on_the_engines_kernels(monkeypatch):
    """A bfloat16 target's proposals read the vocabulary's rows through the engine's tuned
    draft head, as a float32 target's do (not torch's linear over the gathered rows)."""
    model, tokenizer = build_tiny_target("qwen3", seed=0, hidden_size=256, num_heads=4, num_kv_heads=2, intermediate_size=384)
    target = TargetModel(model.to(torch.bfloat16), tokenizer, engine="auto")
    if target.fast is None:
        pytest.skip("the fast engine does not run on this machine")
    target.new_cache()
    heads = []
    draft_head = target.fast.draft_head
    monkeypatch.setattr(target.fast, "draft_head", lambda rows=None: heads.append(rows) or draft_head(rows))
    ids = torch.arange(1, target.embedding_rows, 3)
    over = target.draft_logits_over(ids)
    assert len(heads) == 1 and torch.equal(heads[0], target.head_rows_of(ids))
    hidden = torch.randn(3, target.hidden_size, generator=torch.Generator().manual_seed(0)).bfloat16()
    with torch.inference_mode():
        drafted, exact = over(hidden)[:, ids], target.logits(hidden, head_rows=target.head_rows_of(ids))
    assert torch.allclose(drafted, exact, rtol=0, atol=0.02 * float(exact.abs().max()))


def test_decoding_drafts_inside_the_vocabulary_and_stays_lossless(target):
    drafter = _drafter(target)
    drafter.draft_vocab = ids = torch.arange(0, target.embedding_rows, 2)
    over = target.draft_logits_over(drafter.draft_vocab)
    proposed = []

    def logits(hidden):
        proposed.append(over(hidden).argmax(-1))
        return over(hidden)

    prompt = torch.randint(0, 256, (1, 12), generator=torch.Generator().manual_seed(3))
    plain = generate(target, prompt, max_new_tokens=40).output_ids
    proposer = DFlashProposer(drafter, target.embed, logits, target.draft_dtype)
    assert generate(target, prompt, max_new_tokens=40, block_size=4, proposer=proposer).output_ids == plain
    drafted = torch.cat(proposed)
    assert drafted.numel() > 0 and torch.isin(drafted, ids).all()


def test_a_damaged_vocabulary_is_one_line_and_false_drafts_over_everything(target, tmp_path):
    drafter = _drafter(target)
    drafter.draft_vocab = torch.tensor([2, 5, 9])
    save_drafter(drafter, str(tmp_path))
    assert torch.equal(build_drafter(DrafterSpec(path=str(tmp_path)), target).draft_vocab, drafter.draft_vocab)
    assert build_drafter(DrafterSpec(path=str(tmp_path), draft_vocab=False), target).draft_vocab is None
    for text in ('{"token_ids": [5, 2]}', '{"token_ids": [1, 99999999]}', '{"token_ids": []}', "[1, 2]", "{not json"):
        (tmp_path / DRAFT_VOCAB_FILE).write_text(text)
        with pytest.raises(ConfigError, match=DRAFT_VOCAB_FILE) as err:
            load_drafter(str(tmp_path))
        assert err.value.key == "path" and "\n" not in str(err.value)
