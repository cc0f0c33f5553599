"""Run records from result directories (the `dirs` source of `python -m dflash.tables`).

A run directory is any directory under the root that holds `results.json` (finished),
`error.json` (failed: written by the sweep launchers) or `.hydra/config.yaml` (started,
no result yet). Training metrics come from the CSV logger's `csv/version_*/metrics.csv`
when present.
"""

from __future__ import annotations

import csv
import glob
import logging
import os

import yaml

from dflash.fileio import read_json
from dflash.layout import CSV_DIR, ERROR_FILE, HYDRA_CONFIG, METRICS_CSV, RESULTS_FILE, Results
from dflash.reports.records import FAILED, FINISHED, PENDING, RunRecord, results_from_config

log = logging.getLogger(__name__)

ACCURACY_PREFIXES = ("val", "train")


def run_directories(root: str) -> list[str]:
    """Every run directory under `root` (the root itself included), sorted."""
    found = set()
    for marker in (RESULTS_FILE, ERROR_FILE, HYDRA_CONFIG):
        for path in glob.glob(os.path.join(glob.escape(root), "**", marker), recursive=True):
            run_dir = os.path.dirname(path)
            found.add(os.path.dirname(run_dir) if marker == HYDRA_CONFIG else run_dir)
    return sorted(found)


def collect_runs(root: str) -> list[RunRecord]:
    """A `RunRecord` for every run directory under `root`; unreadable files are skipped with a warning."""
    records = []
    for run_dir in run_directories(root):
        try:
            records.append(read_run(run_dir))
        except (OSError, ValueError, yaml.YAMLError) as err:
            log.warning("skipping %s: %s", run_dir, err)
    return records


def read_run(run_dir: str) -> RunRecord:
    """The record of one run directory."""
    results_path = os.path.join(run_dir, RESULTS_FILE)
    error_path = os.path.join(run_dir, ERROR_FILE)
    config = _read_hydra_config(run_dir)
    if os.path.isfile(results_path):
        results = Results.read(results_path)
        config = results.config or config
        status, error = FINISHED, None
    else:
        results = results_from_config(config)
        status, error = PENDING, None
        if os.path.isfile(error_path):
            error = (read_json(error_path) or {}).get("exception") or "failed"
            status = FAILED
    return RunRecord(run_dir, status, config, results, error, read_accuracies(run_dir))


def read_accuracies(run_dir: str) -> dict[str, list[float]]:
    """Last logged per-position accuracies {"val": [...], "train": [...]} from metrics.csv files.

    Versions are read in order (a resumed run logs into a new version), so the last
    value wins; {} when the run logged no CSV metrics.
    """
    paths = sorted(glob.glob(os.path.join(glob.escape(run_dir), CSV_DIR, "version_*", METRICS_CSV)), key=_version_number)
    latest: dict[str, list[float]] = {}
    for path in paths:
        with open(path, newline="") as f:
            for row in csv.DictReader(f):
                for prefix in ACCURACY_PREFIXES:
                    values = accuracies_from_metrics(row, prefix)
                    if values:
                        latest[prefix] = values
    return latest


def accuracies_from_metrics(metrics: dict, prefix: str) -> list[float]:
    """[acc_1, acc_2, ...] from keys `<prefix>/acc_01`, ... of one metrics row ([] if absent)."""
    values = []
    for k in range(1, 1000):
        value = metrics.get(f"{prefix}/acc_{k:02d}")
        if value in (None, ""):
            break
        values.append(float(value))
    return values


def _read_hydra_config(run_dir: str) -> dict:
    path = os.path.join(run_dir, HYDRA_CONFIG)
    if not os.path.isfile(path):
        return {}
    with open(path) as f:
        return yaml.safe_load(f) or {}


def _version_number(path: str) -> int:
    name = os.path.basename(os.path.dirname(path))
    suffix = name.removeprefix("version_")
    return int(suffix) if suffix.isdigit() else -1
