"""training.target_cache_dir: the target's states, computed once into memory-mapped files,
train the same drafter as the live target, are shared by runs with other taps, resume
after a killed fill and refill a damaged file."""

from __future__ import annotations

import json
import os

import lightning as L
import numpy as np
import pytest
import torch

from dflash.data.datamodule import DFlashDataModule
from dflash.errors import ConfigError
from dflash.specs import DrafterSpec, TargetSpec, load_target
from dflash.training import TrainingSettings
from dflash.training.disk_cache import DiskStateCache
from dflash.training.forward import target_features
from dflash.training.module import open_disk_cache
from helpers.training import dflash_training_module


@pytest.fixture(scope="module")
def target_spec(tmp_path_factory):
    return TargetSpec(path=str(tmp_path_factory.mktemp("target") / "tiny"), build={"arch": "qwen3", "seed": 0})


@pytest.fixture(scope="module")
def target(target_spec):
    return load_target(target_spec)


def _conversations(count: int) -> list[dict]:
    return [
        {
            "messages": [
                {"role": "user", "content": f"question {i} " + "?" * (3 * (i % 5))},
                {"role": "assistant", "content": f"answer {i} " + "!" * (2 * i + 9)},
            ]
        }
        for i in range(count)
    ]


def _datamodule(tokenizer, count=10, batch_size=3) -> DFlashDataModule:
    datamodule = DFlashDataModule(_conversations(count), tokenizer, batch_size=batch_size, val_fraction=0.2, seed=0, num_workers=0)
    datamodule.setup("fit")
    return datamodule


def _counting(target):
    """Count the target's forwards (they must not happen when the cache is complete)."""
    calls = []
    forward = target.forward
    target.forward = lambda *args, **kwargs: calls.append(1) or forward(*args, **kwargs)
    return calls


def _cache(tmp_path, target, datamodule, layers, dtype="float32", shard_rows=3):
    rows = datamodule.rows
    cache = DiskStateCache.open(
        str(tmp_path), target, datamodule.fingerprint(), rows.offsets[1:] - rows.offsets[:-1], dtype=dtype, shard_rows=shard_rows
    )
    cache.fill(target, lambda r: rows.input_ids[rows.offsets[r] : rows.offsets[r + 1]], layers, batch_size=2, progress=False)
    return cache


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_batch_read_from_disk_equals_the_live_targets_states(tmp_path, target, dtype):
    datamodule = _datamodule(target.tokenizer)
    layers = [0, 3, target.num_layers - 1]
    cache = _cache(tmp_path, target, datamodule, layers, dtype)
    batch = next(iter(datamodule.train_dataloader()))
    live = target_features(target, batch["input_ids"], layers)
    read = cache.read(batch["row_index"], batch["input_ids"].shape[1], layers, torch.float32)
    real = batch["attention_mask"]
    assert not read[~real].any()  # zero on padding
    if dtype == "float32":
        torch.testing.assert_close(read[real], live[real], rtol=1e-5, atol=1e-5)
    else:  # bf16 storage: the live states rounded to bf16, up to a rounding flip of one step
        torch.testing.assert_close(read[real], live[real].bfloat16().float(), rtol=8e-3, atol=1e-2)
    per_token = 3 * target.hidden_size * (2 if dtype == "bfloat16" else 4)
    assert cache.disk_bytes() == per_token * int(datamodule.rows.offsets[-1])


