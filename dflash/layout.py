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
EVAL_DIR = "eval"  # a demo's evaluation directories inside its run directory
CSV_DIR = "csv"  # the CSV logger's metrics
HYDRA_CONFIG = os.path.join(".hydra", "config.yaml")
ERROR_FILE = "error.json"  # a failed sweep job's error record
LOG_FILE = "job.log"  # a sweep job's stdout and stderr


@dataclass
class Results:
    """results.json, field by field (meanings: `dflash.eval.results` and docs/results-file.md)."""

    benchmark: str | None = None
    benchmark_source: dict | None = None
    method: str | None = None
    target: str | None = None
    target_dtype: str | None = None
    kernel_path: str | None = None
    drafter: str | None = None
    block_size: int | None = None
    drafter_block_size: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    verify_rule: str | None = None
    max_new_tokens: int | None = None
    num_prompts: int | None = None
    num_generations: int | None = None
    tau: float | None = None
    tau_per_prompt_mean: float | None = None
    acceptance_histogram: list[int] | None = None
    tokens_per_s: dict[str, float | None] | None = None
    speedup: dict[str, float | None] | None = None
    speedup_decode_only: dict[str, float | None] | None = None
    lossless: bool | None = None
    first_mismatch: dict | None = None
    lossless_up_to_ties: bool | None = None
    divergences: dict | None = None
    hf_generate_matches: bool | None = None
    hf_generate_first_mismatch: dict | None = None
    hf_generate_divergences: dict | None = None
    methods: dict[str, dict] | None = None
    families: dict[str, dict] | None = None
    stop_token_ids: list[int] | None = None
    per_prompt: list[dict] | None = None
    device: str | None = None
    versions: dict[str, str] | None = None
    timestamp: str | None = None
    config: dict[str, Any] | None = None

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
