"""`make demo-tiny` / `python -m dflash.demo_tiny`: the whole DFlash pipeline on a toy target,
offline, on a CPU, in about 10 minutes (`make demo` runs it on a real model: `dflash.cli.demo`).

Stages, each skipped when its output exists and is current (an interrupted demo continues where it stopped):

1. target    build or reuse the tiny code LM pre-trained on the Python standard library
             (`target=tiny_code` with dflash/conf/demo_tiny.yaml's shorter pre-training, under
             `targets/tiny_code_demo`; rebuilt only when its build config changes);
2. data      cut function-header prompts from the standard library (none overlaps
             HumanEval) and let the target write the continuations (`dflash.regenerate`);
3. train     `python -m dflash.train experiment=demo eval.after_train=false` (resumes from
             its last checkpoint), which also exports the drafter directory;
4. evaluate  `python -m dflash.evaluate` on HumanEval (autoregressive baseline and DFlash,
             interleaved, one torch thread) into `<run dir>/eval/results.json`;
5. report    print the results table, the wall time of every stage, and write both into
             `<run dir>/demo_summary.json`.

Configuration: `dflash/conf/demo_tiny.yaml` (stages 1, 2 and 4) and `dflash/conf/experiment/demo.yaml` (stage 3).
"""

from __future__ import annotations

import os

import hydra
from omegaconf import DictConfig

from dflash.cli.common import CONF_DIR, exits_on_config_error, resolved_config, run_app
from dflash.cli.pipeline import (
    StageClock,
    app_command,
    check_stage_overrides,
    evaluate_stage,
    finish,
    quiet_progress_bars,
    recipe,
    short_hash,
    stage,
    train_stage,
)
from dflash.cli.train import quiet_third_party_logs
from dflash.errors import require
from dflash.layout import DRAFTER_DIR, EVAL_DIR, Results
from dflash.structured import config_key


def build_target(target_cfg: dict):
    """Stage 1: the tiny code target (built once per build config), loaded."""
    from dflash.specs import TargetSpec, load_target
    from dflash.target.builds import read_build_info
    from dflash.toy.tiny_code import TinyCodeConfig, is_current

    config = TinyCodeConfig.from_dict(target_cfg["build"])
    current = is_current(target_cfg["path"], config)
    stage(1, "target", f"{'reusing' if current else 'building'} the tiny code LM at {target_cfg['path']}")
    target = load_target(TargetSpec(**target_cfg))
    info = read_build_info(target_cfg["path"]) or {}
    print(f"    {target.num_layers} layers, hidden {target.hidden_size}; validation loss {info.get('val_loss', float('nan')):.3f}")
    return target, config.build_hash()


def regenerate_data(target, target_hash: str, prompts_cfg: dict, regen_cfg: dict, artifacts: str) -> str:
    """Stage 2: stdlib prompts continued by the target; returns the data directory."""
    from dflash.data.regenerate import RegenerateSettings, regenerate
    from dflash.toy.tiny_code_prompts import stdlib_code_prompts

    prompts = stdlib_code_prompts(**prompts_cfg)  # named by the prompts themselves: a new cut is a new directory
    data_dir = os.path.join(artifacts, "demo", f"data-{short_hash(target_hash, prompts, regen_cfg)}")
    stage(2, "data", f"{prompts_cfg['num_prompts']} standard-library prompts continued by the target -> {data_dir}")
    rows = [{"messages": [{"role": "user", "content": prompt}]} for prompt in prompts]
    regenerate(target, rows, data_dir, RegenerateSettings(**regen_cfg))
    return data_dir


