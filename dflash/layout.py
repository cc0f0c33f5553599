"""The files of the directories dflash writes, and results.json as a typed record.

Every module that writes or reads a run, evaluation, sweep-job, demo or drafter directory
takes the file names from here. `Results` is results.json (schema: `dflash.eval.results` and
docs/results-file.md): `from_json` then `to_json` gives a file back unchanged, keys in the
file's order; fields a file lacks read as None.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, fields, replace
from typing import Any

from dflash.fileio import write_json

# a run directory (train, evaluate, sweep job, demo)
RESULTS_FILE = "results.json"  # written last by an evaluation: its presence means finished
DEMO_SUMMARY = "demo_summary.json"
DEMO_TRAIN_MINUTES = "demo_train_minutes.json"  # a demo's first decision on its training minutes, kept for a resume
DEMO_STAGE_DONE = "complete.json"  # a demo stage's marker: the command that finished it
EVAL_COMMAND = "demo_eval_command.json"  # beside results.json: the evaluate arguments it answers
WANDB_ID_FILE = "wandb_run_id.txt"  # the wandb run a resumed training run logs to
DRAFTER_DIR = "drafter"  # the exported drafter directory of a training run
CHECKPOINT_DIR = "checkpoints"
LAST_CHECKPOINT = "last.ckpt"  # in CHECKPOINT_DIR: the latest training checkpoint, what a run resumes from
PREVIOUS_CHECKPOINT = "previous.ckpt"  # in CHECKPOINT_DIR: the last.ckpt before, kept until the next is complete
BEST_CHECKPOINT = "best.ckpt"  # in CHECKPOINT_DIR: the best validation's, with `checkpoint.select=best`
DRAFTER_CONFIG_KEY = "dflash_drafter_config"  # the key of a training checkpoint that holds the drafter's config.json dict
DRAFT_VOCAB_KEY = "dflash_draft_vocab"  # ... and a DFlash drafter's draft vocabulary, once its training counted it
EVAL_DIR = "eval"  # a demo's evaluation directories inside its run directory
CSV_DIR = "csv"  # the CSV logger's metrics: CSV_DIR/version_*/METRICS_CSV
METRICS_CSV = "metrics.csv"
HYDRA_CONFIG = os.path.join(".hydra", "config.yaml")
HYDRA_RUN_CONFIG = os.path.join(".hydra", "hydra.yaml")
HYDRA_OVERRIDES = os.path.join(".hydra", "overrides.yaml")
TAU_CURVES = "tau_curves.png"  # tau against training steps (`eval.tau_real`)
ERROR_FILE = "error.json"  # a failed sweep job's error record
LOG_FILE = "job.log"  # a sweep job's stdout and stderr
CELL_FILE = "cell.json"  # a sweep job's grid cell, what `dflash.training.reuse` matches finished twins by
REUSED_FILE = "reused_from.json"  # a sweep job that copied a finished twin's results: which one
# a drafter directory (HF format)
DRAFTER_CONFIG = "config.json"
DRAFTER_WEIGHTS = "model.safetensors"
DRAFT_VOCAB_FILE = "draft_vocab.json"
DRAFTER_MODULE = "dflash.py"  # the module named by config.json's auto_map
MODEL_CARD = "README.md"
EXPORT_INFO_FILE = "checkpoint.json"  # which checkpoint the drafter was exported from
# a target-state cache directory (and a data directory)
MANIFEST = "manifest.json"

# The figures a method's record (`Results.methods[name]`) and a family's
# (`Results.families[name]`) hold under the names of the top level.
FAMILY_FIELDS = (
    "tau", "tau_per_prompt_mean", "acceptance_histogram", "speedup", "speedup_decode_only",
    "lossless", "first_mismatch", "lossless_up_to_ties",
)  # fmt: skip
METHOD_FIELDS = ("block_size", "drafter_block_size", *FAMILY_FIELDS, "divergences")


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

    def of_method(self, name: str) -> Results:
        """These results with method `name` as the primary: its figures (`methods`) at the top level."""
        figures = self.methods[name]
        return replace(self, method=name, drafter=figures.get("label", self.drafter), **_present(figures, METHOD_FIELDS))

    def of_family(self, name: str) -> Results:
        """These results over one prompt family of a mixed benchmark (`families`), the family as benchmark."""
        figures = self.families[name]
        return replace(
            self, benchmark=name, families=None, **_present(figures, (*FAMILY_FIELDS, "num_prompts", "num_generations", "methods"))
        )

    @property
    def settings(self) -> dict:
        """The primary method's settings (`methods`); {} in files that predate them."""
        return ((self.methods or {}).get(self.method) or {}).get("settings") or {}

    @property
    def speedup_vs_autoregressive(self) -> float | None:
        """End to end, prefill included."""
        return (self.speedup or {}).get("vs_autoregressive")

    @property
    def speedup_decode_only_vs_autoregressive(self) -> float | None:
        """The paper's: decode time per output token, prefill excluded."""
        return (self.speedup_decode_only or {}).get("vs_autoregressive")

    @property
    def source_description(self) -> str | None:
        """Where the prompts came from, in words: "openai/gsm8k@740312add88f" (a revision
        shortened to 12 characters), "local file x.jsonl", ...; None in files that predate it."""
        source = self.benchmark_source
        if not isinstance(source, dict):
            return None
        if source.get("kind") == "local":
            return f"local file {source.get('dataset')}"
        if source.get("kind") == "bundled":
            return f"bundled with {source.get('dataset')}"
        revision = source.get("revision")
        return f"{source.get('dataset')}@{revision[:12]}" if revision else f"{source.get('dataset')} (no revision pinned)"

    @classmethod
    def read(cls, path: str) -> Results:
        with open(path) as f:
            return cls.from_json(json.load(f))

    def write(self, path: str) -> str:
        """Write results.json to `path` atomically (`dflash.fileio`); returns `path`."""
        return write_json(path, self.to_json(), indent=2)


def _present(figures: dict, names: tuple) -> dict:
    return {name: figures[name] for name in names if name in figures}
