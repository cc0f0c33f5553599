"""EAGLE-3 drafter directories: config.json + model.safetensors in the layout SGLang and
vLLM load (`LlamaForCausalLMEagle3`; weights `fc.weight`, `midlayer.*`, `norm.weight`,
`lm_head.weight`, `d2t` int64, `t2d` bool; no `embed_tokens`: the engines share the
target's). Keys are documented in docs/eagle3.md."""

from __future__ import annotations

import json
import os

import torch

from dflash.eagle3.config import Eagle3Config
from dflash.eagle3.model import Eagle3Drafter
from dflash.errors import ConfigError, reading, require
from dflash.fileio import atomic_write, write_json
from dflash.layout import DRAFTER_CONFIG, DRAFTER_WEIGHTS

_INDEX_BUFFERS = ("d2t", "t2d")  # never cast to the weight dtype


def eagle3_state_dict(drafter: Eagle3Drafter, dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """The checkpoint tensors by their EAGLE-3 names; float weights cast to `dtype`."""
    state = {}
    for name, tensor in drafter.state_dict().items():
        if dtype is not None and name not in _INDEX_BUFFERS:
            tensor = tensor.to(dtype)
        state[name] = tensor.detach().contiguous().cpu()
    return state


def save_eagle3(drafter: Eagle3Drafter, out_dir: str, dtype: torch.dtype | None = None) -> str:
    """Write `drafter` into `out_dir`; returns out_dir."""
    from safetensors.torch import save_file

    os.makedirs(out_dir, exist_ok=True)
    state = eagle3_state_dict(drafter, dtype)
    config = drafter.config.to_hf_dict()
    config["torch_dtype"] = str(state["fc.weight"].dtype).removeprefix("torch.")
    # atomic, and readable by others (safetensors alone writes 0600)
    atomic_write(os.path.join(out_dir, DRAFTER_WEIGHTS), lambda path: save_file(state, path, metadata={"format": "pt"}))
    write_json(os.path.join(out_dir, DRAFTER_CONFIG), config, indent=2)
    return out_dir


_FIX = "give a directory that python -m dflash.train method=eagle3 exported"


def read_eagle3_config(path: str) -> Eagle3Config:
    """The config of the EAGLE-3 directory at `path`; one ConfigError line (key eagle3.path)
    for a missing, damaged or foreign one. Cheap: entry points call it before the target loads."""
    config_path = os.path.join(path, DRAFTER_CONFIG)
    require(os.path.isfile(config_path), "path", f"{path!r} holds no {DRAFTER_CONFIG}; {_FIX}")
    with reading("path", config_path, _FIX, errors=(OSError, ValueError)):
        with open(config_path) as f:
            raw = json.load(f)
    return Eagle3Config.from_hf_dict(raw)  # its own one-line errors, not wrapped again


def load_eagle3(path: str, device: str | torch.device = "cpu", dtype: torch.dtype | None = None) -> Eagle3Drafter:
    """Read a directory written by `save_eagle3` (eval mode)."""
    from safetensors.torch import load_file

    config = read_eagle3_config(path)
    with reading("path", path, _FIX, errors=(OSError, ValueError)):
        state = load_file(os.path.join(path, DRAFTER_WEIGHTS))
    drafter = Eagle3Drafter(config)
    expected = set(drafter.state_dict())
    require(
        set(state) == expected,
        "path",
        f"{path!r} has weights {sorted(set(state) ^ expected)[:4]} that do not fit its config.json",
    )
    try:
        drafter.load_state_dict(state, strict=True)
    except RuntimeError as err:
        raise ConfigError(
            "path", f"{path!r} has weights that do not fit its config.json ({str(err).splitlines()[-1].strip()})"
        ) from None
    drafter = drafter.to(device)
    if dtype is not None:
        drafter = drafter.to(dtype)
    return drafter.eval()


def eagle3_from_checkpoint(checkpoint: dict) -> Eagle3Drafter:
    """The drafter of a loaded EAGLE-3 training checkpoint (CPU, eval mode)."""
    from dflash.layout import DRAFTER_CONFIG_KEY
    from dflash.training.export import drafter_state

    drafter = Eagle3Drafter(Eagle3Config.from_hf_dict(checkpoint[DRAFTER_CONFIG_KEY]))
    drafter.load_state_dict(drafter_state(checkpoint), strict=True)
    return drafter.eval()


def export_eagle3_checkpoint(checkpoint: dict, out_dir: str, dtype: torch.dtype | None = None) -> str:
    """Write the drafter of a loaded EAGLE-3 training checkpoint as an EAGLE-3 directory; returns out_dir."""
    save_eagle3(eagle3_from_checkpoint(checkpoint), out_dir, dtype=dtype)
    return out_dir
