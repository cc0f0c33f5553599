"""`training.optimizer=muon` (dflash.training.optimizers): which parameters Muon steps, one
step of each group against what Muon and AdamW do, the schedule over both learning rates,
a state_dict round trip, bad values, FSDP refused, and the train app end to end (a short
run through the CLI, a killed run resumed)."""

from __future__ import annotations

import copy
import csv
import io
import os
import subprocess
import sys

import lightning as L
import pytest
import torch
from torch import nn

from dflash.drafter.heads import CandidateSelector, ConfidenceHead, GroupedDynamicConv, MarkovHead
from dflash.errors import ConfigError
from dflash.specs import DrafterSpec, TargetSpec
from dflash.toy.tiny import save_tiny_target
from dflash.training import TrainingSettings
from dflash.training.module import warmup_cosine_schedule
from dflash.training.optimizers import MuonAdamW, build_optimizer, muon_parameters
from dflash.training.run import run_training
from helpers import REPO
from helpers.apps import assert_one_error_line, run_main, write_conversations
from helpers.training import MAX_STEPS, KillAtStep, Killed, checkpoint, dflash_training_module, training_job

MUON = {"optimizer": "muon", "weight_decay": 0.0, "muon_weight_decay": 0.0}
DRAFTER = DrafterSpec(num_layers=1, block_size=4, num_target_features=2)


@pytest.fixture(scope="module")
def target_spec(tmp_path_factory):
    return TargetSpec(path=str(tmp_path_factory.mktemp("target") / "tiny"), build={"arch": "qwen3", "seed": 0})


class Toy(nn.Module):
    """One parameter of every kind a drafter has: hidden matrices, a token embedding under a
    neutral name, DSpark's and DFlash2's heads, a `[1, N]` head, a 3-D kernel, norms, biases."""

    def __init__(self, hidden=16, vocab=40, rank=4):
        super().__init__()
        self.proj = nn.Linear(2 * hidden, hidden)  # (16, 32) and a bias
        self.tokens = nn.Embedding(vocab, hidden)  # a table by its module, whatever its name
        self.lm_head = nn.Linear(hidden, vocab, bias=False)
        self.markov_head = MarkovHead(vocab, rank)
        self.confidence_head = ConfidenceHead(hidden, rank)
        self.conv = GroupedDynamicConv(hidden, kernel_size=2, group_size=4)
        self.candidate_selector = CandidateSelector(hidden, vocab, rank)
        self.norm = nn.Parameter(torch.ones(hidden))
        self.frozen = nn.Linear(hidden, hidden, bias=False).requires_grad_(False)


def _names(model: nn.Module, params) -> set[str]:
    ids = {id(p) for p in params}
    return {name for name, p in model.named_parameters() if id(p) in ids}


def _optimizer(model: nn.Module, **settings) -> torch.optim.Optimizer:
    """`build_optimizer` as the module calls it: AdamW decays what has dim >= 2."""
    matrices = {id(p) for p in model.parameters() if p.dim() >= 2}
    return build_optimizer(model, TrainingSettings(**settings), matrices)


