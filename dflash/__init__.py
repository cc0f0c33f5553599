"""dflash: train and evaluate DFlash block-diffusion drafters for speculative decoding."""

from pathlib import Path

__version__ = "0.1.0"

#: The Hydra configs, shipped inside the package (groups, experiment/, sweep/).
CONF_DIR = Path(__file__).resolve().parent / "conf"
