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
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file

from dflash.drafter.config import DrafterConfig
from dflash.drafter.model import DFlashDrafter
from dflash.errors import reading, require
from dflash.fileio import atomic_write

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
_FIX = "point drafter.path at a directory that save_drafter or python -m dflash.export wrote"


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
    """Read a drafter directory's config.json; ConfigError (drafter.path) when it is missing or damaged."""
    require(os.path.isdir(directory), "drafter.path", f"directory {directory!r} does not exist")
    path = os.path.join(directory, CONFIG_NAME)
    require(os.path.isfile(path), "drafter.path", f"{directory!r} has no {CONFIG_NAME}; is it a drafter directory?")
    with reading("drafter.path", path, _FIX):
        with open(path) as f:
            data = json.load(f)
    require(isinstance(data, dict), "drafter.path", f"{path!r} is not a drafter config (no JSON object); {_FIX}")
    return DrafterConfig.from_hf_dict(data, attn_implementation=attn_implementation)


def check_drafter_dir(directory: str, attn_implementation: str = "sdpa") -> DrafterConfig:
    """The config of the drafter directory, after checking that its weights file is readable
    and holds exactly the tensors, of the shapes, that the config needs. Reads only the
    weights' header (cheap: meant for checking inputs before any model loads)."""
    config = load_drafter_config(directory, attn_implementation)
    path = os.path.join(directory, WEIGHTS_NAME)
    require(os.path.isfile(path), "drafter.path", f"{directory!r} has no {WEIGHTS_NAME}")
    with reading("drafter.path", path, _FIX, errors=(OSError, SafetensorError)):
        with safe_open(path, "pt") as f:
            shapes = {name: tuple(f.get_slice(name).get_shape()) for name in f.keys()}
    with torch.device("meta"):
        needed = {name: tuple(tensor.shape) for name, tensor in DFlashDrafter(config).state_dict().items()}
    common = sorted(needed.keys() & shapes.keys())
    problems = [f"{name} is {shapes[name]}, not {needed[name]}" for name in common if shapes[name] != needed[name]][:2]
    if needed.keys() - shapes.keys():
        problems.append(f"missing {sorted(needed.keys() - shapes.keys())[:3]}")
    if shapes.keys() - needed.keys():
        problems.append(f"unexpected {sorted(shapes.keys() - needed.keys())[:3]}")
    mismatch = f"{WEIGHTS_NAME} does not match {CONFIG_NAME} in {directory!r}: {'; '.join(problems)}; {_FIX}"
    require(not problems, "drafter.path", mismatch)
    return config


def load_drafter(
    directory: str,
    device: str | torch.device = "cpu",
    dtype: torch.dtype | None = None,
    attn_implementation: str = "sdpa",
) -> DFlashDrafter:
    """Load a drafter directory written by `save_drafter` (or a public DFlash drafter)."""
    drafter = DFlashDrafter(check_drafter_dir(directory, attn_implementation))
    path = os.path.join(directory, WEIGHTS_NAME)
    with reading("drafter.path", path, _FIX, errors=(OSError, SafetensorError)):
        state = load_file(path)
    drafter.load_state_dict(state, strict=True)
    return drafter.to(device=device, dtype=dtype or next(iter(state.values())).dtype).eval()


def _write_json(path: str, data: dict) -> None:
    with open(path, "w") as f:
        json.dump(data, f, indent=2, sort_keys=True)
        f.write("\n")


def _atomic_write(directory: str, name: str, write) -> None:
    atomic_write(os.path.join(directory, name), write)
