"""DFlash2's proposer and method (dflash/dflash2/proposer.py, dflash/methods/dflash2.py): the
bridge to DFlash (identity convolutions and a zero successor codebook draft what the DFlash
drafter drafts), llama.cpp's greedy walk, lossless greedy decoding with random convolutions and
selector and the p_min stop (docs/design.md invariant 12) on the lossless matrix's targets, and
the settings it refuses."""

from __future__ import annotations

import pytest
import torch

import dflash.decoding.chain
from dflash.decoding import SamplingConfig, generate
from dflash.dflash.proposer import DFlashProposer
from dflash.dflash2.proposer import DFlash2Proposer
from dflash.errors import ConfigError
from dflash.methods import EvalContext, build_method
from dflash.methods.dflash2 import DFlash2Settings
from dflash.target import TargetModel
from dflash.toy.tiny import build_tiny_target
from helpers.decoding import PROMPTS, RecordingProposer, dflash2_drafter, flawed_verify, hf_greedy, random_drafter
from helpers.stats import sampled_p_value

MORE_ARCHS = [
    "mistral",
    "gemma2",
    "gemma3",
    "qwen2",
    "qwen3_moe",
    "gpt2",
    "phi3",
    "olmo2",
    "stablelm",
    "gpt_neox",
    "falcon",
    "granite",
    "cohere",
]
TOP_K = 4


def run(target, proposer, prompts=PROMPTS[:2], max_new=20, block_size=8):
    outputs = []
    for prompt in prompts:
        ids = target.tokenizer(prompt, return_tensors="pt").input_ids
        outputs.append(generate(target, ids, max_new_tokens=max_new, block_size=block_size, proposer=proposer).output_ids)
    return outputs


def test_a_zero_scored_selector_drafts_what_the_dflash_drafter_drafts(tiny_target):
    dflash = RecordingProposer(DFlashProposer(random_drafter(tiny_target, block_size=8), tiny_target.embed, tiny_target.logits))
    dflash2 = RecordingProposer(DFlash2Proposer(dflash2_drafter(tiny_target), tiny_target.embed, tiny_target.logits))
    assert run(tiny_target, dflash) == run(tiny_target, dflash2)
    assert dflash2.drafts == dflash.drafts and len(dflash.drafts[0]) == 7


def test_the_selector_changes_the_drafts(tiny_target):
    """The bridge's converse: a scored selector and convolutions draft something else."""
    recorded = []
    for drafter in (dflash2_drafter(tiny_target), dflash2_drafter(tiny_target, scale=0.5)):
        proposer = RecordingProposer(DFlash2Proposer(drafter, tiny_target.embed, tiny_target.logits))
        run(tiny_target, proposer, prompts=PROMPTS[:1], max_new=10)
        recorded.append(proposer.drafts)
    assert recorded[0] != recorded[1]


