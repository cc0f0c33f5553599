"""`make demo` / `python -m dflash.demo`: the whole DFlash pipeline, offline, on a CPU.

Stages, each skipped when its output exists and is current (an interrupted demo
continues where it stopped when run again):

1. target    build or reuse the tiny code LM pre-trained on the Python standard library
             (`target=tiny_code`; rebuilt only when its build config changes);
2. data      cut function-header prompts from the standard library (none overlaps
             HumanEval) and let the target write the continuations (`dflash.regenerate`);
3. train     `python -m dflash.train experiment=demo` (resumes from its last checkpoint);
             it then evaluates on HumanEval (autoregressive baseline, DFlash, HF
             generate) into the run directory;
4. report    print the results table and where the files are.

Configuration: `conf/demo.yaml` (stages 1-2) and `experiments/demo.yaml` (stage 3).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys

import hydra
from omegaconf import DictConfig, ListConfig

from dflash.cli.common import CONF_DIR, check_overrides, exits_on_config_error, resolved_config, run_app
from dflash.errors import ConfigError, check_field_types, require, spec_from_dict

RESULTS = "results.json"


def stage(number: int, name: str, message: str) -> None:
    print(f"\n=== [{number}/4] {name}: {message}", flush=True)


def short_hash(*parts) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:10]


def build_target(target_cfg: dict):
    """Stage 1: the tiny code target (built once per build config), loaded."""
    from dflash.specs import TargetSpec, load_target
    from dflash.target.tiny_code import TinyCodeConfig, is_current

    config = TinyCodeConfig.from_dict(target_cfg["build"])
    current = is_current(target_cfg["path"], config)
    stage(1, "target", f"{'reusing' if current else 'building'} the tiny code LM at {target_cfg['path']}")
    target = load_target(TargetSpec(**target_cfg))
    with open(os.path.join(target_cfg["path"], "build_info.json")) as f:
        info = json.load(f)
    print(f"    {target.num_layers} layers, hidden {target.hidden_size}; validation loss {info.get('val_loss', float('nan')):.3f}")
    return target, config.build_hash()


def regenerate_data(target, target_hash: str, prompts_cfg: dict, regen_cfg: dict, artifacts: str) -> str:
    """Stage 2: stdlib prompts continued by the target; returns the data directory."""
    from dflash.data.regenerate import RegenerateSettings, regenerate
    from dflash.target.tiny_code_prompts import stdlib_code_prompts

    data_dir = os.path.join(artifacts, "demo", f"data-{short_hash(target_hash, prompts_cfg, regen_cfg)}")
    stage(2, "data", f"{prompts_cfg['num_prompts']} standard-library prompts continued by the target -> {data_dir}")
    prompts = stdlib_code_prompts(**prompts_cfg)
    rows = [{"messages": [{"role": "user", "content": prompt}]} for prompt in prompts]
    regenerate(target, rows, data_dir, RegenerateSettings(**regen_cfg))
    return data_dir


def train_and_evaluate(target_path: str, data_dir: str, train_overrides: list[str], artifacts: str) -> str:
    """Stage 3: the train app (resumable) with evaluation after training; returns the run dir.

    The train app loads the target that stage 1 built (`target.build=null`): composing
    `target=tiny_code` afresh would not see this demo's build overrides.
    """
    # The recipe's text is part of the name: editing experiments/demo.yaml trains anew.
    with open(os.path.join(CONF_DIR, "experiment", "demo.yaml")) as f:
        recipe = f.read()
    run_name = f"demo-{short_hash(os.path.basename(data_dir), train_overrides, recipe)}"
    run_dir = os.path.join(artifacts, "runs", run_name)
    command = [
        sys.executable, "-m", "dflash.train", "experiment=demo", f"run_name={run_name}",
        f"target.path={target_path}", "target.build=null",
        f"data.path={data_dir}", f"paths.artifacts={artifacts}", *train_overrides,
    ]
    if os.path.exists(os.path.join(run_dir, RESULTS)) and os.path.isdir(os.path.join(run_dir, "drafter")):
        stage(3, "train + evaluate", f"done already in {run_dir}")
        return run_dir
    stage(3, "train + evaluate", " ".join(["python", *command[1:]]))
    status = subprocess.run(command).returncode
    if status != 0:
        # The train app has printed its own error; no second traceback from here.
        print(f"error: stage 3 (train + evaluate) failed with exit status {status}; see its output above", file=sys.stderr)
        sys.exit(status)
    return run_dir


def report(run_dir: str) -> None:
    """Stage 4: print the evaluation table."""
    from dflash.eval import format_results

    with open(os.path.join(run_dir, RESULTS)) as f:
        results = json.load(f)
    stage(4, "report", f"HumanEval, {results['num_prompts']} prompts")
    print(format_results(results))
    print(f"\nrun directory: {run_dir}\n  drafter/ (load with drafter.path=...), {RESULTS}, checkpoints/, logs")


def check_train_overrides(cfg: DictConfig) -> None:
    """ConfigError unless `train_overrides` compose with `experiment=demo` (unknown keys,
    options, syntax); their values are checked by the train app itself at stage 3."""
    overrides = cfg.train_overrides
    require(
        isinstance(overrides, ListConfig) and all(isinstance(o, str) for o in overrides),
        "train_overrides",
        f"must be a list of quoted train overrides like '[\"trainer.max_steps=100\"]', got {overrides!r}",
    )
    try:
        check_overrides("train", ["experiment=demo", *overrides])
    except ConfigError as err:
        raise ConfigError("train_overrides", str(err)) from None


def check_settings(target_cfg: dict, prompts_cfg: dict, regen_cfg: dict) -> None:
    """ConfigError for a bad setting of stages 1-2, before stage 1 (which may pre-train the
    target for minutes)."""
    from dflash.data.regenerate import RegenerateSettings
    from dflash.target.tiny_code import TinyCodeConfig
    from dflash.target.tiny_code_prompts import stdlib_code_prompts

    require(isinstance(target_cfg.get("build"), dict), "target.build", "the demo builds its target: give a build block")
    TinyCodeConfig.from_dict(target_cfg["build"])
    check_field_types(stdlib_code_prompts, prompts_cfg, "prompts")
    spec_from_dict(RegenerateSettings, regen_cfg, "regenerate").validate()


@hydra.main(version_base=None, config_path=str(CONF_DIR), config_name="demo")
@exits_on_config_error
def _hydra_main(cfg: DictConfig) -> None:
    artifacts = os.path.abspath(cfg.paths.artifacts)
    target_cfg, prompts_cfg, regen_cfg = (resolved_config(cfg[group]) for group in ("target", "prompts", "regenerate"))
    check_settings(target_cfg, prompts_cfg, regen_cfg)
    target, target_hash = build_target(target_cfg)
    data_dir = regenerate_data(target, target_hash, prompts_cfg, regen_cfg, artifacts)
    del target  # the train app loads its own copy
    run_dir = train_and_evaluate(cfg.target.path, data_dir, list(cfg.train_overrides), artifacts)
    report(run_dir)


def main() -> None:
    run_app(_hydra_main, "demo", output_dirs=("paths.artifacts",), check=check_train_overrides)
