"""The apps as the tests drive them: the `train` config as `python -m dflash.train` composes
it, the demo's own settings, an app's `main()` in this process, `python -m dflash.evaluate` and other Python commands
in a subprocess, and chat data files for training."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.hydra_config import HydraConfig
from omegaconf import OmegaConf, open_dict

from dflash.cli.common import CONF_DIR


def compose_train(overrides: list[str]):
    """The composed `train` config (hydra node removed), with Hydra's resolvers usable."""
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("train", overrides=[*overrides, "paths.output_dir=/tmp/unused"], return_hydra_config=True)
    HydraConfig.instance().set_config(cfg)
    with open_dict(cfg):
        del cfg["hydra"]
    return cfg


def demo_config(**overrides):
    """dflash/conf/demo.yaml's own keys (no defaults list, no hydra node), with `overrides` set."""
    cfg = OmegaConf.load(CONF_DIR / "demo.yaml")
    cfg.pop("defaults"), cfg.pop("hydra")
    for key, value in overrides.items():
        OmegaConf.update(cfg, key, value)
    return cfg


def run_main(app: str, argv: list[str], monkeypatch, capsys) -> tuple[int, list[str]]:
    """Run `python -m dflash.<app> *argv` in this process; (exit status, stderr lines)."""
    module = importlib.import_module(f"dflash.cli.{app}")
    monkeypatch.setattr(sys, "argv", [f"dflash.{app}", *argv])
    with pytest.raises(SystemExit) as exit_info:
        module.main()
    return exit_info.value.code, capsys.readouterr().err.strip().splitlines()


def assert_one_error_line(code: int, lines: list[str], key: str, text: str) -> None:
    """Exit status 2; the last stderr line, the only `error:` one, names `key` and says `text`."""
    assert code == 2, lines
    assert not any("Traceback" in line for line in lines), lines
    assert [line for line in lines if line.startswith("error:")] == lines[-1:], lines
    assert lines[-1].startswith(f"error: {key}: ") and text in lines[-1], lines[-1]


def run_python(args: list[str], cwd: Path, timeout: int = 240) -> subprocess.CompletedProcess:
    """`python ARGS` in `cwd` with one CPU thread per process and this checkout first on the
    path (the ranks a multi-process run starts import the same code); asserts it exits 0."""
    from helpers import REPO

    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'tests'}"}
    result = subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def run_cli(args, cwd, artifacts):
    """`python -m dflash.evaluate ARGS` in `cwd` (one CPU thread, offline), artifacts under `artifacts`."""
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    command = [sys.executable, "-m", "dflash.evaluate", f"hydra.run.dir={cwd}/run", f"paths.artifacts={artifacts}", *args]
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


# A training sweep at scale cpu shrunk to seconds: the tiny random Qwen3 target, 2 steps, a one-prompt evaluation.
SHRUNK_CPU_SWEEP = [
    "target=tiny_qwen3",
    "data.max_length=256",
    "training.num_anchors=8",
    "trainer.precision=32-true",
    "trainer.max_steps=2",
    "trainer.val_check_interval=2",
    "checkpoint.every_n_train_steps=2",
    "eval.benchmark.max_samples=1",
    "eval.decoding.max_new_tokens=8",
    "hydra.launcher.cpu_jobs=1",
]


def write_conversations(path: Path, count: int) -> None:
    """`count` distinct user/assistant conversations as JSONL (each row identifiable)."""
    with open(path, "w") as f:
        for i in range(count):
            answer = f"answer {i}: " + " ".join(f"w{(i * 7 + j) % 23}" for j in range(30))
            f.write(
                json.dumps({"messages": [{"role": "user", "content": f"question {i}?"}, {"role": "assistant", "content": answer}]})
                + "\n"
            )
