"""The drafter's graphed propose (dflash.engine.drafter_graphs) computes what the module computes; here
it runs uncaptured (CI has no GPU), which checks everything but the capture itself."""

from __future__ import annotations

import pytest
import torch

from dflash.decoding import generate
from dflash.dflash.proposer import DFlashProposer
from dflash.drafter import DFlashDrafter
from dflash.engine.drafter_graphs import DrafterStaticCache, GraphedDrafter
from dflash.engine.graphs import GraphedForward
from dflash.target import TargetModel
from dflash.toy.tiny import build_tiny_target
from helpers.decoding import random_drafter


@pytest.fixture(scope="module")
def target() -> TargetModel:
    return TargetModel(*build_tiny_target("qwen3", seed=0, num_heads=4, num_kv_heads=2))


def _drafter(target: TargetModel) -> DFlashDrafter:
    return random_drafter(target, 2, 4, seed=1, uneven_norms=True)


def _proposes(target: TargetModel, proposer: DFlashProposer, first: int) -> list[torch.Tensor]:
    """The logits of proposes as decoding feeds them: `first` context positions, then 1-4 at a
    time past the drafter cache's first capacity (256), cropped back after each block."""
    ids = torch.randint(0, 256, (1, 300), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        features = target.forward(ids, torch.arange(300).unsqueeze(0), target.new_cache(), proposer.target_layer_ids).features
    proposer.reset()
    out, step = [], 0
    while proposer.cache.length < 280:
        new = first if step == 0 else 1 + step % 4
        start = proposer.cache.length
        out.append(proposer.propose(ids[:, : start + new + 1], features[:, start : start + new], 4, 3))
        step += 1
    return out


@pytest.mark.parametrize("first", [20, 250])  # a first context replayed from a graph, and one run uncaptured
def test_graphed_proposes_equal_the_modules_over_a_growing_cache(target, first):
    drafter = _drafter(target)
    module = DFlashProposer(drafter, target.embed, target.logits)
    graphed = DFlashProposer(drafter, target.embed, target.logits, graphed=True)
    assert isinstance(graphed.forward, GraphedDrafter) and isinstance(graphed.cache, DrafterStaticCache)
    ours, reference = _proposes(target, graphed, first), _proposes(target, module, first)
    assert len(ours) == len(reference) > 10
    for a, b in zip(ours, reference):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    assert graphed.cache.capacity == 512  # it grew, and the graphs of the old buffers went
    assert all(new <= 4 for _, new, _ in graphed.forward.steps.graphs)


def test_decoding_on_graphs_is_the_targets_greedy_output(target):
    drafter = _drafter(target)
    graphs = TargetModel(*build_tiny_target("qwen3", seed=0, num_heads=4, num_kv_heads=2), engine="fast")
    graphs.graphs = GraphedForward(graphs.fast)
    proposer = DFlashProposer(drafter, graphs.embed, graphs.logits, graphed=True)
    for seed in range(3):
        ids = torch.randint(0, 256, (1, 12), generator=torch.Generator().manual_seed(seed))
        plain = generate(target, ids, max_new_tokens=40).output_ids
        reference = generate(
            target, ids, max_new_tokens=40, block_size=4, proposer=DFlashProposer(drafter, target.embed, target.logits)
        )
        ours = generate(graphs, ids, max_new_tokens=40, block_size=4, proposer=proposer)
        assert ours.output_ids == plain == reference.output_ids
        assert ours.acceptance_lengths == reference.acceptance_lengths  # the same drafts, step for step