@pytest.mark.parametrize("loss", ["ce", "kl"])
def test_training_from_the_disk_cache_equals_training_with_the_live_target(tmp_path, target_spec, loss):
    """Same anchors, same batch: the same loss and the same gradient of every drafter weight."""
    results = []
    for cache_dir in (None, str(tmp_path)):
        torch.manual_seed(0)
        module = dflash_training_module(
            target_spec,
            DrafterSpec(num_layers=1, block_size=4, num_target_features=2, seed=0),
            TrainingSettings(num_anchors=6, loss=loss, target_cache_dir=cache_dir, target_cache_dtype="float32"),
        )
        datamodule = _datamodule(module.target.tokenizer)
        calls = _counting(module.target)
        if cache_dir is not None:
            rows = datamodule.rows
            module.disk_cache = open_disk_cache(
                module.training_config, module.target, rows, datamodule.fingerprint(), module.objective.taps()
            )
            calls.clear()  # the fill ran the target; training must not
        batch = next(iter(datamodule.train_dataloader()))
        result = module.compute_loss(batch, torch.Generator().manual_seed(3))
        result.loss.backward()
        grads = {name: p.grad.clone() for name, p in module.drafter.named_parameters() if p.grad is not None}
        results.append((result.loss.detach(), grads, len(calls)))
    (live_loss, live_grads, live_calls), (cached_loss, cached_grads, cached_calls) = results
    assert live_calls == 1 and cached_calls == 0
    torch.testing.assert_close(cached_loss, live_loss, rtol=1e-5, atol=1e-6)
    assert live_grads.keys() == cached_grads.keys() and live_grads
    for name, grad in live_grads.items():
        torch.testing.assert_close(cached_grads[name], grad, rtol=1e-4, atol=1e-6, msg=name)


def test_a_lightning_run_fills_the_cache_once_and_the_next_run_never_runs_the_target(tmp_path, target_spec):
    def fit(precision="32-true"):
        torch.manual_seed(0)
        module = dflash_training_module(
            target_spec,
            DrafterSpec(num_layers=1, block_size=4, num_target_features=2, seed=0),
            TrainingSettings(num_anchors=4, target_cache_dir=str(tmp_path)),
        )
        calls = _counting(module.target)
        datamodule = DFlashDataModule(_conversations(10), module.target.tokenizer, batch_size=3, val_fraction=0.2, num_workers=0)
        trainer = L.Trainer(
            accelerator="cpu",
            precision=precision,
            max_steps=4,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            num_sanity_val_steps=0,
        )
        trainer.fit(module, datamodule=datamodule)
        return module, len(calls)

    first, first_calls = fit()
    second, second_calls = fit()
    assert first_calls > 0 and second_calls == 0
    assert first.disk_cache.directory == second.disk_cache.directory
    for name, tensor in first.drafter.state_dict().items():
        torch.testing.assert_close(second.drafter.state_dict()[name], tensor, rtol=0, atol=0, msg=name)
    # a bf16-mixed run fills under its autocast, as its training steps run the target: another cache
    mixed, mixed_calls = fit("bf16-mixed")
    assert mixed_calls > 0 and mixed.disk_cache.directory != first.disk_cache.directory
    with open(os.path.join(mixed.disk_cache.directory, "manifest.json")) as handle:
        assert json.load(handle)["target"]["autocast"] == "bfloat16"


def test_runs_with_other_taps_fill_only_the_layers_they_add(tmp_path, target):
    datamodule = _datamodule(target.tokenizer)
    first = _cache(tmp_path, target, datamodule, [1, 3])
    calls = _counting(target)
    again = _cache(tmp_path, target, datamodule, [1, 3])
    assert calls == [] and again.directory == first.directory
    more = _cache(tmp_path, target, datamodule, [1, 3, 5])
    assert len(calls) > 0
    layers = sorted(name for name in os.listdir(more.directory) if name.startswith("layer-"))
    assert layers == ["layer-01", "layer-03", "layer-05"]


