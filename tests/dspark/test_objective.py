"""DSpark's objective (dflash/dspark/objective.py): training equals decoding through the heads
(docs/design.md invariant 6), a zero-headed CE-only DSpark loss is DFlash's, and the heads train."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import dflash.dspark.objective as objective
from dflash.decoding import SamplingConfig
from dflash.dspark.proposer import DSparkProposer
from dflash.methods import METHODS
from dflash.specs import DrafterSpec, TargetSpec
from dflash.training import TrainingSettings
from dflash.training.anchors import Anchors
from dflash.training.blocks import build_blocks
from dflash.training.forward import draft_blocks, target_features
from helpers.decoding import PROMPTS, dspark_drafter
from helpers.training import batch, training_module

BLOCK = 6
SAMPLING = SamplingConfig(temperature=1.0)


def teacher_forced(target, drafter, sequence, anchor):
    """Training path on `sequence` (1, S) with one block at `anchor`: (B-1, V) biased logits and
    (B-1,) confidence probabilities of slots 1..B-1."""
    anchors = Anchors(positions=torch.tensor([[anchor]]), valid=torch.tensor([[True]]))
    real = torch.ones_like(sequence, dtype=torch.bool)
    blocks = build_blocks(sequence, real, anchors, BLOCK, drafter.config.mask_token_id)
    with torch.no_grad():
        features = target_features(target, sequence, drafter.config.target_layer_ids)
        hidden = draft_blocks(drafter, target.embed, features, real, anchors, blocks)[0, 1:]
        prev = objective.previous_tokens(blocks.labels)[0, 1:]
        logits, embedded = objective.biased_logits(drafter, target.logits, hidden, prev)
        return logits, torch.sigmoid(drafter.confidence_head(hidden, embedded))


def test_teacher_forced_heads_equal_the_proposers_on_its_own_drafts(qwen3_target):
    """The proposer samples a block; on the text [prefix, drafts] the training path's biased
    distributions are the ones the proposer recorded, and its confidences put the cut where the
    proposer cuts at every threshold."""
    target, anchor = qwen3_target, 20
    drafter = dspark_drafter(target, rank=8, block_size=BLOCK, markov_scale=1.0, confidence_scale=0.3)
    ids = target.tokenizer(PROMPTS[3], return_tensors="pt").input_ids[:, : anchor + 1]
    with torch.no_grad():
        context = target_features(target, ids[:, :anchor], drafter.config.target_layer_ids)

    def draft(threshold):
        proposer = DSparkProposer(drafter, target.embed, target.logits, confidence_threshold=threshold)
        return proposer.draft(ids, context, BLOCK, BLOCK - 1, SAMPLING, torch.Generator().manual_seed(0))

    drafts = draft(0.0)
    assert drafts.tokens.numel() == BLOCK - 1
    logits, confidence = teacher_forced(target, drafter, torch.cat([ids, drafts.tokens[None]], dim=1), anchor)
    torch.testing.assert_close(logits.softmax(-1), drafts.probs, atol=1e-5, rtol=1e-4)
    assert confidence.min() < confidence.max()
    for threshold in confidence.tolist():
        cut = next(i for i, c in enumerate(confidence.tolist()) if c < threshold + 1e-6)
        assert draft(threshold + 1e-6).tokens.tolist() == drafts.tokens[:cut].tolist()


def test_the_comparison_catches_a_previous_token_one_slot_off(qwen3_target, monkeypatch):
    """Seeded bug: slot k keyed on its own label instead of slot k - 1's."""
    monkeypatch.setattr(objective, "previous_tokens", lambda labels: labels)
    with pytest.raises(AssertionError):
        test_teacher_forced_heads_equal_the_proposers_on_its_own_drafts(qwen3_target)


def dspark_module(tmp_path, **settings):
    training = TrainingSettings(num_anchors=4, loss_chunk_rows=settings.pop("chunk_rows", 256))
    spec = TargetSpec(path=str(tmp_path / "target"), build={"arch": "qwen3"})
    method = METHODS["dspark"].train_settings(markov_rank=8, **settings)
    return training_module(spec, "dspark", method, DrafterSpec(num_layers=1, block_size=4), training)


def test_zero_heads_and_ce_alone_give_dflashs_loss(tmp_path):
    module = dspark_module(tmp_path, ce_alpha=1.0, tv_alpha=0.0, confidence_head=False)
    dflash = METHODS["dflash"].build_objective(
        module.target, None, DrafterSpec(num_layers=1, block_size=4), module.objective.training
    )
    dflash.drafter.load_state_dict(module.drafter.state_dict(), strict=False)
    data = batch()
    results = [
        o.loss(module.target, data, module_states(module, o, data), torch.Generator().manual_seed(0), True)
        for o in (module.objective, dflash)
    ]
    torch.testing.assert_close(results[0].weighted_sum, results[1].weighted_sum)
    assert torch.equal(results[0].correct, results[1].correct)


def module_states(module, objective_, data):
    with torch.no_grad():
        return target_features(module.target, data["input_ids"], objective_.taps())


