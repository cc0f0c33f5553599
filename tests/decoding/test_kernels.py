"""Decoding runs without cuDNN's SDPA kernel (`dflash.target.cache.decode_attention`).

cuDNN builds an execution graph for every new key length, and each decode step has a new
one: on an H100 that cost 50-85 ms a step (docs/results/decode-profile-2026-11-24-h100.md).
The flag is global, so the tests read it where the forwards run: in the target's forward,
the proposer, the replay and regeneration's HF `generate()`. On the CPU only the flag can
be checked; the kernel choice it governs is CUDA's.
"""

import pytest
import torch

from dflash.data import HFGenerator
from dflash.decoding import generate
from dflash.decoding.replay import replay_logits
from dflash.target import TargetModel
from dflash.target.tiny import build_tiny_target
from helpers.decoding import PROMPTS, OracleProposer


def _cudnn_allowed() -> bool:
    return torch.backends.cuda.cudnn_sdp_enabled()


@pytest.fixture
def spied_target(qwen3_target, monkeypatch):
    """qwen3_target whose forward records whether cuDNN's SDPA was allowed at each call."""
    seen: list[bool] = []
    forward = qwen3_target.forward

    def spy(*args, **kwargs):
        seen.append(_cudnn_allowed())
        return forward(*args, **kwargs)

    monkeypatch.setattr(qwen3_target, "forward", spy)
    return qwen3_target, seen


class SpyProposer(OracleProposer):
    def __init__(self, target):
        super().__init__(target)
        self.seen: list[bool] = []

    def propose(self, committed_ids, new_features, block_size, num_drafts):
        self.seen.append(_cudnn_allowed())
        return super().propose(committed_ids, new_features, block_size, num_drafts)


@pytest.mark.parametrize("block_size", [1, 4])
def test_the_loop_and_its_proposer_run_without_cudnn_and_give_the_choice_back(spied_target, block_size):
    target, seen = spied_target
    assert _cudnn_allowed()  # torch's default, which the test must find again afterwards
    ids = target.tokenizer(PROMPTS[0], return_tensors="pt").input_ids
    proposer = SpyProposer(target)
    result = generate(target, ids, max_new_tokens=8, block_size=block_size, proposer=proposer if block_size > 1 else None)
    assert len(result.output_ids) == 8
    assert seen and not any(seen)
    assert (proposer.seen and not any(proposer.seen)) if block_size > 1 else not proposer.seen
    assert _cudnn_allowed()


def test_the_replay_runs_the_loops_kernels(spied_target):
    target, seen = spied_target
    ids = target.tokenizer(PROMPTS[1], return_tensors="pt").input_ids
    run = generate(target, ids, max_new_tokens=6, block_size=4, proposer=OracleProposer(target))
    seen.clear()
    replay_logits(target, ids, run.steps, 5)
    assert seen and not any(seen)
    assert _cudnn_allowed()


def test_regeneration_runs_hf_generate_without_cudnn(monkeypatch):
    model, tokenizer = build_tiny_target("qwen3", seed=0, chat_template=True)
    generator = HFGenerator(TargetModel(model, tokenizer), max_new_tokens=4)
    seen: list[bool] = []
    hf_generate = model.generate

    def spy(*args, **kwargs):
        seen.append(_cudnn_allowed())
        return hf_generate(*args, **kwargs)

    monkeypatch.setattr(model, "generate", spy)
    (answer,) = generator([[{"role": "user", "content": "Hi"}]])
    assert seen == [False] and answer.num_tokens >= 1
    assert _cudnn_allowed()
