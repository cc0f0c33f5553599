"""training.target_cache_gib: the frozen target's states kept per sequence train the same
drafter as computing them every step, skip the target after the first epoch, and stay
inside their budget."""

import logging

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader

from dflash.errors import ConfigError
from dflash.specs import DrafterSpec, TargetSpec
from dflash.training import TrainingSettings
from dflash.training.feature_cache import TargetStateCache
from helpers.training import dflash_training_module


@pytest.fixture(scope="module")
def target_spec(tmp_path_factory):
    return TargetSpec(path=str(tmp_path_factory.mktemp("target") / "tiny"), build={"arch": "qwen3", "seed": 0})


def _batches(count, batch_size=3, seq_len=24, seed=0):
    """Right-padded batches whose rows have distinct lengths and keys."""
    generator = torch.Generator().manual_seed(seed)
    batches = []
    for index in range(count):
        input_ids = torch.randint(0, 256, (batch_size, seq_len), generator=generator)
        attention_mask = torch.ones(batch_size, seq_len, dtype=torch.bool)
        attention_mask[0, seq_len - 5 :] = False
        attention_mask[1, seq_len - 2 :] = False
        loss_mask = attention_mask.clone()
        loss_mask[:, :8] = False
        row_index = torch.arange(batch_size) + 10 * index
        batches.append({"input_ids": input_ids, "attention_mask": attention_mask, "loss_mask": loss_mask, "row_index": row_index})
    return batches


def _fit(target_spec, batches, epochs, **training):
    torch.manual_seed(0)
    module = dflash_training_module(
        target_spec,
        DrafterSpec(num_layers=1, block_size=4, num_target_features=2, seed=0),
        TrainingSettings(num_anchors=4, learning_rate=3e-3, **training),
    )
    calls = []
    forward = module.target.forward
    module.target.forward = lambda *args, **kwargs: calls.append(1) or forward(*args, **kwargs)
    trainer = L.Trainer(
        accelerator="cpu",
        max_epochs=epochs,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    torch.manual_seed(1)  # the same anchors in both runs
    trainer.fit(module, DataLoader(batches, batch_size=None))
    return module, len(calls)


@pytest.mark.parametrize("loss", ["ce", "kl"])
def test_cached_states_train_the_same_drafter_without_the_target_after_one_epoch(target_spec, loss):
    batches = _batches(3)
    plain, plain_calls = _fit(target_spec, batches, epochs=3, loss=loss)
    cached, cached_calls = _fit(target_spec, batches, epochs=3, loss=loss, target_cache_gib=0.01)
    assert plain_calls == 9 and cached_calls == 3  # one target forward per batch, first epoch only
    assert (cached.state_cache.hits, cached.state_cache.misses, len(cached.state_cache)) == (6, 3, 9)
    for name, tensor in plain.drafter.state_dict().items():
        torch.testing.assert_close(cached.drafter.state_dict()[name], tensor, rtol=0, atol=1e-6, msg=name)


def test_a_batch_of_cached_rows_has_each_rows_states_and_zero_padding():
    cache = TargetStateCache(budget_bytes=10**6)
    states = torch.randn(2, 6, 5)
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0]], dtype=torch.bool)
    assert cache.get(torch.tensor([7, 3]), mask, lambda: states) is states
    # the same rows in another order, padded wider
    wide = torch.zeros(2, 8, dtype=torch.bool)
    wide[0, :3], wide[1, :6] = True, True
    rebuilt = cache.get(torch.tensor([3, 7]), wide, lambda: pytest.fail("the target ran for cached rows"))
    assert torch.equal(rebuilt[0, :3], states[1, :3]) and torch.equal(rebuilt[1, :6], states[0])
    assert not rebuilt[0, 3:].any() and not rebuilt[1, 6:].any()


def test_the_cache_stops_at_its_budget_and_says_so_once(caplog):
    row_bytes = 4 * 5 * 4  # 4 tokens x 5 floats32
    cache = TargetStateCache(budget_bytes=2 * row_bytes)
    mask = torch.ones(3, 4, dtype=torch.bool)
    with caplog.at_level(logging.WARNING, logger="dflash.training.feature_cache"):
        cache.get(torch.tensor([0, 1, 2]), mask, lambda: torch.randn(3, 4, 5))
        cache.get(torch.tensor([3, 4, 5]), mask, lambda: torch.randn(3, 4, 5))
    assert len(cache) == 2 and cache.used_bytes == 2 * row_bytes
    assert sum("target state cache full" in r.getMessage() for r in caplog.records) == 1
    computed = []
    cache.get(torch.tensor([0, 2]), mask[:2], lambda: computed.append(1) or torch.randn(2, 4, 5))
    assert computed == [1]  # row 2 did not fit: the batch is computed whole
    cache.get(torch.tensor([1, 0]), mask[:2], lambda: pytest.fail("both rows are cached"))


def test_batches_without_row_index_run_the_target_and_say_so_once(caplog):
    cache = TargetStateCache(budget_bytes=10**6)
    mask = torch.ones(2, 4, dtype=torch.bool)
    computed = []
    with caplog.at_level(logging.WARNING, logger="dflash.training.feature_cache"):
        for _ in range(3):
            cache.get(None, mask, lambda: computed.append(1) or torch.randn(2, 4, 5))
    assert computed == [1, 1, 1] and len(cache) == 0
    assert sum("no row_index" in r.getMessage() for r in caplog.records) == 1


@pytest.mark.parametrize("budget", [-1, True, "1"])
def test_a_budget_that_is_not_a_number_of_gib_is_a_config_error(budget):
    with pytest.raises(ConfigError) as err:
        TrainingSettings(target_cache_gib=budget)
    assert err.value.key == "target_cache_gib"  # the field; the CLI adds the group
