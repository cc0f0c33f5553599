"""Logging the evaluation at the end of training (`eval.after_train=true`, run by
`dflash.eval.after_train.AfterTrainEval`)."""

from __future__ import annotations

import os

from dflash.layout import Results


def log_evaluation(loggers: list, results_path: str, step: int) -> None:
    """Log tau and speedups of results.json (both aggregations) as `eval/...` scalars at
    training step `step`; a wandb run also gets results.json itself as a run file (what
    `dflash.tables` reads from wandb: the acceptance histogram, per-prompt numbers, lossless)."""
    results = Results.read(results_path)
    metrics = {"eval/tau": results.tau, "eval/tau_per_prompt_mean": results.tau_per_prompt_mean}
    metrics.update({f"eval/speedup_{name}": value for name, value in results.speedup.items() if value is not None})
    speedups = results.speedup_decode_only.items()
    metrics.update({f"eval/speedup_decode_only_{name}": value for name, value in speedups if value is not None})
    metrics.update({f"eval/tokens_per_s_{name}": value for name, value in results.tokens_per_s.items() if value is not None})
    for logger in loggers:
        logger.log_metrics(metrics, step=step)
        if type(logger).__name__ == "WandbLogger":
            # named RESULTS_FILE in the run (base_path), the path taken literally: Hydra run
            # directories may hold glob characters ("drafter.target_layer_ids=[1,3]")
            logger.experiment.save(results_path, base_path=os.path.dirname(results_path), policy="now", glob=False)
