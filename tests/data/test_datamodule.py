"""The DataModule: batch contract, deterministic split, tokenisation cache, shipped configs."""

from __future__ import annotations

import json

import lightning as L
import pytest
import torch

from dflash.data import DataSpec, TokenizeSettings
from dflash.data import datamodule as datamodule_module
from dflash.data.datamodule import DFlashDataModule, split_conversations
from dflash.errors import ConfigError
from dflash.toy.tiny import byte_tokenizer


def conversations(count: int) -> list[dict]:
    return [
        {
            "messages": [
                {"role": "user", "content": f"question {i} " + "?" * (3 * (i % 7))},
                {"role": "assistant", "content": f"answer {i} " + "!" * i},
            ]
        }
        for i in range(count)
    ]


def test_batches_follow_the_contract():
    tokenizer = byte_tokenizer(chat_template=True)
    module = DFlashDataModule(conversations(12), tokenizer, batch_size=4, val_fraction=0.25, seed=0)
    module.setup("fit")
    batch = next(iter(module.train_dataloader()))
    assert set(batch) == {"input_ids", "loss_mask", "attention_mask", "row_index"}
    assert batch["input_ids"].dtype == torch.long
    assert batch["loss_mask"].dtype == torch.bool and batch["attention_mask"].dtype == torch.bool
    assert batch["input_ids"].shape == batch["loss_mask"].shape == batch["attention_mask"].shape
    assert batch["input_ids"].shape[0] == 4
    lengths = batch["attention_mask"].sum(1)
    assert lengths.max() == batch["input_ids"].shape[1]  # padded to the longest sequence only
    for row in range(4):
        real = int(lengths[row])
        assert batch["attention_mask"][row, :real].all()  # right padding
        assert (batch["input_ids"][row, real:] == tokenizer.pad_token_id).all()
        assert not batch["loss_mask"][row, real:].any()
        assert not (batch["loss_mask"][row] & ~batch["attention_mask"][row]).any()
        response = tokenizer.decode(batch["input_ids"][row][batch["loss_mask"][row]])
        assert response.startswith("answer ") and response.endswith("<|im_end|>")
        # row_index names the tokenised row the sequence came from (the feature cache's key)
        assert module.rows[int(batch["row_index"][row])]["input_ids"] == batch["input_ids"][row, :real].tolist()
    held_out = next(iter(module.val_dataloader()))["row_index"].tolist()
    assert not set(held_out) & set(batch["row_index"].tolist())


def test_pad_falls_back_to_eos():
    tokenizer = byte_tokenizer()
    tokenizer.pad_token = None
    module = DFlashDataModule(conversations(3), tokenizer, val_fraction=0.0)
    assert module.collate.pad_id == tokenizer.eos_token_id


def test_split_is_deterministic_disjoint_and_survives_max_length_changes():
    train, held_out = split_conversations(100, 0.1, seed=3)
    again_train, again_held_out = split_conversations(100, 0.1, seed=3)
    assert train.tolist() == again_train.tolist() and held_out.tolist() == again_held_out.tolist()
    assert len(held_out) == 10 and set(train.tolist()) | set(held_out.tolist()) == set(range(100))
    assert split_conversations(100, 0.1, seed=4)[1].tolist() != held_out.tolist()
    assert len(split_conversations(5, 0.01, seed=0)[1]) == 1  # a held-out row whenever asked for one
    assert len(split_conversations(5, 0.0, seed=0)[1]) == 0

    tokenizer = byte_tokenizer(chat_template=True)
    held_out_prompts = []
    for max_length in (3072, 40):  # at 40 tokens the longest prompts leave no response token
        module = DFlashDataModule(conversations(30), tokenizer, TokenizeSettings(max_length=max_length), val_fraction=0.2, seed=1)
        module.setup("fit")
        held_out_prompts.append(
            {tokenizer.decode(module.val_set[i]["input_ids"]).split("\n")[1] for i in range(len(module.val_set))}
        )
        if max_length == 40:
            assert module.num_dropped > 0
            assert len(module.train_set) + len(module.val_set) == 30 - module.num_dropped
    assert held_out_prompts[1] <= held_out_prompts[0]


