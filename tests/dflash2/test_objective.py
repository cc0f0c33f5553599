"""DFlash2's objective (dflash/dflash2/objective.py): training equals decoding for the selector
(docs/design.md invariant 6) with a seeded bug, the selector term written out, every DFlash2 part
trains, and the settings it refuses."""

from __future__ import annotations

import pytest
import torch

import dflash.dflash2.objective as objective
from dflash.decoding import SamplingConfig
from dflash.dflash2.proposer import DFlash2Proposer
from dflash.errors import ConfigError
from dflash.methods import METHODS
from dflash.specs import DrafterSpec, TargetSpec
from dflash.training import TrainingSettings
from dflash.training.anchors import Anchors
from dflash.training.blocks import build_blocks
from dflash.training.forward import draft_blocks, target_features
from helpers.decoding import PROMPTS, dflash2_drafter
from helpers.training import batch, training_module

BLOCK = 6


def teacher_forced_choices(target, drafter, sequence, anchor) -> list[int]:
    """Training path on `sequence` (1, S) with one block at `anchor`: the selector's teacher-forced
    choices of slots 1..B-1 (every row's label scored, so each choice is the selector's)."""
    anchors = Anchors(positions=torch.tensor([[anchor]]), valid=torch.tensor([[True]]))
    real = torch.ones_like(sequence, dtype=torch.bool)
    blocks = build_blocks(sequence, real, anchors, BLOCK, drafter.config.mask_token_id)
    with torch.no_grad():
        features = target_features(target, sequence, drafter.config.target_layer_ids)
        hidden = draft_blocks(drafter, target.embed, features, real, anchors, blocks)[0, 1:]
        prev = objective.previous_tokens(blocks.labels)[0, 1:]
        labels = blocks.labels[0, 1:]
        top = target.logits(hidden).float().topk(drafter.config.selector_top_k, dim=-1)
        _, correct = objective.selector_terms(
            drafter.candidate_selector, top.indices, top.values, hidden, prev, labels, target.logits_of
        )
    return correct.tolist()


def test_the_selectors_teacher_forced_choice_is_the_walks_on_its_own_drafts(qwen3_target):
    """The proposer walks a block (convolutions and selector random); on the text [prefix, drafts]
    the training path's choice at every slot is the draft."""
    target, anchor = qwen3_target, 20
    drafter = dflash2_drafter(target, block_size=BLOCK, scale=0.5)
    ids = target.tokenizer(PROMPTS[3], return_tensors="pt").input_ids[:, : anchor + 1]
    with torch.no_grad():
        context = target_features(target, ids[:, :anchor], drafter.config.target_layer_ids)
    proposer = DFlash2Proposer(drafter, target.embed, target.logits)
    drafts = proposer.draft(ids, context, BLOCK, BLOCK - 1, SamplingConfig(), None).tokens
    assert drafts.numel() == BLOCK - 1
    assert teacher_forced_choices(target, drafter, torch.cat([ids, drafts[None]], dim=1), anchor) == [True] * (BLOCK - 1)


def test_the_comparison_catches_a_predecessor_from_the_same_row(qwen3_target, monkeypatch):
    """Seeded bug: slot k scored after its own label instead of slot k - 1's."""
    monkeypatch.setattr(objective, "previous_tokens", lambda labels: labels)
    with pytest.raises(AssertionError):
        test_the_selectors_teacher_forced_choice_is_the_walks_on_its_own_drafts(qwen3_target)


def dflash2_module(tmp_path, chunk_rows=256, **settings):
    training = TrainingSettings(num_anchors=4, loss_chunk_rows=chunk_rows)
    spec = TargetSpec(path=str(tmp_path / "target"), build={"arch": "qwen3"})
    method = METHODS["dflash2"].train_settings(selector_rank=8, selector_top_k=4, **settings)
    return training_module(spec, "dflash2", method, DrafterSpec(num_layers=1, block_size=4), training)


def states_of(module, data):
    with torch.no_grad():
        return target_features(module.target, data["input_ids"], module.objective.taps())


