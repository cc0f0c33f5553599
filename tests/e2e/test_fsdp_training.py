"""`trainer=fsdp` for real: `python -m dflash.train` on 2 CPU processes (gloo), each drafter
layer an FSDP unit, against `trainer=ddp` on the same data. Both runs draw the same anchors
on each rank and average gradients over ranks, so their weights agree to float rounding,
also where FSDP needs its own code: clipping by the norm over all shards and weight decay
on the matrices only (dflash.training.module, dflash.training.fsdp). The drafters both
export hold the checkpoint's weights, load and decode losslessly, and draft what the same
weights rebuilt in process draft; the FSDP checkpoint resumes with its optimizer state."""

import json
import re
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from dflash.decoding import generate
from dflash.dflash.proposer import DFlashProposer
from dflash.drafter import load_drafter
from dflash.specs import TargetSpec, load_target
from dflash.toy.tiny import save_tiny_target
from dflash.training import drafter_from_checkpoint
from dflash.training.export import drafter_state, read_checkpoint
from helpers.apps import run_python, write_conversations
from helpers.decoding import PROMPTS

pytestmark = pytest.mark.slow

STRATEGIES = ("fsdp", "ddp")
WEIGHT_DECAY = 0.5  # large, so weight decay on the wrong parameters shows in the weights
CLIP = 0.05  # far below the gradient norm: clipping changes every step
TARGET = "tiny_qwen3_random"
NEW_TOKENS = 24


