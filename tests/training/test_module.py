"""The LightningModule: validation, what it trains and saves, a short fit, export."""

import math

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader

from dflash.decoding import generate
from dflash.dflash.proposer import DFlashProposer
from dflash.drafter import load_drafter, save_drafter
from dflash.errors import ConfigError
from dflash.specs import DrafterSpec, TargetSpec, build_drafter, load_target
from dflash.training import TrainingSettings, export_drafter
from dflash.training.export import export_state, read_checkpoint
from dflash.training.module import warmup_cosine_schedule
from helpers.training import dflash_training_module


@pytest.fixture(scope="module")
def target_spec(tmp_path_factory):
    return TargetSpec(path=str(tmp_path_factory.mktemp("target") / "tiny"), build={"arch": "qwen3", "seed": 0})


def _module(target_spec, block_size=4, **training):
    return dflash_training_module(
        target_spec, DrafterSpec(num_layers=1, block_size=block_size, num_target_features=2), TrainingSettings(**training)
    )


def _batches(count, batch_size=3, seq_len=24, seed=0):
    generator = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(count):
        input_ids = torch.randint(0, 256, (batch_size, seq_len), generator=generator)
        attention_mask = torch.ones(batch_size, seq_len, dtype=torch.bool)
        attention_mask[0, seq_len - 5 :] = False
        loss_mask = attention_mask.clone()
        loss_mask[:, :8] = False
        batches.append({"input_ids": input_ids, "attention_mask": attention_mask, "loss_mask": loss_mask})
    return batches


def _loader(batches):
    return DataLoader(batches, batch_size=None)


@pytest.mark.parametrize(
    "choice, device, kernel",
    [("auto", "cuda", "flex_attention"), ("auto", "cpu", "sdpa"), ("flex_attention", "cpu", "sdpa"), ("sdpa", "cuda", "sdpa")],
)
def test_training_attention_is_flex_on_cuda_unless_sdpa_is_asked_for(target_spec, choice, device, kernel):
    """GPU recipes train with flex_attention without saying so (1.7x faster and a third of the
    memory of the factored mask at the paper's shape on an H100); the drafter's own
    attn_implementation (its decoding kernel, here flash_attention_2) does not decide it."""
    drafter = DrafterSpec(num_layers=1, block_size=4, num_target_features=2, attn_implementation="flash_attention_2")
    module = dflash_training_module(target_spec, drafter, TrainingSettings(attention=choice))
    module.objective.on_device(torch.device(device))  # only picks the kernel: no tensor moves
    kernels = {layer.self_attn.attn_implementation for layer in module.drafter.layers}
    assert kernels == {kernel} and module.drafter.config.attn_implementation == kernel


def test_bad_config_is_a_config_error_naming_the_key(target_spec, tmp_path):
    with pytest.raises(ConfigError) as err:
        _module(target_spec, num_anchors=0)
    assert err.value.key == "num_anchors"  # the field; the CLI adds the group
    with pytest.raises(ValueError, match="must be >= 2 for training"):  # the train app refuses it first (check_training)
        _module(target_spec, block_size=1)
    with pytest.raises(ConfigError) as err:
        TrainingSettings(attention="flash_attention_2")
    assert err.value.key == "attention"
    with pytest.raises(ConfigError) as err:
        TrainingSettings(anchor_sampling="everywhere")
    assert err.value.key == "anchor_sampling"


def test_a_drafter_for_another_target_width_is_rejected(target_spec, tmp_path):
    narrow = load_target(TargetSpec(path=str(tmp_path / "narrow"), build={"arch": "qwen3", "hidden_size": 32}))
    save_drafter(build_drafter(DrafterSpec(num_layers=1, block_size=4), narrow), str(tmp_path / "drafter"))
    with pytest.raises(ConfigError) as err:
        dflash_training_module(target_spec, DrafterSpec(path=str(tmp_path / "drafter")), TrainingSettings())
    assert "hidden size" in str(err.value)


def test_only_the_drafter_trains_and_is_saved(target_spec):
    module = _module(target_spec)
    assert all(name.startswith("drafter.") for name in module.state_dict())
    drafter_params = {id(p) for p in module.drafter.parameters()}
    assert {id(p) for p in module.parameters()} == drafter_params
    assert not any(p.requires_grad for p in module.target.model.parameters())
    result = module.compute_loss(_batches(1)[0])
    result.loss.backward()
    assert module.target.lm_head.weight.grad is None and module.target.embed_tokens.weight.grad is None
    assert all(p.grad is not None for p in module.drafter.parameters())


