"""The CUDA-graph step (dflash.engine.graphs) computes what the fast forward computes; here it
runs uncaptured (CI has no GPU), which checks everything but the capture itself."""

import logging

import pytest
import torch

from dflash.decoding import generate
from dflash.engine.graphs import MAX_GRAPH_WIDTH, GraphedForward
from dflash.target import TargetModel, crop_cache
from dflash.toy.tiny import build_tiny_target
from helpers.decoding import PROMPTS, assert_same_greedy_output


def graphed(arch: str, **overrides) -> tuple[TargetModel, TargetModel]:
    """The same tiny model on the fast forward, and on the graph step run uncaptured."""
    fast = TargetModel(*build_tiny_target(arch, seed=0, **overrides), engine="fast")
    steps = TargetModel(*build_tiny_target(arch, seed=0, **overrides), engine="fast")
    steps.graphs = GraphedForward(steps.fast)
    return fast, steps


@pytest.mark.parametrize(
    ("arch", "sizes"), [("llama", {}), ("qwen3", {}), ("qwen2", {}), ("llama", {"num_heads": 4, "num_kv_heads": 1})]
)
def test_the_graph_step_equals_the_fast_forward_over_a_growing_cache(arch, sizes):
    fast, steps = graphed(arch, **sizes)
    ids = torch.randint(0, 250, (1, 320), generator=torch.Generator().manual_seed(1))
    taps = [fast.num_layers - 1, 0]
    caches = [fast.new_cache(), steps.new_cache()]
    position = 0
    # the prefill, then verify widths (one wider than a graph), past the first capacity (256)
    for width in (240, 1, 3, MAX_GRAPH_WIDTH, 8, 1, MAX_GRAPH_WIDTH + 1, 16, 16, 2, 5):
        outs = []
        for target, cache in zip((fast, steps), caches):
            positions = torch.arange(position, position + width).unsqueeze(0)
            outs.append(target.forward(ids[:, position : position + width], positions, cache, taps if width > 1 else None))
        torch.testing.assert_close(outs[1].logits, outs[0].logits, atol=1e-5, rtol=1e-5)
        if width > 1:
            torch.testing.assert_close(outs[1].features, outs[0].features, atol=1e-5, rtol=1e-5)
        keep = position + max(1, width - 2)  # a rejected draft: the cache is cropped back
        for cache in caches:
            crop_cache(cache, keep)
        position = keep
    assert caches[1].capacity == 512 and caches[1].length == caches[0].length
    # graphs of the first buffers were dropped when the cache grew; one per shape since
    assert {key[1] for key in steps.graphs.steps.graphs} == {1, 2, 5, 8, 16}  # not 3: before the growth (at 8)


@pytest.mark.parametrize("block_size", [1, 4, 8])
def test_the_graph_step_decodes_the_fast_forwards_greedy_output(block_size):
    assert_same_greedy_output(*graphed("qwen3"), PROMPTS, block_size)


def test_engine_graphs_without_cuda_runs_the_fast_forward_with_one_log_line(caplog):
    with caplog.at_level(logging.INFO, logger="dflash.target.model"):
        target = TargetModel(*build_tiny_target("llama", seed=0), engine="graphs")
    lines = [r.getMessage() for r in caplog.records if "engine" in r.getMessage()]
    assert lines == ["engine: graphs needs CUDA; the target is on cpu and runs the fast forward"]
    assert target.graphs is None and target.fast is not None
    ids = target.tokenizer(PROMPTS[0], return_tensors="pt").input_ids
    assert len(generate(target, ids, max_new_tokens=5).output_ids) == 5


def test_engine_graphs_refuses_a_rope_that_reads_positions_on_the_host(caplog):
    model, tokenizer = build_tiny_target("llama", seed=0)
    model.model.rotary_emb.rope_type = "dynamic"  # as a dynamic-NTK model's rotary embedding is built
    with caplog.at_level(logging.INFO, logger="dflash.target.model"):
        target = TargetModel(model, tokenizer, engine="graphs")
    lines = [r.getMessage() for r in caplog.records if "engine" in r.getMessage()]
    assert lines == ["engine: graphs cannot capture dynamic rope (it reads positions on the host); running the fast forward"]
    assert target.graphs is None and target.fast is not None
