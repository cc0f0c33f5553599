"""One run (a sweep job, or a wandb run) as the tables see it: `RunRecord`.

Both sources (result directories and wandb) produce the same records. A record holds the
run's resolved config, its results (for failed or running jobs and wandb runs, what the
config and logged metrics give), its status and the last per-position accuracies.

Which table a record feeds comes from its config's `sweep` node (dflash/conf/sweep/_layout.yaml):
`sweep.ablation` (the table), `sweep.name` and `sweep.axes` (the row keys).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace

from dflash.layout import Results
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
    results: Results
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
        return str(self.results.benchmark or "?")

    @property
    def temperature(self) -> float | None:
        value = self.results.temperature  # a pending run's may be an unresolved interpolation
        return float(value) if isinstance(value, (int, float)) else None

    @property
    def method(self) -> str:
        return str(self.results.method or UNNAMED_METHOD)

    @property
    def target(self) -> str:
        """A short target name: the last component of its path or hub id."""
        path = str(self.results.target or "?")
        return os.path.basename(path.rstrip("/")) or path

    @property
    def seed(self):
        """The training seed of the drafter (replicates of a cell differ only in it)."""
        for key in ("train_seed", "seed"):
            if self.config.get(key) is not None:
                return self.config[key]
        return None

    def method_views(self) -> list[RunRecord]:
        """One record per drafting method the run compared (results.json `methods`), each
        reading that method's figures as its own; [self] for a run of one method.

        A run without results yet is split by the `methods` of its config, each with the
        verify width its config sets: dflash's block size, or `<method>.num_draft_tokens` + 1.
        """
        if self.status == FINISHED and self.results.methods:
            return [replace(self, results=self.results.of_method(name)) for name in self.results.methods]
        names = lookup(self.config, "methods")
        if self.status != FINISHED and isinstance(names, list) and names:
            width = self._configured_width
            return [replace(self, results=replace(self.results, method=str(n), block_size=width(str(n)))) for n in names]
        return [self]

    def family_views(self) -> list[RunRecord]:
        """[self], then one record per prompt family of a mixed benchmark (results.json
        `families`), each reading that family's figures as its own under the family's name
        as benchmark; [self] for a run without families."""
        if self.status != FINISHED or not self.results.families:
            return [self]
        return [self, *(replace(self, results=self.results.of_family(name)) for name in self.results.families)]

    def _configured_width(self, method: str) -> int | None:
        known = METHODS.get(method)
        if known is not None and known.uses_dflash_drafter:
            return self.results.block_size
        drafts = lookup(self.config, f"{method}.num_draft_tokens")
        return drafts + 1 if isinstance(drafts, int) else None


def axis_value(record: RunRecord, axis: dict) -> str:
    """Display value of `axis` ({label, key: str | [fallbacks], names: {value: label}}).

    key "results.<field>" reads the results, "config.<dotted.key>" the config; the first
    key with a value wins; "?" when none has one.
    """
    keys = axis.get("key")
    for key in keys if isinstance(keys, list) else [keys]:
        source, _, path = str(key).partition(".")
        value = lookup(vars(record.results) if source == "results" else record.config, path)
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


def results_from_config(config: dict) -> Results:
    """The results fields a run's config determines (benchmark, block sizes, temperature, ...).

    Handles both apps: the train app keeps them under `eval.`, the evaluate app at the top.
    """
    evaluation = config.get("eval") if isinstance(config.get("eval"), dict) else config
    decoding = evaluation.get("decoding") or {}
    drafter = config.get("drafter") or {}
    trained_block = drafter.get("block_size") if not drafter.get("path") else None
    return Results(
        benchmark=lookup(evaluation, "benchmark.name"),
        method=UNNAMED_METHOD,
        target=lookup(config, "target.path"),
        block_size=decoding.get("block_size") or trained_block,
        drafter_block_size=trained_block,
        temperature=decoding.get("temperature"),
    )
