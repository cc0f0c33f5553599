"""The EAGLE-3 directory as SGLang and vLLM read it: config.json keys, and every weight
mapped to the engine's parameter of the right shape by each engine's own renaming rules
(`load_weights` of sglang/srt/models/llama_eagle3.py and
vllm/model_executor/models/llama_eagle3.py), plus `method=eagle3` training plumbing."""

import json
import os
import sys

import pytest
import torch
from safetensors import safe_open

from dflash.cli.train import job_from_config
from dflash.eagle3 import Eagle3Config, Eagle3Drafter, load_eagle3, save_eagle3
from dflash.errors import ConfigError
from dflash.methods.dflash import DFlashTrainSettings
from dflash.methods.eagle3 import Eagle3TrainSettings
from dflash.specs import TargetSpec
from dflash.target.rope_keys import full_attention_rope
from dflash.training.checkpoints import check_checkpoint_fits
from dflash.training.config import TrainingSettings
from helpers.apps import compose_train
from helpers.training import eagle3_training_module

STACKED = [
    (".qkv_proj", ".q_proj"),
    (".qkv_proj", ".k_proj"),
    (".qkv_proj", ".v_proj"),
    (".gate_up_proj", ".gate_proj"),
    (".gate_up_proj", ".up_proj"),
]


def engine_parameters(config: dict, layer_prefix: str) -> dict[str, tuple]:
    """Parameter shapes of the engine's EAGLE-3 model, computed from config.json as the
    engines size them (qkv reads 2 x hidden; fc reads 3 x target_hidden_size)."""
    h, d, i = config["hidden_size"], config["head_dim"], config["intermediate_size"]
    heads, kv = config["num_attention_heads"], config["num_key_value_heads"]
    layer = {
        "self_attn.qkv_proj.weight": ((heads + 2 * kv) * d, 2 * h),
        "self_attn.o_proj.weight": (h, heads * d),
        "mlp.gate_up_proj.weight": (2 * i, h),
        "mlp.down_proj.weight": (h, i),
        "input_layernorm.weight": (h,),
        "hidden_norm.weight": (h,),
        "post_attention_layernorm.weight": (h,),
    }
    params = {f"model.{layer_prefix}.{name}": shape for name, shape in layer.items()}
    params.update({"model.fc.weight": (h, 3 * config["target_hidden_size"]), "model.norm.weight": (h,)})
    params["lm_head.weight"] = (config["draft_vocab_size"], h)
    return params


def vllm_name(name: str) -> str | None:
    """Eagle3LlamaForCausalLM.load_weights then LlamaModel.load_weights."""
    if "t2d" in name:
        return None
    if "d2t" in name:
        return name.replace("d2t", "draft_id_to_target_id")
    if "lm_head" not in name:
        name = "model." + name
    return name.replace("midlayer.", "layers.0.")


def sglang_name(name: str, params: dict) -> str | None:
    """LlamaForCausalLMEagle3.load_weights (d2t becomes hot_token_id, not a parameter)."""
    if "d2t" in name or "t2d" in name:
        return None
    return name if name in params else f"model.{name}"


def load_like(path: str, rename, params: dict) -> dict[str, tuple]:
    """Shapes each engine parameter receives; stacked shards add up along dim 0."""
    loaded: dict[str, list] = {}
    with safe_open(os.path.join(path, "model.safetensors"), "pt") as f:
        for name in f.keys():
            target = rename(name)
            if target is None:
                continue
            shape = tuple(f.get_slice(name).get_shape())
            for stacked, shard in STACKED:
                if shard in target:
                    target = target.replace(shard, stacked)
                    break
            loaded.setdefault(target, []).append(shape)
    return {name: (sum(s[0] for s in shapes), *shapes[0][1:]) for name, shapes in loaded.items()}


@pytest.fixture(scope="module")
def exported(qwen3_target, tmp_path_factory):
    torch.manual_seed(0)
    drafter = Eagle3Drafter(Eagle3Config.from_target(qwen3_target.config, draft_vocab_size=100))
    drafter.set_draft_vocab(torch.arange(0, 200, 2))
    path = str(tmp_path_factory.mktemp("eagle3"))
    save_eagle3(drafter, path, dtype=torch.bfloat16)
    return drafter, path, json.load(open(os.path.join(path, "config.json")))


def test_config_has_the_keys_the_engines_read(exported, qwen3_target):
    drafter, path, config = exported
    assert config["architectures"] == ["LlamaForCausalLMEagle3"] and config["model_type"] == "llama"
    assert config["num_hidden_layers"] == 1 and config["tie_word_embeddings"] is False
    assert (config["vocab_size"], config["draft_vocab_size"]) == (qwen3_target.config.vocab_size, 100)
    assert config["target_hidden_size"] == qwen3_target.config.hidden_size
    ids = drafter.config.target_layer_ids
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == ids  # SGLang adds 1 itself
    assert config["eagle_aux_hidden_state_layer_ids"] == [i + 1 for i in ids]  # vLLM: captured layer inputs
    assert config["torch_dtype"] == "bfloat16"
    from transformers import AutoConfig

    hf = AutoConfig.from_pretrained(path)  # what both engines build their hf_config with
    assert hf.draft_vocab_size == 100 and hf.eagle_config["eagle_aux_hidden_state_layer_ids"] == ids
    assert full_attention_rope(hf.to_dict()) == full_attention_rope(qwen3_target.config.to_dict())


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_every_weight_lands_on_an_engine_parameter_of_its_shape(exported, engine):
    _, path, config = exported
    params = engine_parameters(config, "layers.0" if engine == "vllm" else "midlayer")
    if engine == "vllm":
        params["draft_id_to_target_id"] = (config["draft_vocab_size"],)
        loaded = load_like(path, vllm_name, params)
    else:
        loaded = load_like(path, lambda name: sglang_name(name, params), params)
    assert loaded == params


