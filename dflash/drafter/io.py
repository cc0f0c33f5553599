"""Save and load drafters as HF-style directories (config.json + model.safetensors).

The layout is the one public DFlash drafters use, so engines that serve DFlash
drafters can read ours: config.json is the target family's config plus
`architectures: ["DFlashDraftModel"]`, `block_size`, `num_target_layers` and
`dflash_config: {target_layer_ids, mask_token_id}`; weights are named
`layers.{i}.self_attn.{q,k,v,o}_proj`, `...{q,k}_norm`, `layers.{i}.mlp.*`, `fc`,
`hidden_norm`, `norm`. No embedding and no LM head: those are the target's.
"""

from __future__ import annotations

import json
import os

import torch
from safetensors.torch import load_file, save_file

from dflash.drafter.config import DrafterConfig
from dflash.drafter.model import DFlashDrafter
from dflash.errors import ConfigError
from dflash.fileio import atomic_write

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"


def save_drafter(drafter: DFlashDrafter, directory: str, dtype: torch.dtype | None = None) -> None:
    """Write `config.json` and `model.safetensors` into `directory` (created if needed).

    Files are written to temporary names and renamed, so a killed job never leaves a
    half-written drafter behind.
    """
    os.makedirs(directory, exist_ok=True)
    state = {name: tensor.detach().to(dtype or tensor.dtype).contiguous().cpu() for name, tensor in drafter.state_dict().items()}
    config = drafter.config.to_hf_dict()
    config["dtype"] = str(dtype or next(drafter.parameters()).dtype).removeprefix("torch.")
    _atomic_write(directory, WEIGHTS_NAME, lambda path: save_file(state, path, metadata={"format": "pt"}))
    _atomic_write(directory, CONFIG_NAME, lambda path: _write_json(path, config))


def load_drafter_config(directory: str, attn_implementation: str = "sdpa") -> DrafterConfig:
    """Read a drafter directory's config.json."""
    path = os.path.join(directory, CONFIG_NAME)
    if not os.path.isfile(path):
        raise ConfigError("drafter.path", f"{directory!r} has no {CONFIG_NAME}; is it a drafter directory?")
    with open(path) as f:
        return DrafterConfig.from_hf_dict(json.load(f), attn_implementation=attn_implementation)


def load_drafter(
    directory: str,
    device: str | torch.device = "cpu",
    dtype: torch.dtype | None = None,
    attn_implementation: str = "sdpa",
) -> DFlashDrafter:
    """Load a drafter directory written by `save_drafter` (or a public DFlash drafter)."""
    if not os.path.isdir(directory):
        raise ConfigError("drafter.path", f"directory {directory!r} does not exist")
    config = load_drafter_config(directory, attn_implementation)
    weights = os.path.join(directory, WEIGHTS_NAME)
    if not os.path.isfile(weights):
        raise ConfigError("drafter.path", f"{directory!r} has no {WEIGHTS_NAME}")
    drafter = DFlashDrafter(config)
    state = load_file(weights)
    missing, unexpected = drafter.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ConfigError(
            "drafter.path",
            f"weights do not match the config: missing {sorted(missing)[:4]}, unexpected {sorted(unexpected)[:4]}",
        )
    return drafter.to(device=device, dtype=dtype or next(iter(state.values())).dtype).eval()


def _write_json(path: str, data: dict) -> None:
    with open(path, "w") as f:
        json.dump(data, f, indent=2, sort_keys=True)
        f.write("\n")


def _atomic_write(directory: str, name: str, write) -> None:
    atomic_write(os.path.join(directory, name), write)
