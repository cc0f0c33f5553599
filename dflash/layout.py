"""The files of a run directory: their names, and results.json as a typed record.

Every module that writes or reads a run, evaluation, sweep-job or demo directory takes
the names from here. `Results` is results.json: the evaluator builds it, tables, model
cards, sweeps and demos read it; `to_json` gives the file's dictionary, keys in the file's
order (schema: `dflash.eval.results` and docs/results-file.md), so `from_json` then
`to_json` gives a file back unchanged. Fields a file lacks (files written before the
field existed) read as None.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, fields
from typing import Any

from dflash.fileio import write_json

RESULTS_FILE = "results.json"  # written last by an evaluation: its presence means finished
DEMO_SUMMARY = "demo_summary.json"
DRAFTER_DIR = "drafter"  # the exported drafter directory of a training run
CHECKPOINT_DIR = "checkpoints"
LAST_CHECKPOINT = "last.ckpt"  # in CHECKPOINT_DIR: the latest training checkpoint, what a run resumes from
DRAFTER_CONFIG_KEY = "dflash_drafter_config"  # the key of a training checkpoint that holds the drafter's config.json dict
DRAFT_VOCAB_KEY = "dflash_draft_vocab"  # ... and a DFlash drafter's draft vocabulary, once its training counted it
EVAL_DIR = "eval"  # a demo's evaluation directories inside its run directory
CSV_DIR = "csv"  # the CSV logger's metrics
HYDRA_CONFIG = os.path.join(".hydra", "config.yaml")
ERROR_FILE = "error.json"  # a failed sweep job's error record
LOG_FILE = "job.log"  # a sweep job's stdout and stderr


def artifacts_root() -> str:
    """Where outputs go for the apps outside Hydra (bench, serve_check, dflash.sweep.prompts):
    as `paths.artifacts` (dflash/conf/paths/default.yaml), DFLASH_ARTIFACTS, else ./artifacts."""
    return os.environ.get("DFLASH_ARTIFACTS", os.path.join(os.getcwd(), "artifacts"))


@dataclass
class Results:
    """results.json, field by field (how each figure is aggregated: `dflash.eval.results`;
    every nested key: docs/results-file.md)."""

    benchmark: str | None = None
    benchmark_source: dict | None = None  # where the prompts came from: {kind, dataset, config, split, files, revision}
    method: str | None = None  # the primary method (the first run): the top-level figures are its own
    target: str | None = None
    target_dtype: str | None = None  # e.g. "bfloat16"
    kernel_path: str | None = None  # the forward every method decoded with ("hf", or "fast: ..."; invariant 25)
    drafter: str | None = None  # the primary's label: drafter path or "random"
    block_size: int | None = None  # the primary's verify width
    drafter_block_size: int | None = None  # the block size it was trained with; None without one
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    verify_rule: str | None = None
    max_new_tokens: int | None = None
    num_prompts: int | None = None
    num_generations: int | None = None  # one per turn
    tau: float | None = None  # pooled over every verify step, bonus token counted (invariants 16, 17)
    tau_per_prompt_mean: float | None = None  # the mean over generations of their own tau (the paper's harness)
    acceptance_histogram: list[int] | None = None  # entry k-1: verify steps that emitted k tokens
    tokens_per_s: dict[str, float | None] | None = None  # {each method, autoregressive, hf_generate}, prefill included
    speedup: dict[str, float | None] | None = None  # end to end: {vs_autoregressive, vs_hf_generate}
    speedup_decode_only: dict[str, float | None] | None = None  # the paper's: {vs_autoregressive}
    lossless: bool | None = None  # greedy: every output equals the autoregressive one; None when sampling
    first_mismatch: dict | None = None  # {prompt_index, turn, position, expected, got}
    lossless_up_to_ties: bool | None = None  # greedy: every divergence is numerical
    divergences: dict | None = None  # greedy: {numerical, bug, details} (`dflash.eval.divergence`)
    hf_generate_matches: bool | None = None  # the same three checks for HF generate against autoregressive
    hf_generate_first_mismatch: dict | None = None
    hf_generate_divergences: dict | None = None
    methods: dict[str, dict] | None = None  # {name: that method's figures}, in the order run
    families: dict[str, dict] | None = None  # per family of a mixed benchmark, else None
    stop_token_ids: list[int] | None = None
    per_prompt: list[dict] | None = None  # one entry per generation: tokens, seconds and tau per method
    device: str | None = None
    versions: dict[str, str] | None = None  # {dflash, torch, transformers, python}
    timestamp: str | None = None  # UTC, ISO 8601
    config: dict[str, Any] | None = None  # the resolved config

    def to_json(self) -> dict:
        """The file's dictionary, in the file's key order."""
        return {field.name: getattr(self, field.name) for field in fields(self)}

    @classmethod
    def from_json(cls, data: dict) -> Results:
        """From a file's dictionary; keys it does not know are left out."""
        return cls(**{field.name: data[field.name] for field in fields(cls) if field.name in data})

    @classmethod
    def read(cls, path: str) -> Results:
        with open(path) as f:
            return cls.from_json(json.load(f))

    def write(self, path: str) -> str:
        """Write results.json to `path` atomically (`dflash.fileio`); returns `path`."""
        return write_json(path, self.to_json(), indent=2)