def _train(root: Path, strategy: str, max_steps: int) -> str:
    """`python -m dflash.train` with `trainer=<strategy>` on 2 CPU processes (run `strategy`); its output.
    The FSDP run also measures val/tau_real at its validations (the DDP run, without it, is
    the reference its weights must still equal)."""
    args = [
        "-m", "dflash.train", "experiment=tiny_cpu", f"paths.artifacts={root / 'artifacts'}",
        f"data.path={root / 'chats.jsonl'}", f"run_name={strategy}", "logger=none", "eval.after_train=false",
        f"trainer={strategy}", "trainer.accelerator=cpu", "trainer.devices=2", "trainer.precision=32-true",
        f"trainer.max_steps={max_steps}", "trainer.val_check_interval=3", "trainer.enable_progress_bar=false",
        f"trainer.gradient_clip_val={CLIP}", f"training.weight_decay={WEIGHT_DECAY}",
    ]  # fmt: skip
    if strategy == "fsdp":
        args.append("eval.tau_real.every_n_validations=1")
    result = run_python(args, cwd=root)
    return result.stdout + result.stderr


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Both strategies trained 3 steps (validated at step 3; copies kept under step3/), then resumed to 4."""
    root = tmp_path_factory.mktemp("fsdp")
    save_tiny_target(str(root / "artifacts" / "targets" / TARGET), arch="qwen3", seed=0)  # before the ranks start
    write_conversations(root / "chats.jsonl", 16)
    first = {}
    for strategy in STRATEGIES:
        first[strategy] = _train(root, strategy, 3)
        assert "trained to global step 3" in first[strategy]
        shutil.copytree(root / "artifacts" / "runs" / strategy, root / "step3" / strategy)
    resumed = {strategy: _train(root, strategy, 4) for strategy in STRATEGIES}
    return {"root": root, "first": first, "resumed": resumed}


def _weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return load_file(str(run_dir / "drafter" / "model.safetensors"))


def _max_difference(left: dict[str, torch.Tensor], right: dict[str, torch.Tensor]) -> float:
    assert left.keys() == right.keys()
    return max(float((left[name] - right[name]).abs().max()) for name in left)


def _last_checkpoint(run_dir: Path) -> dict:
    return torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)


def _optimizer_groups(checkpoint: dict) -> list[tuple[float, int]]:
    """(weight decay, number of parameters) of each AdamW parameter group."""
    return [(group["weight_decay"], len(group["params"])) for group in checkpoint["optimizer_states"][0]["param_groups"]]


def test_fsdp_exports_the_drafter_ddp_exports(runs):
    step3 = runs["root"] / "step3"
    fsdp, ddp = _weights(step3 / "fsdp"), _weights(step3 / "ddp")
    # Measured: 7.5e-9. Clipping by a shard's own norm, or weight decay on no parameter
    # (FSDP shows every parameter as a 1-D shard), moved weights by 3e-3 and 5e-4.
    assert _max_difference(fsdp, ddp) < 1e-6
    for strategy in STRATEGIES:
        info = json.loads((step3 / strategy / "drafter" / "checkpoint.json").read_text())
        assert (info["checkpoint"], info["global_step"]) == ("best.ckpt", 3)  # validated at step 3 under both
    groups = {strategy: _optimizer_groups(_last_checkpoint(step3 / strategy)) for strategy in STRATEGIES}
    matrices = sum(tensor.dim() >= 2 for tensor in fsdp.values())
    assert groups["fsdp"] == groups["ddp"] == [(WEIGHT_DECAY, matrices), (0.0, len(fsdp) - matrices)]


def test_fsdp_measures_the_real_loop_tau_on_rank_0_without_changing_the_weights(runs):
    # the weights equal DDP's (test above) with the evaluation on under FSDP and off under DDP
    log = runs["first"]["fsdp"]
    assert re.search(r"tau_real at step 3: \d\.\d{3} on \d+ held-out prompts \(\d+ tokens, lossless\)", log), log[-2000:]
    assert log.count("tau_real at step 3") == 1  # rank 0 alone decodes
    # every rank logs global values (summed over ranks, or broadcast): no advice to sync them
    assert all("sync_dist" not in runs["first"][strategy] for strategy in STRATEGIES)


class RecordingProposer(DFlashProposer):
    """Keeps the logits of every block it drafts."""

    def __init__(self, *args):
        super().__init__(*args)
        self.drafts = []

    def propose(self, *args):
        logits = super().propose(*args)
        self.drafts.append(logits)
        return logits


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_the_exported_drafter_decodes_losslessly_like_its_checkpoint(runs, strategy):
    run_dir = runs["root"] / "step3" / strategy
    checkpoint = str(run_dir / "checkpoints" / "best.ckpt")
    exported = _weights(run_dir)
    assert all(torch.equal(exported[name], tensor) for name, tensor in drafter_state(read_checkpoint(checkpoint)).items())
    target = load_target(TargetSpec(path=str(runs["root"] / "artifacts" / "targets" / TARGET)))
    drafters = (load_drafter(str(run_dir / "drafter")), drafter_from_checkpoint(checkpoint))
    block = drafters[0].config.block_size
    for text in PROMPTS:
        prompt = target.tokenizer(text, return_tensors="pt").input_ids
        greedy = generate(target, prompt, max_new_tokens=NEW_TOKENS).output_ids
        proposers = [RecordingProposer(drafter, target.embed, target.logits) for drafter in drafters]
        results = [generate(target, prompt, max_new_tokens=NEW_TOKENS, block_size=block, proposer=p) for p in proposers]
        assert results[0].output_ids == results[1].output_ids == greedy
        assert results[0].acceptance_lengths == results[1].acceptance_lengths
        # Three steps from a random target accept next to nothing: the drafts themselves must agree.
        assert len(proposers[0].drafts) == len(proposers[1].drafts) > 0
        for loaded, rebuilt in zip(*(p.drafts for p in proposers)):
            torch.testing.assert_close(loaded, rebuilt, rtol=1e-5, atol=1e-5)


def test_the_fsdp_checkpoint_resumes_with_its_optimizer_state(runs):
    runs_dir = runs["root"] / "artifacts" / "runs"
    for strategy in STRATEGIES:
        assert "trained to global step 4 (resumed from" in runs["resumed"][strategy]
    checkpoint = _last_checkpoint(runs_dir / "fsdp")
    assert checkpoint["global_step"] == 4
    # AdamW's step count went on from the checkpoint's 3 (a fresh optimizer would be at 1).
    assert {float(state["step"]) for state in checkpoint["optimizer_states"][0]["state"].values()} == {4.0}
    # ... and so did its moments: the resumed runs still agree.
    assert _max_difference(_weights(runs_dir / "fsdp"), _weights(runs_dir / "ddp")) < 1e-6