def test_the_selector_term_written_out(tmp_path):
    """DFlash's loss on the same layers, plus alpha x the mean over valid slots of the CE over the
    top-K candidates (the data token in place of the K-th when missing), scored after the data
    token before the slot, the weights' sum as the denominator of BlockLoss.loss."""
    module = dflash2_module(tmp_path, chunk_rows=None, selector_alpha=0.7)
    drafter, target = module.drafter, module.target
    with torch.no_grad():
        drafter.candidate_selector.successor_codebook.normal_(generator=torch.Generator().manual_seed(1))
    dflash = METHODS["dflash"].build_objective(target, None, DrafterSpec(num_layers=1, block_size=4), module.objective.training)
    dflash.drafter.load_state_dict(drafter.state_dict(), strict=False)
    dflash.drafter.layers = drafter.layers  # the same convolving layers
    data = batch()
    states = states_of(module, data)
    ours, theirs = (o.loss(target, data, states, torch.Generator().manual_seed(0), True) for o in (module.objective, dflash))
    with torch.no_grad():
        blocks, hidden, _ = module.objective.drafted_blocks(target, data, states, torch.Generator().manual_seed(0))
        selector, terms = drafter.candidate_selector, []
        for b, j in blocks.label_valid.nonzero().tolist():
            h, label, prev = hidden[b, j], int(blocks.labels[b, j]), int(blocks.labels[b, j - 1])
            logits = target.logits(h).float()
            candidates = logits.topk(4).indices.tolist()
            if label not in candidates:
                candidates[-1] = label
            gate = selector.hidden_projection(h)
            scores = torch.stack(
                [
                    logits[c] + (selector.successor_codebook[c] * selector.predecessor_codebook[prev] * gate).sum()
                    for c in candidates
                ]
            )
            terms.append(-scores.log_softmax(0)[candidates.index(label)])
    expected = theirs.weighted_sum + 0.7 * theirs.weights.sum() * torch.stack(terms).mean()
    assert len(terms) > 10
    torch.testing.assert_close(ours.weighted_sum, expected, rtol=1e-4, atol=1e-5)


def test_every_dflash2_part_trains_and_chunking_changes_nothing(tmp_path):
    grads = []
    for chunk_rows in (None, 5):
        module = dflash2_module(tmp_path, chunk_rows=chunk_rows)
        with torch.no_grad():
            module.drafter.candidate_selector.successor_codebook.normal_(std=0.1, generator=torch.Generator().manual_seed(1))
        data = batch()
        module.objective.loss(
            module.target, data, states_of(module, data), torch.Generator().manual_seed(0), True
        ).weighted_sum.backward()
        grads.append({name: p.grad.clone() for name, p in module.drafter.named_parameters() if p.grad is not None})
    parts = {name for name in grads[0] if "conv" in name or "candidate_selector" in name}
    assert len(parts) == 4 + 3 and all(grads[0][name].abs().sum() > 0 for name in parts)
    assert grads[0].keys() == grads[1].keys()
    for name in grads[0]:
        torch.testing.assert_close(grads[0][name], grads[1][name], atol=1e-5, rtol=1e-4)


def test_dflash2_settings_are_one_line_errors(tmp_path):
    from dflash.data.config import DataSpec

    Settings = METHODS["dflash2"].train_settings
    for change, key in [({"selector_rank": 0}, "selector_rank"), ({"selector_alpha": -1.0}, "selector_alpha")]:
        with pytest.raises(ConfigError) as info:
            Settings(**change)
        assert info.value.key == key
    method = METHODS["dflash2"]
    for change, key in [
        ({"draft_vocab_size": 64}, "training.draft_vocab_size"),
        ({"agreement_mask": True, "loss": "kl"}, "training.agreement_mask"),
    ]:
        with pytest.raises(ConfigError) as info:
            method.check_training(Settings(), DrafterSpec(block_size=4), DataSpec(path="unused"), TrainingSettings(**change))
        assert info.value.key == key
    with pytest.raises(ConfigError, match="needs hidden_size >= k\\*\\(k\\+1\\) = 72") as info:  # the tiny target's hidden 64
        training_module(
            TargetSpec(path=str(tmp_path / "target"), build={"arch": "qwen3"}),
            "dflash2",
            Settings(selector_rank=8, selector_top_k=8),
            DrafterSpec(num_layers=1, block_size=4),
            TrainingSettings(num_anchors=4),
        )
    assert info.value.key == "method.selector_top_k"


