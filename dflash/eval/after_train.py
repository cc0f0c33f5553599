"""The evaluation at the end of training (`eval.after_train=true`): the exported drafter
on a benchmark through `dflash.eval.evaluate`, results.json in the run directory. The
trained method says which method evaluates its drafter (`Method.evaluation`).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any

from dflash.layout import RESULTS_FILE


@dataclass
class AfterTrainEval:
    """Evaluation of the exported drafter at the end of training.

    benchmark: a `dflash.eval.BenchmarkSpec`; settings: a `dflash.eval.EvalSettings`
    (its `methods` are replaced by the trained method's evaluation method).
    method / train_settings: the run's trained method (`dflash.methods.Method`) and its
    `method` group.
    """

    benchmark: Any
    settings: Any
    method: Any
    train_settings: Any

    def run(self, target, drafter_dir: str, output_dir: str, config: dict) -> str:
        """Evaluate the drafter directory `drafter_dir`; write results.json into `output_dir`; return its path."""
        from dflash.drafter import load_drafter
        from dflash.eval import benchmark_source, evaluate, format_results, load_benchmark
        from dflash.methods import METHODS

        name, method_settings = self.method.evaluation(drafter_dir, self.train_settings)
        settings = dataclasses.replace(
            self.settings, methods=[name], method_settings={} if method_settings is None else {name: method_settings}
        )
        target.model.eval()
        uses_drafter = METHODS[name].uses_dflash_drafter
        drafter = load_drafter(drafter_dir, device=target.device, dtype=target.dtype) if uses_drafter else None
        samples = load_benchmark(self.benchmark)
        results = evaluate(
            target,
            drafter,
            samples,
            settings,
            benchmark=self.benchmark.name,
            target_label=config.get("target", {}).get("path"),
            drafter_label=drafter_dir,
            config=config,
            benchmark_source=benchmark_source(self.benchmark),
        )
        path = results.write(os.path.join(output_dir, RESULTS_FILE))
        print(format_results(results))
        return path