def train(target_path: str, data_dir: str, train_overrides: list[str], artifacts: str) -> str:
    """Stage 3: the train app (resumable), which exports the drafter; returns the run dir.

    The train app loads the target that stage 1 built (`target.build=null`): composing
    `target=tiny_code` afresh would not see this demo's build overrides.
    """
    run_name = f"demo-{short_hash(os.path.basename(data_dir), train_overrides, recipe('demo'))}"
    arguments = [f"run_name={run_name}", f"target.path={target_path}", "target.build=null", "eval.after_train=false"]
    arguments += [f"data.path={data_dir}", f"paths.artifacts={artifacts}", *train_overrides]
    run_dir = os.path.join(artifacts, "runs", run_name)
    return train_stage(run_dir, lambda: app_command("train", "experiment=demo", *arguments))


def evaluate(target_path: str, run_dir: str, eval_overrides: list[str], artifacts: str) -> str:
    """Stage 4: `python -m dflash.evaluate` on the exported drafter; returns results.json."""
    eval_dir = os.path.join(run_dir, EVAL_DIR)
    drafter = os.path.join(run_dir, DRAFTER_DIR)
    arguments = [f"target.path={target_path}", "target.build=null", f"drafter.path={drafter}", f"paths.artifacts={artifacts}"]
    return evaluate_stage(
        eval_dir, app_command("evaluate", "target=tiny_code", *arguments, f"hydra.run.dir={eval_dir}", *eval_overrides)
    )


def report(run_dir: str, results_path: str, clock: StageClock) -> None:
    """Stage 5: print the evaluation table and the stage times; write demo_summary.json."""
    from dflash.eval import format_results

    results = Results.read(results_path)
    stage(5, "report", f"HumanEval, {results.num_prompts} prompts")
    print(format_results(results))
    summary = {
        "stage_wall_time_s": clock.totals(),
        "tau": results.tau,
        "tau_per_prompt_mean": results.tau_per_prompt_mean,
        "speedup": results.speedup,
        "speedup_decode_only": results.speedup_decode_only,
        "tokens_per_s": results.tokens_per_s,
        "lossless": results.lossless,
        "results": results_path,
    }
    finish(run_dir, summary, clock, "wall time per stage (the install before it not counted)", EVAL_DIR, "logs")


def check_app(app) -> None:
    """ConfigError for a bad target build block (checked before stage 1, which may pre-train the
    target for minutes), or unless `train_overrides` with `experiment=demo` and `eval_overrides`
    with the evaluate app compose (unknown keys, options, syntax; those apps check the values at
    stages 3 and 4). The other settings are checked by the schema (`dflash.schema.DemoTinyAppConfig`)."""
    from dflash.toy.tiny_code import TinyCodeConfig

    require(isinstance(app.target.build, dict), "target.build", "the demo builds its target: give a build block")
    with config_key("target.build"):
        TinyCodeConfig.from_dict(app.target.build)
    check_stage_overrides(
        app, (("train_overrides", "train", ["experiment=demo"]), ("eval_overrides", "evaluate", ["target=tiny_code"]))
    )


@hydra.main(version_base=None, config_path=str(CONF_DIR), config_name="demo_tiny")
@exits_on_config_error
def _hydra_main(cfg: DictConfig) -> None:
    artifacts = os.path.abspath(cfg.paths.artifacts)
    target_cfg, prompts_cfg, regen_cfg = (resolved_config(cfg[group]) for group in ("target", "prompts", "regenerate"))
    quiet_third_party_logs()  # stage 1 may pre-train the target with Lightning
    clock = StageClock()
    with clock.time("target"):
        target, target_hash = build_target(target_cfg)
    with clock.time("data"):
        data_dir = regenerate_data(target, target_hash, prompts_cfg, regen_cfg, artifacts)
    del target  # the train app loads its own copy
    with clock.time("train"):
        run_dir = train(cfg.target.path, data_dir, list(cfg.train_overrides), artifacts)
    with clock.time("evaluate"):
        results_path = evaluate(cfg.target.path, run_dir, list(cfg.eval_overrides), artifacts)
    report(run_dir, results_path, clock)


def main() -> None:
    quiet_progress_bars()
    run_app(_hydra_main, "demo_tiny", output_dirs=("paths.artifacts",), check=check_app)
