"""DSpark and DFlash2 through the apps as a user runs them: `python -m dflash.train method=NAME` on
the tiny recipe (its after-train evaluation runs the method), `python -m dflash.export` of its
checkpoint (config.json read as llama.cpp's converter reads it: plain JSON), and
`python -m dflash.evaluate methods=[dflash,NAME]` of the export with the method's stop on; every
output lossless."""

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

# method -> (training overrides, config.json check, exported drafter's trained head, the stop, its recorded setting)
METHODS = {
    "dspark": (
        ["method.markov_rank=16"],
        lambda config: config["architectures"] == ["DSparkDraftModel"] and config["sample_from_anchor"] is False,
        lambda drafter: (
            drafter.config.markov_rank == 16
            and drafter.confidence_head is not None
            and drafter.markov_head.markov_w2.weight.abs().sum() > 0
        ),  # trained: w2 starts at zero
        ("confidence_threshold", 0.5),
    ),
    "dflash2": (
        ["method.selector_top_k=4", "method.selector_rank=16"],
        lambda config: config["architectures"] == ["DFlash2DraftModel"] and config["dflash_config"]["selector_top_k"] == 4,
        lambda drafter: (
            drafter.config.selector_rank == 16
            and drafter.candidate_selector.successor_codebook.abs().sum() > 0  # trained: both start at zero
            and drafter.layers[0].attention_conv.kernel_projection.weight.abs().sum() > 0
        ),
        ("p_min", 0.3),
    ),
}


def _cli(args: list[str], cwd) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    env.pop("WANDB_API_KEY", None)
    result = subprocess.run([sys.executable, "-m", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


@pytest.mark.slow
@pytest.mark.parametrize("method", sorted(METHODS))
def test_train_export_and_evaluate(method, tmp_path):
    overrides, config_is_right, heads_trained, (stop, value) = METHODS[method]
    artifacts = tmp_path / "artifacts"
    save_tiny_target(str(artifacts / "targets" / "tiny_qwen3_random"), arch="qwen3", seed=0)
    write_conversations(tmp_path / "chats.jsonl", 16)
    train = ["dflash.train", "experiment=tiny_cpu", f"method={method}", *overrides, f"paths.artifacts={artifacts}"]
    train += [f"data.path={tmp_path / 'chats.jsonl'}", "trainer.max_steps=8", "trainer.val_check_interval=8"]
    train += ["checkpoint.every_n_train_steps=8", "trainer.enable_progress_bar=false", "eval.benchmark.max_samples=1"]
    _cli([*train, "eval.decoding.max_new_tokens=8", "eval.warmup_tokens=0"], cwd=tmp_path)
    (run_dir,) = (artifacts / "runs").iterdir()
    assert config_is_right(json.loads((run_dir / "drafter" / "config.json").read_text()))
    assert json.loads((run_dir / "results.json").read_text())["methods"][method]["lossless"] is True  # after-train

    _cli(["dflash.export", f"ckpt={run_dir / 'checkpoints' / 'last.ckpt'}", f"out={tmp_path / 'drafter'}"], cwd=tmp_path)
    exported = load_drafter(str(tmp_path / "drafter"))
    assert heads_trained(exported)
    last = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=False)["state_dict"]
    assert all(torch.equal(last[f"drafter.{name}"], tensor) for name, tensor in exported.state_dict().items())

    evaluate = ["dflash.evaluate", f"methods=[dflash,{method}]", f"drafter.path={tmp_path / 'drafter'}"]
    evaluate += [f"{method}.{stop}={value}", f"paths.artifacts={artifacts}", "benchmark.max_samples=1"]
    evaluate += ["decoding.max_new_tokens=16", "hf_generate=false", "warmup_tokens=0", f"hydra.run.dir={tmp_path / 'eval'}"]
    _cli(evaluate, cwd=tmp_path)
    results = json.loads((tmp_path / "eval" / "results.json").read_text())
    assert all(results["methods"][name]["lossless"] is True for name in ("dflash", method))
    assert results["methods"][method]["settings"][stop] == value
