"""Ablation sweeps: a pool of GPU slots for concurrent jobs, the per-job subprocess with
its error record, and the `python -m dflash.sweep NAME` driver (prepare, stages).

The Hydra launcher that uses them lives in `hydra_plugins/dflash_launcher` (Hydra only
finds launchers in the `hydra_plugins` namespace); the grids live in `dflash/conf/sweep/`.
"""

from dflash.sweep.jobs import ERROR_FILE, RESULTS_FILE, JobOutcome, JobRunner, SweepJob, error_record, is_finished
from dflash.sweep.pool import Slot, detect_gpus, device_slots, parse_gpu_ids, run_in_slots

__all__ = [
    "ERROR_FILE",
    "RESULTS_FILE",
    "JobOutcome",
    "JobRunner",
    "Slot",
    "SweepJob",
    "detect_gpus",
    "device_slots",
    "error_record",
    "is_finished",
    "parse_gpu_ids",
    "run_in_slots",
]