def test_the_heads_train_and_chunking_changes_nothing(tmp_path):
    grads = []
    for chunk_rows in (None, 5):
        module = dspark_module(tmp_path, chunk_rows=chunk_rows)
        with torch.no_grad():
            module.drafter.markov_head.markov_w2.weight.normal_(std=0.1, generator=torch.Generator().manual_seed(1))
        data = batch()
        result = module.objective.loss(
            module.target, data, module_states(module, module.objective, data), torch.Generator().manual_seed(0), True
        )
        result.weighted_sum.backward()
        grads.append({name: p.grad.clone() for name, p in module.drafter.named_parameters() if p.grad is not None})
    heads = {
        "markov_head.markov_w1.weight",
        "markov_head.markov_w2.weight",
        "confidence_head.proj.weight",
        "confidence_head.proj.bias",
    }
    assert heads <= set(grads[0]) and all(grads[0][name].abs().sum() > 0 for name in heads)
    assert grads[0].keys() == grads[1].keys()
    for name in grads[0]:
        torch.testing.assert_close(grads[0][name], grads[1][name], atol=1e-6, rtol=1e-4)


def test_dspark_settings_are_one_line_errors():
    from dflash.errors import ConfigError

    Settings = METHODS["dspark"].train_settings
    for change, key in [
        ({"markov_rank": 0}, "markov_rank"),
        ({"tv_alpha": -1.0}, "tv_alpha"),
        ({"ce_alpha": 0.0, "tv_alpha": 0.0}, "ce_alpha"),
    ]:
        with pytest.raises(ConfigError) as info:
            Settings(**change)
        assert info.value.key == key
    assert dataclasses.asdict(Settings())["markov_rank"] == 256


@pytest.mark.parametrize(
    "change, key",
    [
        ({"loss": "kl"}, "training.loss"),
        ({"agreement_mask": True, "loss": "kl"}, "training.agreement_mask"),
        ({"draft_vocab_size": 64}, "training.draft_vocab_size"),
    ],
)
def test_training_settings_dspark_does_not_read_are_refused(change, key):
    from dflash.data.config import DataSpec
    from dflash.errors import ConfigError

    method = METHODS["dspark"]
    with pytest.raises(ConfigError) as info:
        method.check_training(
            method.train_settings(), DrafterSpec(block_size=4), DataSpec(path="unused"), TrainingSettings(**change)
        )
    assert info.value.key == key


def test_init_from_copies_a_dspark_directorys_heads_and_a_dflash_directorys_layers(tmp_path):
    from dflash.drafter import save_drafter
    from dflash.errors import ConfigError

    source = dspark_module(tmp_path).drafter
    with torch.no_grad():
        source.markov_head.markov_w2.weight.normal_(generator=torch.Generator().manual_seed(2))
    save_drafter(source, str(tmp_path / "dspark"))
    dflash = METHODS["dflash"].build_objective(
        dspark_module(tmp_path).target, None, DrafterSpec(num_layers=1, block_size=4), TrainingSettings()
    )
    save_drafter(dflash.drafter, str(tmp_path / "dflash"))

    def started_from(directory, rank=8):
        training = TrainingSettings(num_anchors=4)
        spec = TargetSpec(path=str(tmp_path / "target"), build={"arch": "qwen3"})
        drafter = DrafterSpec(num_layers=1, block_size=4, seed=5, init_from=str(tmp_path / directory))
        method = METHODS["dspark"].train_settings(markov_rank=rank)
        return training_module(spec, "dspark", method, drafter, training).drafter.state_dict()

    for name, tensor in started_from("dspark").items():
        assert torch.equal(tensor, source.state_dict()[name]), name
    from_dflash = started_from("dflash")
    assert all(torch.equal(from_dflash[name], tensor) for name, tensor in dflash.drafter.state_dict().items())
    assert not from_dflash["markov_head.markov_w2.weight"].any()  # its new Markov head
    with pytest.raises(ConfigError, match="set method.markov_rank=8") as info:
        started_from("dspark", rank=4)
    assert info.value.key == "drafter.init_from"


def test_the_loss_is_deepspecs_written_out(tmp_path):
    """0.1 CE + 0.9 |p_d - p_t|_1 + 1.0 BCE(conf, 1 - |p_d - p_t|_1 / 2) per valid slot, weighted
    by slot (gamma), with p_d from the hidden state plus w2 w1[the data token before the slot]."""
    module = dspark_module(tmp_path, chunk_rows=None)
    objective_, target, drafter = module.objective, module.target, module.drafter
    with torch.no_grad():
        drafter.markov_head.markov_w2.weight.normal_(std=0.3, generator=torch.Generator().manual_seed(1))
        data = batch()
        states = module_states(module, objective_, data)
        result = objective_.loss(target, data, states, torch.Generator().manual_seed(0), True)
        blocks, hidden, final = objective_.drafted_blocks(target, data, states, torch.Generator().manual_seed(0))
    expected, weights = 0.0, objective_.loss_settings.static_weights()
    for b, j in blocks.label_valid.nonzero().tolist():
        prev, label, slot = int(blocks.labels[b, j - 1]), int(blocks.labels[b, j]), int(blocks.slots[j])
        w1, w2 = drafter.markov_head.markov_w1.weight[prev], drafter.markov_head.markov_w2.weight
        p_draft = (target.logits(hidden[b, j]) + w2 @ w1).softmax(-1)
        p_target = target.logits(final[b, blocks.positions[b, j] - 1]).softmax(-1)
        l1 = (p_draft - p_target).abs().sum()
        conf = torch.sigmoid(drafter.confidence_head.proj(torch.cat([hidden[b, j], w1])))[0]
        c = 1 - l1 / 2
        bce = -(c * torch.log(conf) + (1 - c) * torch.log(1 - conf))
        expected += weights[slot] * (0.1 * -p_draft[label].log() + 0.9 * l1 + 1.0 * bce)
    torch.testing.assert_close(result.weighted_sum, expected.detach(), rtol=1e-4, atol=1e-5)
