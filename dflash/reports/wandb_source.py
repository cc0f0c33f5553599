"""Run records from Weights & Biases (the `wandb` source of `python -m dflash.tables`).

A training run logs its resolved config (with the `sweep` node) as the wandb run config,
per-position accuracies as `val/acc_01`.. and `train/acc_01`.., and after its evaluation
(dflash.training.after_train.log_evaluation) uploads results.json as a run file and logs
its headline figures as `eval/...`. The uploaded results.json gives the full results; a run
without it (not synced yet) gives tau and speedups from the summary (`_results_from_summary`),
the other fields from the config, and no histogram.

Only `wandb.Api()`-shaped objects are used: `api.runs(path, filters=...)` yielding runs
with `.config`, `.summary`, `.state`, `.path`, `.created_at`, and `.files()` / `.file(name)`
for uploads.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import replace

from dflash.layout import RESULTS_FILE, Results
from dflash.reports.collect import ACCURACY_PREFIXES, accuracies_from_metrics
from dflash.reports.records import FAILED, FINISHED, PENDING, RunRecord, results_from_config

FAILED_STATES = ("failed", "crashed", "killed")


def collect_wandb_runs(api, project: str, entity: str | None = None, groups: list[str] | tuple = ()) -> list[RunRecord]:
    """A `RunRecord` per run of `entity/project` (only the given groups, i.e. sweep names, if any)."""
    path = f"{entity}/{project}" if entity else project
    filters = {"group": {"$in": list(groups)}} if groups else None
    return [record_from_wandb_run(run) for run in api.runs(path, filters=filters)]


def record_from_wandb_run(run) -> RunRecord:
    """The record of one wandb run (see the module docstring for what is read)."""
    config = _plain(dict(run.config))
    # wandb's summary object is dict-like; its `_json_dict` is the plain content.
    summary = _plain(dict(getattr(run.summary, "_json_dict", run.summary).items()))
    results = _uploaded_results(run) or _results_from_summary(config, summary, run)
    source = "/".join(str(part) for part in run.path) if isinstance(run.path, (list, tuple)) else str(run.path)
    if results.tau is not None:
        status, error = FINISHED, None
    elif run.state in FAILED_STATES:
        status, error = FAILED, f"wandb run {run.state}"
    else:
        status, error = PENDING, None
    accuracies = {p: accuracies_from_metrics(summary, p) for p in ACCURACY_PREFIXES}
    return RunRecord(f"wandb:{source}", status, config, results, error, {p: v for p, v in accuracies.items() if v})


def _results_from_summary(config: dict, summary: dict, run) -> Results:
    return replace(
        results_from_config(config),
        tau=summary.get("eval/tau"),
        tau_per_prompt_mean=summary.get("eval/tau_per_prompt_mean"),
        speedup={
            "vs_autoregressive": summary.get("eval/speedup_vs_autoregressive"),
            "vs_hf_generate": summary.get("eval/speedup_vs_hf_generate"),
        },
        speedup_decode_only={"vs_autoregressive": summary.get("eval/speedup_decode_only_vs_autoregressive")},
        timestamp=str(getattr(run, "created_at", "") or ""),
    )


def _uploaded_results(run) -> Results | None:
    """results.json saved to the run (wandb.save), or None when the run has no such file."""
    if RESULTS_FILE not in {f.name for f in run.files()}:
        return None
    with tempfile.TemporaryDirectory() as tmp:
        run.file(RESULTS_FILE).download(root=tmp, replace=True)
        return Results.read(os.path.join(tmp, RESULTS_FILE))


def _plain(value):
    """wandb config values may arrive as {"value": x, "desc": ...} wrappers or nested proxies."""
    if isinstance(value, dict):
        if set(value) <= {"value", "desc"} and "value" in value:
            return _plain(value["value"])
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value