def _fill_gradients(model: nn.Module, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    for p in model.parameters():
        if p.requires_grad:
            p.grad = torch.randn(p.shape, generator=generator)


def test_muon_takes_the_hidden_matrices_and_adamw_the_token_tables_and_the_rest():
    model = Toy()
    muon = _names(model, muon_parameters(model))
    assert muon == {"proj.weight", "conv.kernel_projection.weight", "candidate_selector.hidden_projection.weight"}
    groups = _optimizer(model, optimizer="muon", weight_decay=0.1).param_groups
    assert [g["name"] for g in groups] == ["muon", "matrices", "norms_biases"]
    assert _names(model, groups[0]["params"]) == muon
    assert _names(model, groups[1]["params"]) == {
        "tokens.weight",
        "lm_head.weight",
        "markov_head.markov_w1.weight",
        "markov_head.markov_w2.weight",
        "confidence_head.proj.weight",  # (1, D + R): a vector, not a matrix to orthogonalise
        "conv.base_kernel",  # 3-D
        "candidate_selector.predecessor_codebook",
        "candidate_selector.successor_codebook",
    }
    assert _names(model, groups[2]["params"]) == {"proj.bias", "confidence_head.proj.bias", "norm"}
    assert [g["weight_decay"] for g in groups] == [0.1, 0.1, 0.0]  # Muon's own, then AdamW's split
    assert "frozen.weight" not in _names(model, [p for g in groups for p in g["params"]])


def test_the_drafter_trains_its_matrices_with_muon_at_ten_times_the_learning_rate(target_spec):
    module = dflash_training_module(target_spec, DRAFTER, TrainingSettings(optimizer="muon", learning_rate=1e-4))
    module.trainer = L.Trainer(accelerator="cpu", max_steps=10, logger=False, enable_checkpointing=False, enable_progress_bar=False)
    module.setup("fit")
    optimizer = module.configure_optimizers()["optimizer"]
    muon, matrices, norms = optimizer.param_groups
    params = dict(module.drafter.named_parameters())
    assert _names(module.drafter, muon["params"]) == {name for name, p in params.items() if p.dim() == 2}
    assert matrices["params"] == [] and _names(module.drafter, norms["params"]) == {n for n, p in params.items() if p.dim() == 1}
    assert muon["initial_lr"] == pytest.approx(1e-3) and norms["initial_lr"] == 1e-4
    assert (muon["momentum"], muon["weight_decay"], muon["ns_steps"], muon["adjust_lr_fn"]) == (0.95, 0.1, 5, "match_rms_adamw")
    assert isinstance(optimizer, MuonAdamW) and isinstance(optimizer.muon, torch.optim.Muon)
    assert _optimizer(Toy(), muon_lr=2e-3, optimizer="muon").param_groups[0]["lr"] == 2e-3
    assert type(_optimizer(Toy())) is torch.optim.AdamW  # the default is the plain AdamW of before


def test_one_step_orthogonalises_muon_updates_and_takes_adams_step_elsewhere():
    model = Toy()
    optimizer = _optimizer(model, learning_rate=1e-3, muon_lr=1e-2, **MUON)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    _fill_gradients(model, seed=0)
    # an ill-conditioned gradient: singular values from 1 down to 0.01
    u, _ = torch.linalg.qr(torch.randn(16, 16, generator=torch.Generator().manual_seed(1)))
    v, _ = torch.linalg.qr(torch.randn(32, 16, generator=torch.Generator().manual_seed(2)))
    model.proj.weight.grad = u @ torch.diag(torch.logspace(0, -2, 16)) @ v.T
    calls = []
    loss = optimizer.step(lambda: calls.append(1) or torch.tensor(3.0))
    assert calls == [1] and float(loss) == 3.0  # the closure once, its value returned
    delta = model.proj.weight.detach() - before["proj.weight"]
    singular = torch.linalg.svdvals(delta) / (1e-2 * 0.2 * 32**0.5)  # match_rms_adamw: lr 0.2 sqrt(max(A, B))
    assert 0.6 < float(singular.min()) and float(singular.max()) < 1.4  # Newton-Schulz: all near 1, not 1 .. 0.01
    # Adam's first step is lr * sign(gradient) wherever the gradient is well above eps
    for name in ("proj.bias", "tokens.weight", "markov_head.markov_w1.weight", "norm"):
        p = model.get_parameter(name)
        expected = before[name] - 1e-3 * torch.sign(p.grad)
        torch.testing.assert_close(p.detach(), expected, atol=1e-6, rtol=0)


def test_the_composite_steps_as_muon_and_adamw_each_alone_would():
    """Three steps with momentum and weight decay, against the two torch optimizers built by hand."""
    settings = {"learning_rate": 1e-3, "muon_lr": 5e-3, "weight_decay": 0.1, "muon_weight_decay": 0.05}
    model = Toy()
    twin, start = copy.deepcopy(model), model.proj.weight.detach().clone()
    optimizer = _optimizer(model, optimizer="muon", muon_momentum=0.9, muon_ns_steps=3, **settings)
    muon_twin = muon_parameters(twin)
    ids = {id(p) for p in muon_twin}
    rest = [p for p in twin.parameters() if p.requires_grad and id(p) not in ids]
    alone = [
        torch.optim.Muon(muon_twin, lr=5e-3, weight_decay=0.05, momentum=0.9, ns_steps=3, adjust_lr_fn="match_rms_adamw"),
        torch.optim.AdamW(
            [{"params": [p for p in rest if p.dim() >= 2], "weight_decay": 0.1}, {"params": [p for p in rest if p.dim() < 2]}],
            lr=1e-3,
            weight_decay=0.0,
        ),
    ]
    for step in range(3):
        _fill_gradients(model, seed=step)
        _fill_gradients(twin, seed=step)
        optimizer.step()
        for inner in alone:
            inner.step()
    for (name, p), q in zip(model.named_parameters(), twin.parameters()):
        assert torch.equal(p, q), name
    assert not torch.equal(model.proj.weight, start)  # it did move


def test_the_schedule_sets_every_groups_learning_rate():
    optimizer = _optimizer(Toy(), learning_rate=1e-3, muon_lr=2e-2, **MUON)
    schedule = warmup_cosine_schedule(total_steps=20, warmup_ratio=0.1, min_lr_ratio=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
    for step in range(1, 12):
        optimizer.step()
        scheduler.step()
        factor = schedule(step)
        assert [g["lr"] for g in optimizer.muon.param_groups] == [pytest.approx(2e-2 * factor)]
        assert [g["lr"] for g in optimizer.adamw.param_groups] == [pytest.approx(1e-3 * factor)] * 2
    # the composite's groups are the inner optimizers' own dicts
    assert all(a is b for a, b in zip(optimizer.param_groups, [*optimizer.muon.param_groups, *optimizer.adamw.param_groups]))


def _checkpointed(state: dict) -> dict:
    """`state` through torch.save / torch.load, as a checkpoint carries it."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


def test_a_restored_optimizer_takes_the_uninterrupted_next_step():
    model = Toy()
    optimizer = _optimizer(model, learning_rate=1e-3, optimizer="muon", weight_decay=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_cosine_schedule(10, 0.2))
    for step in range(3):
        _fill_gradients(model, seed=step)
        optimizer.step()
        scheduler.step()
    saved, saved_schedule = _checkpointed(optimizer.state_dict()), scheduler.state_dict()
    assert set(saved) == {"muon", "adamw"}
    assert len(saved["muon"]["state"]) == 3 and len(saved["adamw"]["state"]) == len(list(Toy().parameters())) - 4

    resumed_model = copy.deepcopy(model)
    resumed = _optimizer(resumed_model, learning_rate=1e-3, optimizer="muon", weight_decay=0.1)
    resumed_scheduler = torch.optim.lr_scheduler.LambdaLR(resumed, warmup_cosine_schedule(10, 0.2))
    resumed.load_state_dict(saved)
    resumed_scheduler.load_state_dict(saved_schedule)
    assert all(a is b for a, b in zip(resumed.param_groups, [*resumed.muon.param_groups, *resumed.adamw.param_groups]))
    assert len(resumed.state) == len(optimizer.state) == 14  # every trainable parameter's, through the view
    for step in (3, 4):
        for m, o, s in ((model, optimizer, scheduler), (resumed_model, resumed, resumed_scheduler)):
            _fill_gradients(m, seed=step)
            o.step()
            s.step()
    for (name, p), q in zip(model.named_parameters(), resumed_model.parameters()):
        assert torch.equal(p, q), name
    assert [g["lr"] for g in resumed.muon.param_groups] == [g["lr"] for g in optimizer.muon.param_groups]

    plain_adamw = _checkpointed(_optimizer(Toy()).state_dict())  # a checkpoint of training.optimizer=adamw
    with pytest.raises(ConfigError) as err:
        resumed.load_state_dict(plain_adamw)
    assert err.value.key == "training.optimizer"


@pytest.mark.parametrize(
    "key, value, text",
    [
        ("optimizer", "sgd", "choose one of ['adamw', 'muon']"),
        ("muon_lr", 0.0, "must be > 0 or null"),
        ("muon_momentum", 1.0, "must be in [0, 1)"),
        ("muon_momentum", -0.1, "must be in [0, 1)"),
        ("muon_weight_decay", -0.1, "must be >= 0"),
        ("muon_ns_steps", 0, "must be in [1, 99]"),
        ("muon_ns_steps", 100, "must be in [1, 99]"),
        ("muon_adjust_lr_fn", "none", "choose one of ['match_rms_adamw', 'original']"),
    ],
)
def test_bad_muon_settings_are_refused_naming_the_key(key, value, text):
    with pytest.raises(ConfigError) as err:
        TrainingSettings(**{key: value})
    assert err.value.key == key and text in err.value.reason and "\n" not in str(err.value)


def test_a_bad_muon_setting_on_the_command_line_is_one_error_line(tmp_path, monkeypatch, capsys):
    argv = [f"paths.artifacts={tmp_path}", "data.path=unused.jsonl", "training.optimizer=muon", "training.muon_momentum=1.5"]
    assert_one_error_line(*run_main("train", argv, monkeypatch, capsys), "training.muon_momentum", "must be in [0, 1)")


def test_muon_is_refused_under_fsdp_before_anything_loads(tmp_path, monkeypatch, capsys):
    argv = [f"paths.artifacts={tmp_path}", "data.path=unused.jsonl", "training.optimizer=muon", "trainer=fsdp"]
    assert_one_error_line(*run_main("train", argv, monkeypatch, capsys), "training.optimizer", "untested under trainer=fsdp")


# --- the train app ---------------------------------------------------------------------


@pytest.mark.slow
def test_the_train_app_trains_with_muon(tmp_path):
    """`python -m dflash.train experiment=tiny_cpu training.optimizer=muon`, 3 steps: both
    optimizers' states are checkpointed and both learning rates logged."""
    save_tiny_target(str(tmp_path / "artifacts" / "targets" / "tiny_qwen3_random"), arch="qwen3", seed=0)
    write_conversations(tmp_path / "chats.jsonl", 8)
    args = [
        "experiment=tiny_cpu",
        f"paths.artifacts={tmp_path / 'artifacts'}",
        f"data.path={tmp_path / 'chats.jsonl'}",
        "training.optimizer=muon",
        "training.learning_rate=1e-4",
        "trainer.max_steps=3",
        "trainer.log_every_n_steps=1",
        "trainer.val_check_interval=3",
        "checkpoint.every_n_train_steps=3",
        "eval.after_train=false",
        "logger=csv",
        "trainer.enable_progress_bar=false",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    env.pop("WANDB_API_KEY", None)
    result = subprocess.run(
        [sys.executable, "-m", "dflash.train", *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "trained to global step 3" in result.stdout
    (run_dir,) = (tmp_path / "artifacts" / "runs").iterdir()
    saved = torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    (state,) = saved["optimizer_states"]
    assert set(state) == {"muon", "adamw"}
    assert len(state["muon"]["state"]) == 8  # q, k, v, o, gate, up, down, fc: a momentum each
    assert all(set(s) == {"momentum_buffer"} for s in state["muon"]["state"].values())
    assert all({"exp_avg", "exp_avg_sq"} <= set(s) for s in state["adamw"]["state"].values())
    with open(run_dir / "csv" / "version_0" / "metrics.csv") as f:
        rows = [row for row in csv.DictReader(f) if row.get("train/lr/muon")]
    assert rows and all(float(row["train/lr/muon"]) == pytest.approx(10 * float(row["train/lr/norms_biases"])) for row in rows)


def _same(a, b) -> bool:
    """Equal nested dicts/lists of tensors and numbers, bit for bit."""
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


@pytest.mark.slow
def test_a_killed_muon_run_resumes_as_if_uninterrupted(tmp_path):
    """tests/training/test_resume.py's deterministic job (one training sequence, every anchor)
    with Muon: killed after its step-3 checkpoint and resumed, it ends where the uninterrupted
    run ends, weights, both optimizers' states and the schedule."""
    deterministic = ("data.batch_size=1", "data.val_fraction=0.5", "training.num_anchors=512", "training.optimizer=muon")
    straight = training_job(tmp_path, "straight", 2, *deterministic)
    assert run_training(straight).global_step == MAX_STEPS
    killed = training_job(tmp_path, "killed", 2, *deterministic)
    with pytest.raises(Killed):
        run_training(killed, callbacks=[KillAtStep(4)])
    assert checkpoint(killed)["global_step"] == 3
    outcome = run_training(killed)
    assert outcome.resumed_from is not None and outcome.global_step == MAX_STEPS
    final, reference = checkpoint(killed), checkpoint(straight)
    assert set(final["optimizer_states"][0]) == {"muon", "adamw"}
    assert _same(final["state_dict"], reference["state_dict"])
    assert _same(final["optimizer_states"], reference["optimizer_states"])
    assert _same(final["lr_schedulers"], reference["lr_schedulers"])
