"""`training.loss_gamma`, `training.position_weights` and `training.anchor_sampling` reach
what the module trains on.

Each module is built the way `python -m dflash.train` builds it: the composed Hydra
config, `job_from_config`, then `DrafterTrainingModule`. The tests look at the weights
inside the loss the module computes and at the anchors its blocks open at, recomputed
here from the published formulas, so an ablation whose setting is dropped on the way
(and so would silently measure nothing) fails.
"""

from __future__ import annotations

import math

import pytest
import torch

from dflash.cli.train import job_from_config
from dflash.training import DrafterTrainingModule
from helpers.apps import compose_train
from helpers.training import batch, dflash_training_module, module_for

# float32 sums over a few hundred weighted slots: relative rounding well below 1e-5
SUM_TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    return tmp_path_factory.mktemp("settings_artifacts")


def published_weights(block_size: int, gamma: float | None) -> list[float]:
    """w_0 = 0 (the anchor is never a target); w_k = exp(-(k-1)/gamma), or 1 when uniform."""
    return [0.0] + [1.0 if gamma is None else math.exp(-(k - 1) / gamma) for k in range(1, block_size)]


@pytest.mark.parametrize(
    "overrides, block_size, gamma",
    [
        (["drafter.block_size=16"], 16, 7.0),  # loss_gamma=auto (the default): the published 7 / 5 / 4
        (["drafter.block_size=10"], 10, 5.0),
        (["drafter.block_size=8"], 8, 4.0),
        (["drafter.block_size=8", "training.loss_gamma=2.5"], 8, 2.5),
        (["drafter.block_size=8", "training.position_weights=uniform"], 8, None),
    ],
    ids=["auto_B16", "auto_B10", "auto_B8", "number", "uniform"],
)
def test_loss_gamma_sets_the_weights_of_the_computed_loss(artifacts, overrides, block_size, gamma):
    module = module_for(artifacts, *overrides, "training.num_anchors=8")
    expected = published_weights(block_size, gamma)
    result = module.compute_loss(batch(), torch.Generator().manual_seed(0))
    # every slot 1..B-1 is scored, each with its published weight
    assert sorted(set(result.slots.tolist())) == list(range(1, block_size))
    assert result.weights.tolist() == pytest.approx([expected[k] for k in result.slots.tolist()])
    # and the loss is the weighted mean with exactly those weights
    weights = torch.tensor([expected[k] for k in result.slots.tolist()], dtype=torch.float64)
    weighted_mean = float((weights * result.cross_entropy.double()).sum() / weights.sum())
    assert float(result.loss.detach()) == pytest.approx(weighted_mean, rel=SUM_TOLERANCE)


def test_decayed_and_uniform_weights_give_different_losses(artifacts):
    """The loss-decay ablation compares something: same drafter, batch and anchors, other loss."""
    losses = {}
    for weights in ("gamma", "uniform"):
        module = module_for(artifacts, f"training.position_weights={weights}")
        losses[weights] = float(module.compute_loss(batch(), torch.Generator().manual_seed(0)).loss.detach())
    assert abs(losses["gamma"] - losses["uniform"]) > SUM_TOLERANCE * losses["uniform"]


def valid_positions(loss_mask: torch.Tensor, block_size: int) -> list[int]:
    """Positions a of one sequence with loss_mask[a] and a target in a+1 .. a+B-1 (docs/design.md invariant 9)."""
    mask = loss_mask.tolist()
    return [a for a in range(len(mask)) if mask[a] and any(mask[a + 1 : a + block_size])]


def anchors_used(module: DrafterTrainingModule, data: dict, monkeypatch, seed: int | None = 0) -> list[list[int]]:
    """The anchor positions per sequence that the module's blocks were built at (seed None:
    drawn from torch's global generator, as training steps draw them)."""
    import dflash.dflash.objective as module_code

    seen = []
    real_build_blocks = module_code.build_blocks

    def recording_build_blocks(input_ids, loss_mask, anchors, *args):
        seen.append([row[valid].tolist() for row, valid in zip(anchors.positions, anchors.valid)])
        return real_build_blocks(input_ids, loss_mask, anchors, *args)

    monkeypatch.setattr(module_code, "build_blocks", recording_build_blocks)
    module.compute_loss(data, None if seed is None else torch.Generator().manual_seed(seed))
    monkeypatch.undo()
    (anchors,) = seen
    return anchors


def test_anchor_sampling_setting_chooses_the_anchors(artifacts, monkeypatch):
    data, block_size, num_anchors = batch(), 8, 5
    overrides = [f"drafter.block_size={block_size}", f"training.num_anchors={num_anchors}"]
    valid = [valid_positions(row, block_size) for row in data["loss_mask"] & data["attention_mask"]]

    stride = anchors_used(module_for(artifacts, *overrides, "training.anchor_sampling=stride"), data, monkeypatch)
    assert stride == [row[::block_size][:num_anchors] for row in valid]

    random_module = module_for(artifacts, *overrides)  # anchor_sampling=random, the default
    draws = [anchors_used(random_module, data, monkeypatch, seed) for seed in range(3)]
    for anchors in draws:
        assert all(len(row) == num_anchors and set(row) <= set(ok) for row, ok in zip(anchors, valid))
    # random anchors change with the seed (and are not the stride ones)
    assert len({str(anchors) for anchors in draws}) == len(draws) and stride not in draws


def trained_start(artifacts, monkeypatch, *overrides: str) -> tuple[torch.Tensor, list[list[int]]]:
    """A drafter weight and the training anchors of the first step, seeded as `run_training` does."""
    import lightning as L

    base = [
        f"paths.artifacts={artifacts}",
        "data.path=unused.jsonl",
        "drafter.num_layers=1",
        "drafter.block_size=8",
        "training.num_anchors=5",
    ]
    job = job_from_config(compose_train([*base, *overrides]))
    L.seed_everything(job.seed, workers=True, verbose=False)  # dflash.training.run._train, then the module
    module = dflash_training_module(job.target, job.drafter, job.training)
    weight = next(p for p in module.drafter.parameters() if p.dim() == 2).detach().clone()
    return weight, anchors_used(module, batch(), monkeypatch, seed=None)


def test_the_run_seed_changes_the_drafter_and_its_anchors(artifacts, monkeypatch):
    """`seed=0,1,2` sweeps must train different drafters: the drafter's own init seed once
    re-seeded torch after the run's seed, so every run seed trained the same drafter."""
    weight0, anchors0 = trained_start(artifacts, monkeypatch, "seed=0")
    weight1, anchors1 = trained_start(artifacts, monkeypatch, "seed=1")
    again0, again_anchors0 = trained_start(artifacts, monkeypatch, "seed=0")
    assert not torch.equal(weight0, weight1) and anchors0 != anchors1
    assert torch.equal(weight0, again0) and anchors0 == again_anchors0
    # an explicit drafter seed fixes the initialisation only
    fixed0, _ = trained_start(artifacts, monkeypatch, "seed=0", "drafter.seed=7")
    fixed1, _ = trained_start(artifacts, monkeypatch, "seed=1", "drafter.seed=7")
    assert torch.equal(fixed0, fixed1) and not torch.equal(fixed0, weight0)
    # EAGLE-3's drafter follows the run seed the same way
    eagle3 = [f"paths.artifacts={artifacts}", "data.path=unused.jsonl", "method=eagle3"]
    assert [job_from_config(compose_train([*eagle3, f"seed={s}"])).method_settings.seed for s in (0, 3)] == [0, 3]
    assert job_from_config(compose_train([*eagle3, "seed=3", "method.seed=7"])).method_settings.seed == 7