def test_dtypes_and_the_vocabulary_maps(exported):
    drafter, path, _ = exported
    with safe_open(os.path.join(path, "model.safetensors"), "pt") as f:
        tensors = {name: f.get_tensor(name) for name in f.keys()}
    assert tensors["d2t"].dtype == torch.int64 and tensors["t2d"].dtype == torch.bool
    assert {t.dtype for name, t in tensors.items() if name not in ("d2t", "t2d")} == {torch.bfloat16}
    hot_token_id = tensors["d2t"] + torch.arange(tensors["d2t"].numel())  # SGLang's reading
    assert hot_token_id.tolist() == list(range(0, 200, 2))
    assert tensors["t2d"].nonzero().flatten().tolist() == list(range(0, 200, 2))
    loaded = load_eagle3(path, dtype=torch.float32)
    hidden = torch.randn(3, drafter.config.hidden_size)
    torch.testing.assert_close(loaded.target_logits(hidden), drafter.to(torch.bfloat16).float().target_logits(hidden))


def test_method_group_selects_eagle3():
    job = job_from_config(compose_train(["method=eagle3", "method.ttt_length=3", "data.path=chats.jsonl"]))
    assert isinstance(job.method_settings, Eagle3TrainSettings) and job.method_settings.ttt_length == 3
    assert job.method.architectures == ("LlamaForCausalLMEagle3",)
    default = job_from_config(compose_train(["data.path=chats.jsonl"]))  # DFlash stays the default
    assert isinstance(default.method_settings, DFlashTrainSettings) and default.method.architectures == ("DFlashDraftModel",)
    with pytest.raises(ConfigError, match="method"):
        job_from_config(compose_train(["method=eagle3", "method.ttt_length=0", "data.path=chats.jsonl"]))
    # the name contradicting the chosen option would hand DFlash's settings to EAGLE-3
    with pytest.raises(ConfigError, match="pick the method with method=eagle3") as info:
        job_from_config(compose_train(["method.name=eagle3", "data.path=chats.jsonl"]))
    assert info.value.key == "method.name"


def test_training_module_loss_and_export_of_its_checkpoint_by_the_export_app(tmp_path, monkeypatch, capsys):
    spec = TargetSpec(path=str(tmp_path / "target"), dtype="float32", build={"arch": "llama", "seed": 0})
    module = eagle3_training_module(spec, Eagle3TrainSettings(ttt_length=3), TrainingSettings())
    ids = torch.randint(0, 200, (2, 24))
    batch = {
        "input_ids": ids,
        "loss_mask": torch.ones_like(ids, dtype=torch.bool),
        "attention_mask": torch.ones_like(ids, dtype=torch.bool),
    }
    batch["attention_mask"][1, 20:] = False
    result = module.compute_loss(batch)
    assert torch.isfinite(result.loss) and set(result.slots.tolist()) == {1, 2, 3}
    result.loss.backward()
    assert module.drafter.fc.weight.grad.abs().sum() > 0 and module.target.embed_tokens.weight.grad is None
    checkpoint = {"state_dict": {f"drafter.{k}": v for k, v in module.drafter.state_dict().items()}}
    module.on_save_checkpoint(checkpoint)
    torch.save(checkpoint, tmp_path / "last.ckpt")
    check_checkpoint_fits(str(tmp_path / "last.ckpt"), module, "run_name")  # resume accepts it
    other = eagle3_training_module(spec, Eagle3TrainSettings(intermediate_size=32), TrainingSettings())
    with pytest.raises(ConfigError, match="intermediate_size"):
        check_checkpoint_fits(str(tmp_path / "last.ckpt"), other, "run_name")
    from dflash.cli.export import main as export_main

    out = str(tmp_path / "drafter")
    monkeypatch.setattr(sys, "argv", ["dflash.export", f"ckpt={tmp_path / 'last.ckpt'}", f"out={out}"])
    export_main()  # `python -m dflash.export` tells the method from the checkpoint
    assert f"drafter: {out}" in capsys.readouterr().out
    assert json.load(open(os.path.join(out, "config.json")))["architectures"] == ["LlamaForCausalLMEagle3"]
    hidden = torch.randn(2, module.drafter.config.hidden_size)
    torch.testing.assert_close(load_eagle3(out).target_logits(hidden), module.drafter.target_logits(hidden))


def test_exported_files_are_readable_by_others(exported):
    _, path, _ = exported
    umask = os.umask(0)
    os.umask(umask)
    for name in ("config.json", "model.safetensors"):
        assert os.stat(os.path.join(path, name)).st_mode & 0o777 == 0o666 & ~umask, name
