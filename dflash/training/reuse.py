"""Reusing a finished sweep job whose training is identical (`sweep.reuse`).

Ablation sweeps share their baseline cell. A sweep job first looks under the
sweeps root for a finished job whose config equals its own, bookkeeping aside (IGNORED_KEYS);
if one exists, it copies that job's drafter, metrics and results instead of training (hard
links where the file system allows), rewrites the copied results' `config` to its own, and
records the source in `reused_from.json`. A copied cell's figures are the finished job's
measurements, timings included (`cpu_threads` is not compared: a scale gives all its jobs the same).

Invariants: a job is reused only when it finished (its results.json exists, so training,
export and the after-train evaluation all ended); every key that can change the drafter
or its evaluation is part of the fingerprint (only the keys below are not); a job never
reuses itself.

Files: `<job>/cell.json` {fingerprint, config (the compared part)}, written when a job
starts; `<job>/reused_from.json` {job, fingerprint} in a job that reused another.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import logging
import os
import shutil

from dflash.fileio import json_digest, read_json, write_json
from dflash.layout import CELL_FILE, CSV_DIR, DRAFTER_DIR, RESULTS_FILE, REUSED_FILE, Results

log = logging.getLogger(__name__)

# Top-level or dotted keys that name, place or log a job without changing what it trains
# or how it is evaluated.
IGNORED_KEYS = ("sweep", "logger", "run_name", "paths", "cpu_threads", "checkpoint.resume", "trainer.enable_progress_bar")
# What a reusing job copies from the finished one besides its results (the checkpoints stay behind).
COPIED_DIRS = (DRAFTER_DIR, CSV_DIR)


def cell_config(config: dict) -> dict:
    """`config` (a resolved train config) without IGNORED_KEYS."""
    pruned = json.loads(json.dumps(config, default=str))
    for key in IGNORED_KEYS:
        *parents, leaf = key.split(".")
        node = pruned
        for part in parents:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node.pop(leaf, None)
    return pruned


def fingerprint(config: dict) -> str:
    """A hash of `cell_config(config)`: equal for jobs that train and evaluate the same."""
    return json_digest(cell_config(config), 20, default=str)


def mark_cell(output_dir: str, config: dict) -> str:
    """Write `<output_dir>/cell.json`; returns the fingerprint."""
    digest = fingerprint(config)
    os.makedirs(output_dir, exist_ok=True)
    write_json(os.path.join(output_dir, CELL_FILE), {"fingerprint": digest, "config": cell_config(config)}, indent=1)
    return digest


def finished_twin(root: str, output_dir: str, digest: str) -> str | None:
    """A finished job directory under `root` (`root/<sweep>/<job>`) with fingerprint
    `digest`, other than `output_dir`; None when there is none."""
    mine = os.path.realpath(output_dir)
    for cell in sorted(glob.glob(os.path.join(root, "*", "*", CELL_FILE))):
        job = os.path.dirname(cell)
        if os.path.realpath(job) == mine or not os.path.isfile(os.path.join(job, RESULTS_FILE)):
            continue
        if os.path.isfile(os.path.join(job, REUSED_FILE)):
            continue  # a copy: reuse the job that trained
        if (read_json(cell) or {}).get("fingerprint") == digest:  # a cell file being written or broken: not a twin
            return job
    return None


def reuse_finished_cell(root: str, output_dir: str, config: dict) -> str | None:
    """If a finished job under `root` trained what `config` trains, copy its outputs into
    `output_dir` and return its directory; else mark this job's cell and return None.

    A job that already has results (a re-run) is left as it is and returns None.
    """
    digest = mark_cell(output_dir, config)
    if os.path.isfile(os.path.join(output_dir, RESULTS_FILE)):
        return None
    twin = finished_twin(root, output_dir, digest)
    if twin is None:
        return None
    for name in COPIED_DIRS:
        source, dest = os.path.join(twin, name), os.path.join(output_dir, name)
        if os.path.isdir(source):
            shutil.rmtree(dest, ignore_errors=True)
            shutil.copytree(source, dest, copy_function=_link_or_copy)
    results = dataclasses.replace(Results.read(os.path.join(twin, RESULTS_FILE)), config=config)
    write_json(os.path.join(output_dir, REUSED_FILE), {"job": twin, "fingerprint": digest}, indent=1)
    results.write(os.path.join(output_dir, RESULTS_FILE))  # last: the job counts as finished now
    log.info("reused the finished job %s: same training and evaluation config (%s)", twin, digest)
    return twin


def _link_or_copy(source: str, dest: str) -> str:
    try:
        os.link(source, dest)
        return dest
    except OSError:
        return shutil.copy2(source, dest)
