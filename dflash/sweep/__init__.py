"""Ablation sweeps: a pool of GPU slots for concurrent jobs, the per-job subprocess with
its error record, and the `python -m dflash.sweep NAME` driver (prepare, stages).

The Hydra launcher that uses them lives in `hydra_plugins/dflash_launcher`; the grids in
`dflash/conf/sweep/`.
"""
