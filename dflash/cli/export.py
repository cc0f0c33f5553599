"""`python -m dflash.export ckpt=... out=...`: write the drafter of a training checkpoint
as a drafter directory (config: dflash/conf/export.yaml). The target is not loaded."""

from __future__ import annotations

import os

import hydra
from omegaconf import DictConfig

from dflash.cli.common import CONF_DIR, exits_on_config_error, resolved_config, run_app
from dflash.errors import require


def checkpoint_path(ckpt: str) -> str:
    """`ckpt` itself when it is a file; `<ckpt>/checkpoints/last.ckpt` for a run directory."""
    from dflash.training.run import CHECKPOINT_DIR, LAST_CHECKPOINT

    path = os.path.abspath(os.path.expanduser(ckpt))
    if os.path.isdir(path):
        path = os.path.join(path, CHECKPOINT_DIR, LAST_CHECKPOINT)
    require(os.path.isfile(path), "ckpt", f"no checkpoint at {path!r}")
    return path


@hydra.main(config_path=str(CONF_DIR), config_name="export", version_base="1.3")
@exits_on_config_error
def _hydra_main(cfg: DictConfig) -> None:
    from dflash.training.export import export_checkpoint
    from dflash.training.run import weight_dtype

    options = resolved_config(cfg)
    require(isinstance(options["out"], str) and options["out"] != "", "out", "must be a directory path")
    path = checkpoint_path(str(options["ckpt"]))
    dtype = weight_dtype(options["dtype"], "dtype")
    out = export_checkpoint(path, os.path.abspath(os.path.expanduser(options["out"])), dtype=dtype)
    print(f"drafter: {out}")


def main() -> None:
    run_app(_hydra_main, "export", output_dirs=("out",))