def test_a_killed_fill_resumes_and_a_damaged_file_is_filled_again(tmp_path, target, caplog):
    datamodule = _datamodule(target.tokenizer)
    cache = _cache(tmp_path, target, datamodule, [2])
    files = sorted(os.listdir(os.path.join(cache.directory, "layer-02")))
    assert len(files) == cache.num_shards == 4  # 10 rows, 3 per shard
    complete = {name: open(os.path.join(cache.directory, "layer-02", name), "rb").read() for name in files}
    os.remove(os.path.join(cache.directory, "layer-02", files[1]))  # a fill killed before this shard
    with open(os.path.join(cache.directory, "layer-02", files[2]), "r+b") as handle:
        handle.truncate(10)  # a damaged file
    calls = _counting(target)
    _cache(tmp_path, target, datamodule, [2])
    assert len(calls) == 4  # two shards of three rows, two rows per forward
    for name, data in complete.items():
        assert open(os.path.join(cache.directory, "layer-02", name), "rb").read() == data
    assert any("wrong size" in record.getMessage() for record in caplog.records)


def test_another_target_or_other_data_gets_another_cache_and_a_foreign_manifest_is_refused(tmp_path, target, target_spec):
    datamodule = _datamodule(target.tokenizer)
    lengths = datamodule.rows.offsets[1:] - datamodule.rows.offsets[:-1]
    base = DiskStateCache.open(str(tmp_path), target, datamodule.fingerprint(), lengths)
    other_data = DiskStateCache.open(str(tmp_path), target, "another-fingerprint", lengths)
    other = load_target(TargetSpec(path=str(tmp_path / "other"), build={"arch": "qwen3", "seed": 1}))
    other_target = DiskStateCache.open(str(tmp_path), other, datamodule.fingerprint(), lengths)
    assert len({base.directory, other_data.directory, other_target.directory}) == 3
    with open(os.path.join(base.directory, "manifest.json"), "w") as handle:
        handle.write("{}")
    with pytest.raises(ConfigError, match="different cache") as err:
        DiskStateCache.open(str(tmp_path), target, datamodule.fingerprint(), lengths)
    assert err.value.key == "target_cache_dir"  # the field; the training module adds the group


@pytest.mark.parametrize("field, value", [("target_cache_dtype", "float16"), ("target_cache_batch_size", 0)])
def test_bad_disk_cache_settings_are_config_errors(field, value):
    with pytest.raises(ConfigError) as err:
        TrainingSettings(**{field: value})
    assert err.value.key == field  # the field; the CLI adds the group (tests/cli/test_config_schema.py)


def test_a_missing_layer_file_while_reading_names_the_cache(tmp_path, target):
    datamodule = _datamodule(target.tokenizer)
    cache = _cache(tmp_path, target, datamodule, [1])
    with pytest.raises(ConfigError, match="missing"):
        cache.read(torch.tensor([0]), int(np.max(cache.lengths)), [4], torch.float32)


def test_eagle3_trains_from_the_same_cache_without_the_target(tmp_path, target_spec):
    from dflash.methods.eagle3 import Eagle3TrainSettings
    from helpers.training import eagle3_training_module

    losses = []
    for cache_dir in (None, str(tmp_path)):
        module = eagle3_training_module(
            target_spec,
            Eagle3TrainSettings(ttt_length=2, seed=0),
            TrainingSettings(target_cache_dir=cache_dir, target_cache_dtype="float32"),
        )
        datamodule = _datamodule(module.target.tokenizer)
        calls = _counting(module.target)
        if cache_dir is not None:
            module.disk_cache = open_disk_cache(
                module.training_config, module.target, datamodule.rows, datamodule.fingerprint(), module.objective.taps()
            )
            stored = sorted(name for name in os.listdir(module.disk_cache.directory) if name.startswith("layer-"))
            assert stored == [f"layer-{i:02d}" for i in sorted(set(module.objective.taps()))]  # a repeated tap is one file
            calls.clear()
        losses.append((module.compute_loss(next(iter(datamodule.train_dataloader()))).loss.detach(), len(calls)))
    (live, live_calls), (cached, cached_calls) = losses
    assert live_calls == 1 and cached_calls == 0
    torch.testing.assert_close(cached, live, rtol=1e-5, atol=1e-6)
