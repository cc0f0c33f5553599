"""`python -m dflash.export ckpt=... out=...`: write the drafter of a training checkpoint
as its method's drafter directory (config: dflash/conf/export.yaml). The method is the
trained method of `dflash.methods` whose architectures the checkpoint's drafter config
names (DFlash: a drafter directory; EAGLE-3: the EAGLE-3 layout), with its model card
(README.md, `dflash.training.model_card`). The target is not loaded."""

from __future__ import annotations

import os

import hydra
from omegaconf import DictConfig

from dflash.cli.common import CONF_DIR, app_config, exits_on_config_error, run_app
from dflash.errors import require


def checkpoint_path(ckpt: str) -> str:
    """`ckpt` itself when it is a file; `<ckpt>/checkpoints/last.ckpt` for a run directory."""
    from dflash.layout import CHECKPOINT_DIR, LAST_CHECKPOINT

    path = os.path.abspath(os.path.expanduser(ckpt))
    if os.path.isdir(path):
        path = os.path.join(path, CHECKPOINT_DIR, LAST_CHECKPOINT)
    require(os.path.isfile(path), "ckpt", f"no checkpoint at {path!r}")
    return path


@hydra.main(config_path=str(CONF_DIR), config_name="export", version_base="1.3")
@exits_on_config_error
def _hydra_main(cfg: DictConfig) -> None:
    from dflash.layout import DRAFTER_CONFIG_KEY
    from dflash.methods import method_of_checkpoint, trained_methods
    from dflash.training.export import read_checkpoint
    from dflash.training.model_card import run_files, write_model_card
    from dflash.training.settings import weight_dtype

    options = app_config(cfg)  # dflash.schema.ExportAppConfig
    path = checkpoint_path(options.ckpt)
    dtype = weight_dtype(options.dtype, "dtype")  # checked already: a torch dtype now
    checkpoint = read_checkpoint(path)  # read once: a large drafter's checkpoint takes a while
    drafter_config = checkpoint[DRAFTER_CONFIG_KEY]
    method = method_of_checkpoint(drafter_config)
    require(
        method is not None,
        "ckpt",
        f"{path!r} holds a drafter of architectures {drafter_config.get('architectures')}, which no trained method "
        f"({', '.join(sorted(trained_methods()))}) exports",
    )
    out = method.export(checkpoint, os.path.abspath(os.path.expanduser(options.out)), dtype)
    # the card reads the run's config and evaluation when the checkpoint sits in its run directory
    write_model_card(out, *run_files(os.path.dirname(os.path.dirname(path))))
    print(f"drafter: {out}")


def main() -> None:
    run_app(_hydra_main, "export", output_dirs=("out",), check=lambda options: checkpoint_path(options.ckpt))
