"""DFlash2 through the apps as a user runs them: `python -m dflash.train method=dflash2` on the tiny
recipe (after-train evaluation: dflash2), `python -m dflash.export` of its checkpoint, and
`python -m dflash.evaluate methods=[dflash,dflash2]` of the DFlash2DraftModel with the p_min stop;
every output lossless."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from dflash.drafter import load_drafter
from dflash.toy.tiny import save_tiny_target
from helpers import REPO
from helpers.apps import write_conversations


def _cli(args: list[str], cwd) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    env.pop("WANDB_API_KEY", None)
    result = subprocess.run([sys.executable, "-m", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


@pytest.mark.slow
def test_train_export_and_evaluate_a_dflash2_drafter(tmp_path):
    artifacts = tmp_path / "artifacts"
    save_tiny_target(str(artifacts / "targets" / "tiny_qwen3_random"), arch="qwen3", seed=0)
    write_conversations(tmp_path / "chats.jsonl", 16)
    _cli(
        [
            "dflash.train",
            "experiment=tiny_cpu",
            "method=dflash2",
            "method.selector_top_k=4",
            "method.selector_rank=16",
            f"paths.artifacts={artifacts}",
            f"data.path={tmp_path / 'chats.jsonl'}",
            "trainer.max_steps=8",
            "trainer.val_check_interval=8",
            "checkpoint.every_n_train_steps=8",
            "trainer.enable_progress_bar=false",
            "eval.benchmark.max_samples=1",
            "eval.decoding.max_new_tokens=8",
            "eval.warmup_tokens=0",
        ],
        cwd=tmp_path,
    )
    (run_dir,) = (artifacts / "runs").iterdir()
    config = json.loads((run_dir / "drafter" / "config.json").read_text())
    assert config["architectures"] == ["DFlash2DraftModel"] and config["dflash_config"]["selector_top_k"] == 4
    assert json.loads((run_dir / "results.json").read_text())["methods"]["dflash2"]["lossless"] is True  # after-train: dflash2

    _cli(["dflash.export", f"ckpt={run_dir / 'checkpoints' / 'last.ckpt'}", f"out={tmp_path / 'drafter'}"], cwd=tmp_path)
    exported = load_drafter(str(tmp_path / "drafter"))
    assert exported.config.selector_rank == 16 and exported.candidate_selector is not None
    # trained: the successor codebook and the convolutions' projections left zero
    assert exported.candidate_selector.successor_codebook.abs().sum() > 0
    assert exported.layers[0].attention_conv.kernel_projection.weight.abs().sum() > 0
    last = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=False)["state_dict"]
    assert all(torch.equal(last[f"drafter.{name}"], tensor) for name, tensor in exported.state_dict().items())

    _cli(
        [
            "dflash.evaluate",
            "methods=[dflash,dflash2]",
            f"drafter.path={tmp_path / 'drafter'}",
            "dflash2.p_min=0.3",
            f"paths.artifacts={artifacts}",
            "benchmark.max_samples=1",
            "decoding.max_new_tokens=16",
            "hf_generate=false",
            "warmup_tokens=0",
            f"hydra.run.dir={tmp_path / 'eval'}",
        ],
        cwd=tmp_path,
    )
    results = json.loads((tmp_path / "eval" / "results.json").read_text())
    assert all(results["methods"][name]["lossless"] is True for name in ("dflash", "dflash2"))
    assert results["methods"]["dflash2"]["settings"]["p_min"] == 0.3