def test_init_from_copies_a_dflash2_directorys_parts_and_a_dflash_directorys_layers(tmp_path):
    from dflash.drafter import save_drafter

    source = dflash2_module(tmp_path).drafter
    with torch.no_grad():
        source.candidate_selector.successor_codebook.normal_(generator=torch.Generator().manual_seed(2))
        source.layers[0].mlp_conv.kernel_projection.weight.normal_(generator=torch.Generator().manual_seed(3))
    save_drafter(source, str(tmp_path / "dflash2"))
    dflash = METHODS["dflash"].build_objective(
        dflash2_module(tmp_path).target, None, DrafterSpec(num_layers=1, block_size=4), TrainingSettings()
    )
    save_drafter(dflash.drafter, str(tmp_path / "dflash"))

    def started_from(directory, rank=8):
        spec = TargetSpec(path=str(tmp_path / "target"), build={"arch": "qwen3"})
        drafter = DrafterSpec(num_layers=1, block_size=4, seed=5, init_from=str(tmp_path / directory))
        method = METHODS["dflash2"].train_settings(selector_rank=rank, selector_top_k=4)
        return training_module(spec, "dflash2", method, drafter, TrainingSettings(num_anchors=4)).drafter.state_dict()

    for name, tensor in started_from("dflash2").items():
        assert torch.equal(tensor, source.state_dict()[name]), name
    from_dflash = started_from("dflash")
    assert all(torch.equal(from_dflash[name], tensor) for name, tensor in dflash.drafter.state_dict().items())
    assert not from_dflash["candidate_selector.successor_codebook"].any()  # its new parts
    assert not from_dflash["layers.0.mlp_conv.kernel_projection.weight"].any()
    with pytest.raises(ConfigError, match="set method.selector_rank=8") as info:
        started_from("dflash2", rank=4)
    assert info.value.key == "drafter.init_from"


@pytest.mark.parametrize("arch", ["qwen3", "gemma2"])  # gemma2: the head's soft-capping
def test_the_selector_term_through_the_candidates_head_rows_equals_the_whole_heads(arch):
    """`TargetModel.logits_of` (the K candidates' head rows) gives the selector term and its
    gradients that the whole head's logits, gathered, give; the candidates are the top-K that
    `block_loss` hands over."""
    from dflash.target import TargetModel
    from dflash.toy.tiny import build_tiny_target

    target = TargetModel(*build_tiny_target(arch, seed=0))
    drafter = dflash2_drafter(target, block_size=BLOCK, scale=0.5)
    generator = torch.Generator().manual_seed(0)
    hidden = torch.randn(12, target.hidden_size, generator=generator)
    prev, labels = (torch.randint(0, 256, (12,), generator=generator) for _ in range(2))
    results = []
    for through_rows in (False, True):
        rows = hidden.clone().requires_grad_()
        logits = target.logits(rows).float()
        top = logits.detach().topk(4, dim=-1)
        unary_of = target.logits_of if through_rows else (lambda _rows, ids, logits=logits: logits.gather(1, ids))
        cross_entropy, correct = objective.selector_terms(
            drafter.candidate_selector, top.indices, top.values, rows, prev, labels, unary_of
        )
        cross_entropy.sum().backward()
        results.append((cross_entropy.detach(), correct, rows.grad))
    torch.testing.assert_close(results[0][0], results[1][0], rtol=1e-5, atol=1e-6)
    assert torch.equal(results[0][1], results[1][1])
    torch.testing.assert_close(results[0][2], results[1][2], rtol=1e-4, atol=1e-6)
    assert results[0][2].abs().sum() > 0