def test_reads_regenerated_shards_and_caches_tokens(tmp_path, monkeypatch):
    shards = tmp_path / "regenerated"
    shards.mkdir()
    (shards / "rows-00000000-00000010.jsonl").write_text("".join(json.dumps(r) + "\n" for r in conversations(10)))
    (shards / "manifest.json").write_text(json.dumps({"settings": {"enable_thinking": False}}))
    tokenizer = byte_tokenizer(chat_template=True)
    spec = DataSpec(path=str(shards), batch_size=2, val_fraction=0.2, num_workers=0, cache_dir=str(tmp_path / "cache"))
    module = DFlashDataModule.from_spec(spec, tokenizer)
    module.prepare_data()
    module.setup("fit")
    assert len(list((tmp_path / "cache").iterdir())) == 1
    assert module.rows.counts["from_text"] == 10  # shards without token ids (older format) load from text

    def no_tokenising(*args, **kwargs):
        raise AssertionError("the cache should have been used")

    monkeypatch.setattr(datamodule_module, "tokenize_conversations", no_tokenising)
    cached = DFlashDataModule.from_spec(spec, tokenizer)
    cached.setup("fit")
    assert [cached.train_set[i] for i in range(len(cached.train_set))] == [
        module.train_set[i] for i in range(len(module.train_set))
    ]

    with pytest.raises(ConfigError) as err:
        DFlashDataModule.from_spec(DataSpec(path=str(shards), enable_thinking=True), tokenizer)
    assert err.value.key == "data.enable_thinking"


def test_bad_inputs_name_their_keys(tmp_path):
    tokenizer = byte_tokenizer()
    with pytest.raises(ConfigError) as err:
        DFlashDataModule(conversations(3), tokenizer, TokenizeSettings(require_chat_template=True))
    assert err.value.key == "data.require_chat_template"
    with pytest.raises(ConfigError) as err:
        DFlashDataModule(conversations(3), tokenizer, val_fraction=1.0)
    assert err.value.key == "data.val_fraction"
    with pytest.raises(ConfigError) as err:
        DFlashDataModule(conversations(3), tokenizer, batch_size=0)
    assert err.value.key == "data.batch_size"
    missing = DFlashDataModule(str(tmp_path / "missing.jsonl"), tokenizer)
    with pytest.raises(ConfigError) as err:
        missing.setup("fit")
    assert err.value.key == "data.path"


class ContractChecker(L.LightningModule):
    """Fails the run if a batch breaks the contract; learns nothing."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(()))
        self.seen = 0

    def training_step(self, batch, batch_index):
        assert batch["loss_mask"].any() and batch["attention_mask"].dtype == torch.bool
        self.seen += batch["input_ids"].shape[0]
        return self.weight * batch["loss_mask"].sum()

    def validation_step(self, batch, batch_index):
        assert batch["input_ids"].dtype == torch.long

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_runs_under_a_lightning_trainer():
    module = DFlashDataModule(conversations(8), byte_tokenizer(chat_template=True), batch_size=2, val_fraction=0.25)
    model = ContractChecker()
    trainer = L.Trainer(
        max_epochs=1, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False, enable_progress_bar=False
    )
    trainer.fit(model, datamodule=module)
    assert model.seen == 6
    # Plain shuffling loader: under DDP Lightning swaps in its DistributedSampler.
    assert isinstance(module.train_dataloader().sampler, torch.utils.data.RandomSampler)


@pytest.mark.parametrize("name", ["local_jsonl", "nemotron_codealpaca", "ultrachat_sharegpt"])
def test_shipped_data_configs_build(name, tmp_path):
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from dflash.cli.common import CONF_DIR
    from dflash.structured import typed

    overrides = [f"data={name}", f"paths.root={tmp_path}", "target=qwen3_8b"]
    if name == "local_jsonl":
        overrides.append("data.path=chats.jsonl")
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("regenerate", overrides=overrides)
    spec = typed(DataSpec, OmegaConf.to_container(cfg.data, resolve=True), "data")
    spec.tokenize_settings().validate(byte_tokenizer(chat_template=True))
    assert cfg.regenerate.enable_thinking == spec.enable_thinking
    if name != "local_jsonl":
        assert spec.sources and spec.path.endswith("Qwen/Qwen3-8B")