def test_the_walk_is_llama_cpps(qwen3_target):
    """Each slot's draft is the argmax of its K scores after the previous slot's draft (the anchor
    first), and p_min stops before the first slot whose chosen softmax is below it."""
    drafter = dflash2_drafter(qwen3_target, scale=0.5)
    proposer = DFlash2Proposer(drafter, qwen3_target.embed, qwen3_target.logits)
    ids = qwen3_target.tokenizer(PROMPTS[0], return_tensors="pt").input_ids
    from dflash.decoding import SamplingConfig
    from dflash.training.forward import target_features

    with torch.no_grad():
        features = target_features(qwen3_target, ids[:, :-1], drafter.config.target_layer_ids)
        drafts = proposer.draft(ids, features, 8, 7, SamplingConfig(), None).tokens.tolist()
        proposer.reset()
        hidden = proposer.block_hidden(ids, features, 8, 7)
        logits = qwen3_target.logits(hidden).float()
        prev, expected, chosen = int(ids[0, -1]), [], []
        for slot in range(7):
            top = logits[slot].topk(TOP_K)
            table = drafter.candidate_selector
            scores = [
                float(top.values[k] + (table.successor_codebook[top.indices[k]] * table.predecessor_codebook[prev]
                      * table.hidden_projection(hidden[slot])).sum())
                for k in range(TOP_K)
            ]  # fmt: skip
            best = max(range(TOP_K), key=lambda k: scores[k])
            chosen.append(1 / sum(torch.exp(torch.tensor(scores) - scores[best]).tolist()))
            prev = int(top.indices[best])
            expected.append(prev)
    assert drafts == expected
    p_min = sorted(chosen)[len(chosen) // 2]
    proposer.p_min, cut = p_min, next(i for i, p in enumerate(chosen) if p < p_min)
    proposer.reset()
    assert proposer.draft(ids, features, 8, 7, SamplingConfig(), None).tokens.tolist() == expected[:cut]


def assert_greedy_lossless(target: TargetModel) -> None:
    proposer = RecordingProposer(DFlash2Proposer(dflash2_drafter(target, scale=0.5), target.embed, target.logits, p_min=0.6))
    for prompt, max_new in zip(PROMPTS, [30, 20, 25, 17]):
        ids = target.tokenizer(prompt, return_tensors="pt").input_ids
        result = generate(target, ids, max_new_tokens=max_new, block_size=8, proposer=proposer)
        assert result.output_ids == hf_greedy(target, ids, max_new), prompt
    lengths = {len(tokens) for tokens in proposer.drafts}
    assert min(lengths) < 7 and max(lengths) >= 1, lengths  # p_min cut some drafts, others drafted


def test_greedy_output_equals_the_targets(tiny_target):
    assert_greedy_lossless(tiny_target)


@pytest.mark.slow
@pytest.mark.parametrize("arch", MORE_ARCHS)
def test_greedy_output_equals_the_targets_on_more_families(arch):
    assert_greedy_lossless(TargetModel(*build_tiny_target(arch, seed=0)))


def test_a_setting_dflash2_does_not_draft_for_is_refused(qwen3_target):
    drafter = dflash2_drafter(qwen3_target)
    with pytest.raises(ConfigError, match="decoding.draft_threshold: "):
        build_method("dflash2", qwen3_target, None, EvalContext(drafter, "random", draft_threshold=0.5))
    assert build_method("dflash2", qwen3_target, None, EvalContext(drafter, "random", temperature=0.8)).block_size == 8
    assert build_method("dflash2", qwen3_target, None, EvalContext(drafter, "random")).block_size == 8


def test_a_drafter_without_selector_or_a_bad_p_min_is_refused(qwen3_target):
    with pytest.raises(ConfigError, match="drafter.path: holds a DFlashDraftModel"):
        build_method("dflash2", qwen3_target, None, EvalContext(random_drafter(qwen3_target, block_size=8), "random"))
    with pytest.raises(ConfigError, match="p_min: must be in \\[0, 1\\)"):
        DFlash2Settings(p_min=1.0)


# --- sampling: the walk's deterministic drafts, verified by the target's sampling rule ---------

SAMPLES = 800
SAMPLING = {rule: SamplingConfig(temperature=0.8, top_k=3, verify_rule=rule) for rule in ("rejection", "match")}


def sampled_outputs(target: TargetModel, sampling: SamplingConfig) -> tuple[float, list[int]]:
    """SAMPLES outputs of `generate()` with a DFlash2 proposer (random convolutions and selector)
    whose candidates are the target's top-K after the prompt at every slot, so the first draft is
    often accepted and later ones often not: their chi-square p-value against the target's exact
    joint, and every step's acceptance length."""
    ids = target.tokenizer("def f(x):", return_tensors="pt").input_ids
    with torch.no_grad():
        after_prompt = target.model(ids).logits[0, -1]
    logits = lambda hidden: after_prompt.expand(*hidden.shape[:-1], -1)  # noqa: E731
    proposer = DFlash2Proposer(dflash2_drafter(target, block_size=4, scale=0.5, top_k=3), target.embed, logits)
    return sampled_p_value(target, ids, proposer, sampling, SAMPLES)


@pytest.mark.slow
@pytest.mark.parametrize("rule", SAMPLING)
def test_sampled_outputs_follow_the_targets_distribution(qwen3_target, rule):
    p_value, lengths = sampled_outputs(qwen3_target, SAMPLING[rule])
    assert p_value > 1e-3, f"outputs do not follow the target's distribution (p={p_value:.2g})"
    assert all(lengths.count(n) >= 50 for n in (1, 2)), lengths  # drafts were rejected and accepted


@pytest.mark.slow
def test_the_sampling_check_catches_a_flawed_verifier(qwen3_target, monkeypatch):
    monkeypatch.setattr(dflash.decoding.chain, "verify", flawed_verify("residual_is_target_row"))
    assert sampled_outputs(qwen3_target, SAMPLING["rejection"])[0] < 1e-3
