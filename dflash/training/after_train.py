"""The evaluation at the end of training (`eval.after_train=true`): the exported drafter
on a benchmark through `dflash.eval.evaluate`, results.json in the run directory, and its
figures logged as `eval/...` scalars (a wandb run also gets results.json as a run file).
A DFlash run evaluates method dflash; an EAGLE-3 run method eagle3 with its own drafter.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass

RESULTS_FILE = "results.json"


@dataclass
class AfterTrainEval:
    """Evaluation of the exported drafter at the end of training (`dflash.eval.evaluate`).

    benchmark: a `dflash.eval.BenchmarkSpec`; settings: a `dflash.eval.EvalSettings`.
    """

    benchmark: object
    settings: object


def eagle3_evaluation(evaluation: AfterTrainEval, drafter_dir: str, method) -> AfterTrainEval:
    """The after-training evaluation of an EAGLE-3 run: method eagle3 alone, drafting
    `method.ttt_length` tokens per step with the exported drafter."""
    from dflash.eval.methods import Eagle3Settings

    eagle3 = Eagle3Settings(path=drafter_dir, num_draft_tokens=method.ttt_length)
    settings = dataclasses.replace(evaluation.settings, methods=["eagle3"], method_settings={"eagle3": eagle3})
    return dataclasses.replace(evaluation, settings=settings)


def evaluate_after_training(evaluation: AfterTrainEval, target, drafter_dir: str, output_dir: str, config: dict) -> str:
    """Run `dflash.eval.evaluate` on the exported drafter; write results.json; return its path."""
    from dflash.drafter import load_drafter
    from dflash.eval import evaluate, format_results, load_benchmark, write_results

    target.model.eval()
    uses_dflash = "dflash" in evaluation.settings.methods
    drafter = load_drafter(drafter_dir, device=target.device, dtype=target.dtype) if uses_dflash else None
    samples = load_benchmark(evaluation.benchmark)
    results = evaluate(
        target,
        drafter,
        samples,
        evaluation.settings,
        benchmark=evaluation.benchmark.name,
        target_label=config.get("target", {}).get("path"),
        drafter_label=drafter_dir,
        config=config,
    )
    path = write_results(results, os.path.join(output_dir, RESULTS_FILE))
    print(format_results(results))
    return path


def log_evaluation(loggers: list, results_path: str, step: int) -> None:
    """Log tau and speedups of results.json (both aggregations) as `eval/...` scalars at
    training step `step`; a wandb run also gets results.json itself as a run file (what
    `dflash.tables` reads from wandb: the acceptance histogram, per-prompt numbers, lossless)."""
    with open(results_path) as f:
        results = json.load(f)
    metrics = {"eval/tau": results["tau"], "eval/tau_per_prompt_mean": results["tau_per_prompt_mean"]}
    metrics.update({f"eval/speedup_{name}": value for name, value in results["speedup"].items() if value is not None})
    speedups = results["speedup_decode_only"].items()
    metrics.update({f"eval/speedup_decode_only_{name}": value for name, value in speedups if value is not None})
    metrics.update({f"eval/tokens_per_s_{name}": value for name, value in results["tokens_per_s"].items() if value is not None})
    for logger in loggers:
        logger.log_metrics(metrics, step=step)
        if type(logger).__name__ == "WandbLogger":
            # named RESULTS_FILE in the run (base_path), the path taken literally: Hydra run
            # directories may hold glob characters ("drafter.target_layer_ids=[1,3]")
            logger.experiment.save(results_path, base_path=os.path.dirname(results_path), policy="now", glob=False)
