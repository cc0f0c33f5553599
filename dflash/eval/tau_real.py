"""What `eval.tau_real` decodes while training (`dflash.training.tau_real.TauRealCallback`
schedules and logs it): a drafter directory the training run just exported, through the
trained method's evaluation (`Method.evaluation`), greedy, on fixed prompt ids, with the
evaluator's code (`dflash.eval.evaluator.run_method`).

Invariants:
- The result's `tau` is results.json's `tau` (`dflash.eval.results.mean_acceptance_length`):
  `python -m dflash.evaluate` on the same drafter directory and prompts reports the same.
- Lossless check: every output is compared token for token with the target's own greedy
  output (the autoregressive loop), computed once per prompt and kept: the target is frozen.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch

from dflash.decoding import SamplingConfig
from dflash.eval.evaluator import run_method
from dflash.eval.prompts import stop_token_ids
from dflash.eval.results import BASELINE, GenerationRecord, first_mismatch, mean_acceptance_length
from dflash.methods import METHODS, EvalContext, build_method
from dflash.training.tau_real import TauRealSettings

GREEDY = SamplingConfig()


@dataclass
class TauRealProbe:
    """Greedy decoding of fixed prompts with a trained method's exported drafter.

    settings: the `eval.tau_real` block. method / train_settings: the run's trained
    method (`dflash.methods.Method`) and its `method` group.
    """

    settings: TauRealSettings
    method: Any
    train_settings: Any
    _baseline: dict = field(default_factory=dict, repr=False)  # prompt ids -> the target's greedy output

    def measure(self, target, drafter_dir: str, prompts: list[torch.Tensor]) -> dict:
        """Decode every prompt (1, P) with the drafter of `drafter_dir`.

        Returns {"tau" (pooled, bonus token counted), "lossless", "first_mismatch"
        (`dflash.eval.results.first_mismatch`, None when lossless), "num_tokens" (emitted
        by the method), "baseline_seconds" (the target's greedy outputs computed in this
        call; 0.0 once they are all kept)}.
        """
        from dflash.drafter import load_drafter

        name, method_settings = self.method.evaluation(drafter_dir, self.train_settings)
        method = METHODS[name]
        drafter = load_drafter(drafter_dir, device=target.device, dtype=target.dtype) if method.uses_dflash_drafter else None
        setup = build_method(name, target, method_settings, EvalContext(drafter, drafter_dir))
        stops = stop_token_ids(target.tokenizer, getattr(target.model, "generation_config", None))
        max_new_tokens = self.settings.max_new_tokens
        records, baseline_seconds = [], 0.0
        for index, input_ids in enumerate(prompts):
            key = (tuple(input_ids[0].tolist()), max_new_tokens, tuple(stops))
            if key not in self._baseline:
                start = time.perf_counter()
                self._baseline[key] = run_method(target, input_ids, None, max_new_tokens, stops, GREEDY).output_ids
                baseline_seconds += time.perf_counter() - start
            result = run_method(target, input_ids, setup, max_new_tokens, stops, GREEDY)
            record = GenerationRecord(prompt_index=index, turn=0, num_prompt_tokens=input_ids.shape[1])
            record.outputs = {BASELINE: self._baseline[key], name: result.output_ids}
            record.acceptance_lengths = record.acceptance[name] = result.acceptance_lengths
            records.append(record)
        mismatch = first_mismatch(records, BASELINE, name)
        return {
            "tau": mean_acceptance_length(records, name),
            "lossless": mismatch is None,
            "first_mismatch": mismatch,
            "num_tokens": sum(len(r.outputs[name]) for r in records),
            "baseline_seconds": baseline_seconds,
        }
