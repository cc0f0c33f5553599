"""Write a trained drafter as a drafter directory (`dflash.drafter.save_drafter` format),
from a live training module or from a Lightning checkpoint without loading the target."""

from __future__ import annotations

import os
import pickle
import warnings

import torch

from dflash.drafter import DFlashDrafter, DrafterConfig, save_drafter
from dflash.errors import ConfigError, reading
from dflash.layout import DRAFT_VOCAB_KEY, DRAFTER_CONFIG_KEY

_DRAFTER_PREFIX = "drafter."


def export_drafter(module, out_dir: str, dtype: torch.dtype | None = None) -> str:
    """Save `module.drafter` (a DFlash drafter of a `DrafterTrainingModule`) into `out_dir`
    (config.json + model.safetensors) with weights in `dtype` (default: the training dtype); returns out_dir."""
    save_drafter(module.drafter, out_dir, dtype=dtype)
    return out_dir


def read_checkpoint(ckpt_path: str) -> dict:
    """A training checkpoint (`DrafterTrainingModule`, any method) as a dict, on the CPU;
    ConfigError naming `ckpt` for a missing, damaged or foreign file."""
    if not os.path.isfile(ckpt_path):
        raise ConfigError("ckpt", f"no checkpoint file at {ckpt_path!r}")
    fix = "give a checkpoints/*.ckpt file that python -m dflash.train wrote"
    damaged = (OSError, EOFError, RuntimeError, pickle.UnpicklingError)  # what torch.load raises on them
    with reading("ckpt", ckpt_path, fix, errors=damaged), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a damaged file also warns about its pickle protocol: one line is enough
        checkpoint = torch.load(ckpt_path, map_location="cpu", weights_only=True)
    if not isinstance(checkpoint, dict) or DRAFTER_CONFIG_KEY not in checkpoint:
        raise ConfigError("ckpt", f"{ckpt_path!r} is not a dflash training checkpoint (no drafter config); {fix}")
    return checkpoint


def drafter_state(checkpoint: dict) -> dict:
    """The drafter's weights of a training checkpoint, without the `drafter.` prefix."""
    return {
        name.removeprefix(_DRAFTER_PREFIX): tensor
        for name, tensor in checkpoint["state_dict"].items()
        if name.startswith(_DRAFTER_PREFIX)
    }


def drafter_from_checkpoint(ckpt_path: str) -> DFlashDrafter:
    """Rebuild the DFlash drafter stored in a training checkpoint file (CPU, eval mode)."""
    return drafter_from_state(read_checkpoint(ckpt_path))


def drafter_from_state(checkpoint: dict) -> DFlashDrafter:
    """Rebuild the DFlash drafter of a loaded training checkpoint (`read_checkpoint`)."""
    config = DrafterConfig.from_hf_dict(checkpoint[DRAFTER_CONFIG_KEY])
    state = drafter_state(checkpoint)
    drafter = DFlashDrafter(config)
    drafter.load_state_dict(state, strict=True)
    drafter.draft_vocab = checkpoint.get(DRAFT_VOCAB_KEY)
    return drafter.to(next(iter(state.values())).dtype).eval()


def export_state(checkpoint: dict, out_dir: str, dtype: torch.dtype | None = None) -> str:
    """Write the DFlash drafter of a loaded training checkpoint into `out_dir`; returns out_dir."""
    save_drafter(drafter_from_state(checkpoint), out_dir, dtype=dtype)
    return out_dir
