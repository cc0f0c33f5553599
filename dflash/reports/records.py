"""One run (a sweep job, or a wandb run) as the tables see it: `RunRecord`.

Both sources (result directories and wandb) produce the same records, so tables and
plots have one code path. A record holds the run's resolved config, its results
(results.json; for failed or running jobs and wandb runs, the fields that can be
derived from the config and logged metrics), its status and, when training metrics
were logged, the last per-position accuracies.

Which table a record feeds comes from its config's `sweep` node (dflash/conf/sweep/_layout.yaml):
`sweep.ablation` (the table), `sweep.name` and `sweep.axes` (the row keys).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace

from dflash.methods import METHODS

# results.json files written before the `method` field existed hold DFlash runs (the
# schema of `dflash.eval.results`); so do train-app configs without an evaluation yet.
UNNAMED_METHOD = "dflash"

FINISHED, FAILED, PENDING = "finished", "failed", "pending"


@dataclass
class RunRecord:
    """A run. status: "finished" (has results), "failed" or "pending" (started, no result yet).

    accuracies: {"val": [acc_1, ..., acc_{B-1}], "train": [...]}, the last logged values.
    """

    source: str
    status: str
    config: dict
    results: dict
    error: str | None = None
    accuracies: dict[str, list[float]] = field(default_factory=dict)

    @property
    def sweep(self) -> dict:
        node = self.config.get("sweep")
        return node if isinstance(node, dict) else {}

    @property
    def ablation(self) -> str | None:
        return self.sweep.get("ablation")

    @property
    def benchmark(self) -> str:
        return str(self.results.get("benchmark") or "?")

    @property
    def temperature(self) -> float | None:
        value = self.results.get("temperature")
        return float(value) if isinstance(value, (int, float)) else None

    @property
    def method(self) -> str:
        return str(self.results.get("method") or UNNAMED_METHOD)

    @property
    def target(self) -> str:
        """A short target name: the last component of its path or hub id."""
        path = str(self.results.get("target") or "?")
        return os.path.basename(path.rstrip("/")) or path

    @property
    def seed(self):
        """The training seed of the drafter (replicates of a cell differ only in it)."""
        for key in ("train_seed", "seed"):
            if self.config.get(key) is not None:
                return self.config[key]
        return None

    @property
    def timestamp(self) -> str:
        return str(self.results.get("timestamp") or "")

    @property
    def tau(self) -> float | None:
        return _number(self.results.get("tau"))

    @property
    def speedup(self) -> float | None:
        """DFlash's speedup over autoregressive decoding measured in the same run."""
        return _number((self.results.get("speedup") or {}).get("vs_autoregressive"))

    @property
    def tau_per_prompt_mean(self) -> float | None:
        """tau averaged per generation, then over generations (the DFlash paper's harness)."""
        return _number(self.results.get("tau_per_prompt_mean"))

    @property
    def speedup_decode_only(self) -> float | None:
        """Decode-only speedup over autoregressive decoding (time per output token without prefill)."""
        return _number((self.results.get("speedup_decode_only") or {}).get("vs_autoregressive"))

    @property
    def acceptance_histogram(self) -> list[int] | None:
        histogram = self.results.get("acceptance_histogram")
        return list(histogram) if histogram else None

    def method_views(self) -> list[RunRecord]:
        """One record per drafting method the run compared (results.json `methods`), each
        reading that method's figures as its own; [self] for a run of one method.

        A run without results yet is split by the `methods` of its config, each with the
        verify width its config sets: dflash's block size, or `<method>.num_draft_tokens` + 1.
        """
        methods = self.results.get("methods")
        if self.status == FINISHED and isinstance(methods, dict) and methods:
            return [replace(self, results={**self.results, **figures, "method": name}) for name, figures in methods.items()]
        names = lookup(self.config, "methods")
        if self.status != FINISHED and isinstance(names, list) and names:
            return [replace(self, results={**self.results, "method": str(name), "block_size": self._configured_width(str(name))})
                    for name in names]  # fmt: skip
        return [self]

    def family_views(self) -> list[RunRecord]:
        """[self], then one record per prompt family of a mixed benchmark (results.json
        `families`), each reading that family's figures as its own under the family's name
        as benchmark; [self] for a run without families."""
        families = self.results.get("families")
        if self.status != FINISHED or not isinstance(families, dict):
            return [self]
        views = [self]
        for family, figures in families.items():
            if isinstance(figures, dict):
                views.append(replace(self, results={**self.results, **figures, "benchmark": family, "families": None}))
        return views

    def _configured_width(self, method: str) -> int | None:
        known = METHODS.get(method)
        if known is not None and known.uses_dflash_drafter:
            return self.results.get("block_size")
        drafts = lookup(self.config, f"{method}.num_draft_tokens")
        return drafts + 1 if isinstance(drafts, int) else None

    def axis_values(self) -> tuple[str, ...]:
        """The record's value of each axis of its sweep, as display strings."""
        return tuple(axis_value(self, axis) for axis in self.sweep.get("axes") or [])


def axis_value(record: RunRecord, axis: dict) -> str:
    """Display value of `axis` ({label, key: str | [fallbacks], names: {value: label}}).

    key "results.<field>" reads the results, "config.<dotted.key>" the config; the first
    key with a value wins; "?" when none has one.
    """
    keys = axis.get("key")
    for key in keys if isinstance(keys, list) else [keys]:
        source, _, path = str(key).partition(".")
        value = lookup(record.results if source == "results" else record.config, path)
        if value is not None or (source == "config" and _has(record.config, path)):
            text = str(value)
            return str((axis.get("names") or {}).get(text, text))
    return "?"


def lookup(data: dict, dotted: str):
    """data["a"]["b"] for "a.b"; also accepts flattened keys ("a.b" or "a/b", as wandb may store them)."""
    for flat in (dotted, dotted.replace(".", "/")):
        if flat in data:
            return data[flat]
    node = data
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def _has(data: dict, dotted: str) -> bool:
    head, _, rest = dotted.partition(".")
    if dotted in data:
        return True
    return head in data and isinstance(data[head], dict) and bool(rest) and _has(data[head], rest)


def results_from_config(config: dict) -> dict:
    """The results fields a run's config determines (benchmark, block sizes, temperature, ...).

    Handles both apps: the train app keeps them under `eval.`, the evaluate app at the top.
    """
    evaluation = config.get("eval") if isinstance(config.get("eval"), dict) else config
    decoding = evaluation.get("decoding") or {}
    drafter = config.get("drafter") or {}
    trained_block = drafter.get("block_size") if not drafter.get("path") else None
    return {
        "benchmark": lookup(evaluation, "benchmark.name"),
        "method": UNNAMED_METHOD,
        "target": lookup(config, "target.path"),
        "block_size": decoding.get("block_size") or trained_block,
        "drafter_block_size": trained_block,
        "temperature": decoding.get("temperature"),
    }


def _number(value) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
