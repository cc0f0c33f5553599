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
from dflash.toy.tiny import build_tiny_target
from helpers.decoding import PROMPTS, OracleProposer, record_cudnn_flag


def _cudnn_allowed() -> bool:
    return torch.backends.cuda.cudnn_sdp_enabled()


@pytest.mark.parametrize("block_size", [1, 4])
def test_the_loop_and_its_proposer_run_without_cudnn_and_give_the_choice_back(qwen3_target, monkeypatch, block_size):
    assert _cudnn_allowed()  # torch's default, which the test must find again afterwards
    in_target = record_cudnn_flag(monkeypatch, qwen3_target, "forward")
    proposer = OracleProposer(qwen3_target)
    in_proposer = record_cudnn_flag(monkeypatch, proposer, "propose")
    ids = qwen3_target.tokenizer(PROMPTS[0], return_tensors="pt").input_ids
    result = generate(qwen3_target, ids, max_new_tokens=8, block_size=block_size, proposer=proposer if block_size > 1 else None)
    assert len(result.output_ids) == 8
    assert in_target and not any(in_target)
    assert (in_proposer and not any(in_proposer)) if block_size > 1 else not in_proposer
    assert _cudnn_allowed()


def test_the_replay_runs_the_loops_kernels(qwen3_target, monkeypatch):
    ids = qwen3_target.tokenizer(PROMPTS[1], return_tensors="pt").input_ids
    run = generate(qwen3_target, ids, max_new_tokens=6, block_size=4, proposer=OracleProposer(qwen3_target))
    seen = record_cudnn_flag(monkeypatch, qwen3_target, "forward")
    replay_logits(qwen3_target, ids, run.steps, 5)
    assert seen and not any(seen)
    assert _cudnn_allowed()


def test_regeneration_runs_hf_generate_without_cudnn(monkeypatch):
    model, tokenizer = build_tiny_target("qwen3", seed=0, chat_template=True)
    generator = HFGenerator(TargetModel(model, tokenizer, engine="eager"), max_new_tokens=4)  # HF generate's path
    seen = record_cudnn_flag(monkeypatch, model, "generate")
    (answer,) = generator([[{"role": "user", "content": "Hi"}]])
    assert seen == [False] and answer.num_tokens >= 1
    assert _cudnn_allowed()
