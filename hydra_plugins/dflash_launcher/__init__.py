"""dflash's Hydra launchers (found by Hydra's plugin scan of the `hydra_plugins` namespace).

- `gpu_pool.GpuPoolLauncher` (`hydra/launcher=gpu_pool`): local jobs, one per free GPU.
- `slurm.ResumableSlurmLauncher` (`hydra/launcher=slurm`): submitit's SLURM launcher that
  skips finished grid points and leaves error.json for failed ones (needs the `slurm` extra).
"""

from dflash.sweep.dirnames import register_resolver

# Hydra imports every `hydra_plugins` module at start-up, in every app and mode, so the
# sweeps' directory-name resolver is registered before any sweep config is resolved.
register_resolver()