def test_left_padded_batches_are_refused(target_spec):
    batch = _batches(1)[0]
    batch["attention_mask"] = batch["attention_mask"].flip(1)
    module = _module(target_spec)
    module.on_before_batch_transfer(_batches(1)[0], 0)
    with pytest.raises(ValueError, match="right-padded"):
        module.on_before_batch_transfer(batch, 0)


def test_weight_decay_groups_are_chosen_on_the_shapes_at_setup(target_spec):
    module = _module(target_spec, weight_decay=0.1)
    module.trainer = L.Trainer(accelerator="cpu", max_steps=10, logger=False, enable_checkpointing=False, enable_progress_bar=False)
    shapes = [p.shape for p in module.drafter.parameters()]
    matrices = sum(len(shape) >= 2 for shape in shapes)
    assert 0 < matrices < len(shapes)
    module.setup("fit")
    for p in module.drafter.parameters():  # what FSDP does: the same parameters, as 1-D views of a shard
        p.data = p.data.flatten()
    groups = module.configure_optimizers()["optimizer"].param_groups
    assert [(g["weight_decay"], len(g["params"])) for g in groups] == [(0.1, matrices), (0.0, len(shapes) - matrices)]
    module.drafter.norm.weight = torch.nn.Parameter(module.drafter.norm.weight.detach().clone())  # replaced after setup
    with pytest.raises(RuntimeError, match="replaced the drafter's parameters"):
        module.configure_optimizers()


def test_warmup_cosine_schedule():
    schedule = warmup_cosine_schedule(total_steps=100, warmup_ratio=0.04, min_lr_ratio=0.1)
    assert [schedule(s) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert schedule(4 + 48) == pytest.approx(0.1 + 0.9 * 0.5)
    assert schedule(100) == pytest.approx(0.1)


def test_fit_logs_metrics_and_exports_a_drafter_that_decodes(target_spec, tmp_path, monkeypatch):
    module = _module(target_spec, num_anchors=6, learning_rate=3e-3)
    trainer = L.Trainer(
        accelerator="cpu",
        max_steps=12,
        log_every_n_steps=4,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        gradient_clip_val=1.0,
    )
    train, val = _batches(12, seed=1), _batches(2, seed=2)
    before = trainer.validate(module, _loader(val), verbose=False)[0]
    trainer.fit(module, _loader(train), _loader(val))
    metrics = trainer.callback_metrics
    expected = {"train/loss", "train/tau_sim", "val/loss", "val/tau_sim"} | {
        f"{p}/acc_0{k}" for p in ("train", "val") for k in (1, 2, 3)
    }
    assert expected <= set(metrics)
    assert 1.0 <= float(metrics["val/tau_sim"]) <= 4.0
    assert float(metrics["val/loss"]) < before["val/loss"]
    scheduler = trainer.lr_scheduler_configs[0].scheduler
    assert scheduler.get_last_lr()[0] == pytest.approx(3e-3 * warmup_cosine_schedule(12, 0.04)(12))

    checkpoint = tmp_path / "last.ckpt"
    trainer.save_checkpoint(checkpoint)
    state = torch.load(checkpoint, map_location="cpu", weights_only=True)["state_dict"]
    assert state and all(name.startswith("drafter.") for name in state)

    # Exporting a checkpoint must not load the target.
    def no_target(*args, **kwargs):
        raise AssertionError("exporting a checkpoint loaded the target")

    monkeypatch.setattr("dflash.target.TargetModel.load", no_target)
    export_state(read_checkpoint(str(checkpoint)), str(tmp_path / "from_ckpt"))  # as python -m dflash.export does
    monkeypatch.undo()
    export_drafter(module, str(tmp_path / "from_module"))
    from_ckpt = load_drafter(str(tmp_path / "from_ckpt"))
    from_module = load_drafter(str(tmp_path / "from_module"))
    for name, tensor in module.drafter.state_dict().items():
        assert torch.equal(from_ckpt.state_dict()[name], tensor)
        assert torch.equal(from_module.state_dict()[name], tensor)
    assert from_ckpt.config.to_hf_dict() == from_module.config.to_hf_dict()

    target = module.target
    prompt = torch.tensor([[3, 14, 15, 92, 65]])
    proposer = DFlashProposer(from_ckpt, target.embed, target.logits)
    speculative = generate(target, prompt, max_new_tokens=20, block_size=4, proposer=proposer)
    plain = generate(target, prompt, max_new_tokens=20)
    assert speculative.output_ids == plain.output_ids
    assert math.isfinite(speculative.tau) and speculative.tau >= 1.0
